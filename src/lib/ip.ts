// IP addresses and CIDRs as Kubernetes reads them (Go's net.ParseIP, stricter), and their canonical
// text. Pure: no I/O. Imports nothing of the project.
import { isIP, SocketAddress } from 'node:net';

export type IPFamily = 'IPv4' | 'IPv6';

/** True when `ip` is an IPv4 or IPv6 address as Go's net.ParseIP reads it, stricter: no leading zeros in
 * IPv4 octets, no zone (`%eth0`), no IPv4-mapped IPv6 (`::ffff:1.2.3.4`, whose family is ambiguous). */
export function isValidIP(ip: string): boolean {
  return ipFamilyOf(ip) !== undefined;
}

/** The family of a valid IP (see isValidIP), undefined when it is not one. */
export function ipFamilyOf(ip: string): IPFamily | undefined {
  const v = isIP(ip);
  if (v === 4) return IPV4_STRICT.test(ip) ? 'IPv4' : undefined;
  if (v === 6) return ip.includes('%') || isIPv4Mapped(canonicalIP(ip)) ? undefined : 'IPv6';
  return undefined;
}

// inet_ntop writes every IPv4-mapped address (also `::ffff:102:304`) as `::ffff:a.b.c.d`.
function isIPv4Mapped(canonical: string): boolean {
  return canonical.startsWith('::ffff:') && canonical.includes('.');
}

// Each octet 0-255 with no leading zero (Go rejects "010.0.0.1" since 1.17; it would be octal elsewhere).
const IPV4_STRICT = /^(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)$/;

/** 127.0.0.0/8 or ::1, in canonical text (as sockets and validated objects give them). */
export function isLoopbackIP(ip: string): boolean {
  return ip.startsWith('127.') || ip === '::1';
}

/** The canonical text of a valid IP: IPv6 lower-cased and compressed (RFC 5952), IPv4 unchanged. */
export function canonicalIP(ip: string): string {
  return ip.includes(':') ? new SocketAddress({ address: ip, family: 'ipv6' }).address : ip;
}

/** True for `ip/prefix` with a valid IP (isValidIP) and a decimal prefix within its family's width. */
export function isValidCIDR(cidr: string): boolean {
  const slash = cidr.indexOf('/');
  if (slash < 0) return false;
  const family = ipFamilyOf(cidr.slice(0, slash));
  const prefix = cidr.slice(slash + 1);
  if (family === undefined || !/^(?:0|[1-9]\d{0,2})$/.test(prefix)) return false;
  return Number(prefix) <= (family === 'IPv4' ? 32 : 128);
}

/** A valid CIDR with its host bits cleared and the address in canonical form (Go's IPNet.String()). */
export function maskCIDR(cidr: string): string {
  const [ip = '', prefixText = ''] = cidr.split('/');
  const prefix = Number(prefixText);
  if (!ip.includes(':')) {
    const value = ip.split('.').reduce((acc, octet) => acc * 256 + Number(octet), 0);
    const size = 2 ** (32 - prefix);
    const network = Math.floor(value / size) * size;
    const octets = [24, 16, 8, 0].map((shift) => Math.floor(network / 2 ** shift) % 256);
    return `${octets.join('.')}/${prefix}`;
  }
  let value = 0n;
  for (const word of ipv6Words(ip)) value = (value << 16n) | BigInt(word);
  const hostBits = BigInt(128 - prefix);
  value = (value >> hostBits) << hostBits;
  const words: string[] = [];
  for (let i = 7; i >= 0; i--) words.push(((value >> BigInt(i * 16)) & 0xffffn).toString(16));
  return `${new SocketAddress({ address: words.join(':'), family: 'ipv6' }).address}/${prefix}`;
}

/** The eight 16-bit words of a valid IPv6 address (with `::` and a trailing dotted IPv4 part). */
export function ipv6Words(ip: string): number[] {
  let text = ip;
  const dotted = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(text);
  if (dotted) {
    const [a, b, c, d] = dotted.slice(1).map(Number) as [number, number, number, number];
    text = `${text.slice(0, dotted.index)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const [head = '', tail] = text.split('::');
  const parse = (part: string) => (part === '' ? [] : part.split(':').map((w) => Number.parseInt(w, 16)));
  const left = parse(head);
  const right = tail === undefined ? [] : parse(tail);
  return [...left, ...new Array<number>(8 - left.length - right.length).fill(0), ...right];
}
