// Pure parsers and checks for flag and config values (Go durations, IPs, host:port, CIDRs).
import { isValidIP } from '../source/validate.ts';

export { isValidCIDR, isValidIP } from '../source/validate.ts';

const UNIT_MS: Record<string, number> = {
  ns: 1e-6,
  us: 1e-3,
  µs: 1e-3,
  ms: 1,
  s: 1000,
  m: 60_000,
  h: 3_600_000,
};

/** Parses a Go duration (`250ms`, `30s`, `1h30m`, `0`) into milliseconds; undefined if malformed. */
export function parseDuration(text: string): number | undefined {
  const s = text.trim();
  if (s === '0') return 0;
  if (!/^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$/.test(s)) return undefined;
  let total = 0;
  for (const m of s.matchAll(/(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)/g)) total += Number(m[1]) * UNIT_MS[m[2]!]!;
  return total;
}

/** Formats milliseconds the way Go prints a duration (`250ms`, `30s`, `15m0s`). */
export function formatDuration(ms: number): string {
  if (ms === 0) return '0s';
  if (ms < 1000) return `${ms}ms`;
  const h = Math.floor(ms / 3_600_000);
  const m = Math.floor((ms % 3_600_000) / 60_000);
  const s = (ms % 60_000) / 1000;
  if (h > 0) return `${h}h${m}m${s}s`;
  if (m > 0) return `${m}m${s}s`;
  return `${s}s`;
}

export function isUnspecified(ip: string): boolean {
  return ip === '0.0.0.0' || ip === '::';
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
