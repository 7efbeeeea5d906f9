// `host:port` text as Go's net.JoinHostPort and SplitHostPort write and read it (IPv6 in brackets).
// Pure: imports nothing of the project but lib/.
import { isValidIP } from './ip.ts';

/** `10.0.0.1:80`, `[fd00::1]:80`. */
export function joinHostPort(ip: string, port: number): string {
  return ip.includes(':') ? `[${ip}]:${port}` : `${ip}:${port}`;
}

/** Splits `host:port` or `[v6]:port`; a bare port means all addresses. Undefined when malformed. */
export function parseHostPort(text: string): { host: string; port: number } | undefined {
  const m = /^(?:\[([^\]]+)\]|([^:[\]]*)):(\d{1,5})$/.exec(text.trim());
  if (!m) return undefined;
  const host = m[1] ?? m[2] ?? '';
  const port = Number(m[3]);
  if (port > 65535) return undefined;
  if (host !== '' && !isValidIP(host)) return undefined;
  return { host: host === '' ? '0.0.0.0' : host, port };
}
