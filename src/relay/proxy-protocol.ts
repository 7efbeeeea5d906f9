// The PROXY protocol header (HAProxy's proxy-protocol.txt, versions 1 and 2) a TCP relay sends an
// endpoint before any byte of the client's: who the client was and which address it connected to.
// Pure: no I/O. Addresses as the relays normalise them (`::ffff:a.b.c.d` already cut to `a.b.c.d`).
import { ipv6Words } from '../lib/ip.ts';

/** The versions a Service may ask for (kube-userspace-proxy.io/proxy-protocol). */
export type ProxyProtocolVersion = 'v1' | 'v2';

/** The twelve bytes that open every version 2 header (§2.2). */
export const V2_SIGNATURE = Buffer.from([
  0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d, 0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a,
]);

/** Version 2, command PROXY (the connection was relayed on behalf of another node). */
const V2_PROXY = 0x21;
/** Address family and transport: TCP over IPv4, TCP over IPv6, and unknown (AF_UNSPEC). */
const V2_TCP4 = 0x11;
const V2_TCP6 = 0x21;
const V2_UNSPEC = 0x00;

/** `PROXY UNKNOWN\r\n`: the addresses cannot be told (§2.1); the receiver uses the connection's own. */
const V1_UNKNOWN = Buffer.from('PROXY UNKNOWN\r\n', 'latin1');

/**
 * The header for a connection from `src`:`srcPort` to `dst`:`dstPort`. Both addresses must be of one
 * family (NAT never changes it); when they are not, or one is not an address, the header says
 * UNKNOWN (v1) or AF_UNSPEC (v2), as the specification asks of a sender that cannot tell.
 */
export function proxyProtocolHeader(
  version: ProxyProtocolVersion,
  src: string,
  srcPort: number,
  dst: string,
  dstPort: number,
): Buffer {
  const family = commonFamily(src, dst);
  if (version === 'v1') {
    if (family === 0) return V1_UNKNOWN;
    // At most 107 bytes (§2.1): `PROXY TCP6` + two 39-character addresses + two ports + separators.
    return Buffer.from(`PROXY TCP${family} ${src} ${dst} ${srcPort} ${dstPort}\r\n`, 'latin1');
  }
  if (family === 0) {
    const header = Buffer.allocUnsafe(16);
    V2_SIGNATURE.copy(header, 0);
    header[12] = V2_PROXY;
    header[13] = V2_UNSPEC;
    header.writeUInt16BE(0, 14);
    return header;
  }
  const addressLength = family === 4 ? 4 : 16;
  const header = Buffer.allocUnsafe(16 + 2 * addressLength + 4);
  V2_SIGNATURE.copy(header, 0);
  header[12] = V2_PROXY;
  header[13] = family === 4 ? V2_TCP4 : V2_TCP6;
  header.writeUInt16BE(2 * addressLength + 4, 14);
  if (family === 4) {
    writeIPv4(header, 16, src);
    writeIPv4(header, 20, dst);
  } else {
    writeIPv6(header, 16, src);
    writeIPv6(header, 32, dst);
  }
  header.writeUInt16BE(srcPort, 16 + 2 * addressLength);
  header.writeUInt16BE(dstPort, 18 + 2 * addressLength);
  return header;
}

/** 4 or 6 when both are addresses of that family; 0 otherwise. */
function commonFamily(src: string, dst: string): 0 | 4 | 6 {
  const a = addressFamily(src);
  return a !== 0 && a === addressFamily(dst) ? a : 0;
}

/** A cheap family test for the addresses sockets give (they are valid when present). */
function addressFamily(address: string): 0 | 4 | 6 {
  if (address.includes(':')) return address.includes('%') ? 0 : 6;
  return /^\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(address) ? 4 : 0;
}

function writeIPv4(buf: Buffer, offset: number, ip: string): void {
  let o = offset;
  for (const octet of ip.split('.')) buf[o++] = Number(octet);
}

function writeIPv6(buf: Buffer, offset: number, ip: string): void {
  const words = ipv6Words(ip);
  for (let i = 0; i < 8; i++) buf.writeUInt16BE(words[i] ?? 0, offset + 2 * i);
}
