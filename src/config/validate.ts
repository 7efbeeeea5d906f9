// Pure parsers and checks for flag and config-file values (Go durations, IPs, host:port, CIDRs). A bad
// value throws one ProxyError naming the flag or field it came from.
import type { ErrorCode } from '../lib/errors.ts';
import { ProxyError } from '../lib/errors.ts';
import { joinHostPort, parseHostPort } from '../lib/host-port.ts';
import { isValidCIDR, isValidIP } from '../lib/ip.ts';
import { portRangeProblem } from '../lib/port-range.ts';
import type { DetectLocalMode } from './config-type.ts';
import { DETECT_LOCAL_MODES, NODE_PORT_ADDRESSES_PRIMARY } from './config-type.ts';

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

/**
 * Where a value came from, so a bad one gets one message naming it: a flag (`--udp-timeout`,
 * KUP_ERR_INVALID_FLAG) or a config file field (`udpIdleTimeout` in `file`, KUP_ERR_CONFIG_FILE).
 */
export type ValueSource = { readonly code: ErrorCode; readonly name: string; readonly file?: string };

/** Throws the one error for a bad value: `[file: ]invalid NAME "value": why`. */
export function invalidValue(at: ValueSource, value: unknown, why: string): never {
  const where = at.file === undefined ? '' : `config file ${at.file}: `;
  throw new ProxyError(at.code, `${where}invalid ${at.name} ${JSON.stringify(value)}: ${why}`);
}

/** A Go duration in milliseconds; `positive` rejects 0. */
export function checkDuration(value: string, at: ValueSource, options: { positive?: boolean } = {}): number {
  const ms = parseDuration(value);
  if (ms === undefined) invalidValue(at, value, 'expected a duration such as 250ms, 30s or 15m');
  if (options.positive && ms <= 0) invalidValue(at, value, 'must be greater than 0');
  return ms;
}

/** The listeners' IP: any IP but loopback (DNAT to loopback does not work). */
export function checkBindAddress(value: string, at: ValueSource): string {
  if (!isValidIP(value)) invalidValue(at, value, 'not an IP address');
  if (value === '127.0.0.1' || value === '::1')
    invalidValue(at, value, 'cannot proxy on localhost (iptables DNAT to loopback does not work)');
  return value;
}

/** `""`, `N`, `A-B` or `A+N` (see parsePortRange). */
export function checkPortRange(value: string, at: ValueSource): string {
  const problem = portRangeProblem(value);
  if (problem !== undefined) invalidValue(at, value, problem);
  return value;
}

/**
 * A server address: `""` disables; `IP:port` or `[IPv6]:port`; a bare IP gets `defaultPort` appended
 * (kube-proxy's AppendPortIfNeeded).
 */
export function checkHostPort(value: string, at: ValueSource, defaultPort: number): string {
  const v = value.trim();
  if (v === '') return '';
  const withPort = isValidIP(v) ? joinHostPort(v, defaultPort) : v;
  if (parseHostPort(withPort) === undefined)
    invalidValue(at, value, 'expected IP:port (e.g. 0.0.0.0:10256), a bare IP, or "" to disable');
  return withPort;
}

/**
 * --nodeport-addresses / nodePortAddresses: CIDRs, or the keyword `primary` alone (kube-proxy's
 * validateKubeProxyNodePortAddress). `primary` is resolved to this node's IPs at start-up.
 */
export function checkCIDRs(values: readonly string[], at: ValueSource): string[] {
  const out = values.map((s) => s.trim()).filter((s) => s !== '');
  for (const cidr of out) {
    if (cidr === NODE_PORT_ADDRESSES_PRIMARY) {
      if (out.length !== 1) invalidValue(at, out.join(','), "can't use both 'primary' and CIDRs");
      continue;
    }
    if (!isValidCIDR(cidr)) invalidValue(at, cidr, 'not a CIDR');
  }
  return out;
}

/** The family of a valid CIDR. */
function cidrFamily(cidr: string): 'IPv4' | 'IPv6' {
  return cidr.includes(':') ? 'IPv6' : 'IPv4';
}

/**
 * --cluster-cidr / clusterCIDR: comma-separated, each a CIDR, at most one per family (kube-proxy's
 * validateClusterCIDRs).
 */
export function checkClusterCIDRs(value: string, at: ValueSource): string[] {
  const cidrs = value
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s !== '');
  for (const cidr of cidrs) if (!isValidCIDR(cidr)) invalidValue(at, cidr, 'not a CIDR');
  if (cidrs.length > 2 || (cidrs.length === 2 && cidrFamily(cidrs[0]!) === cidrFamily(cidrs[1]!)))
    invalidValue(
      at,
      value,
      'may only contain at most one CIDR per IP family (e.g. 10.244.0.0/16,fd00:10:244::/56)',
    );
  return cidrs;
}

/** --detect-local-mode / detectLocalMode: one of kube-proxy's LocalModes; `""` means ClusterCIDR. */
export function checkDetectLocalMode(value: string, at: ValueSource): DetectLocalMode {
  const v = value.trim();
  if (v === '') return 'ClusterCIDR';
  if (!(DETECT_LOCAL_MODES as readonly string[]).includes(v))
    invalidValue(at, value, `expected one of ${DETECT_LOCAL_MODES.join(', ')}`);
  return v as DetectLocalMode;
}

/** An integer in [min, max]. */
export function checkInt(value: number, at: ValueSource, min: number, max: number): number {
  if (!Number.isInteger(value) || value < min || value > max)
    invalidValue(
      at,
      value,
      max === Number.MAX_SAFE_INTEGER
        ? `must be an integer >= ${min}`
        : `must be an integer in [${min}, ${max}]`,
    );
  return value;
}

/** A finite number >= 0 (clientConnection.qps is a float32). */
export function checkNonNegative(value: number, at: ValueSource): number {
  if (!Number.isFinite(value) || value < 0) invalidValue(at, value, 'must be a number >= 0');
  return value;
}

/** The proxy mode: only the userspace mode exists here; `""` means the default, which is userspace. */
export function checkProxyMode(value: string, at: ValueSource): string {
  if (value !== '' && value !== 'userspace')
    invalidValue(
      at,
      value,
      'kube-userspace-proxy only implements the userspace mode (use "userspace" or "")',
    );
  return value;
}

export const CONTENT_TYPES = ['application/vnd.kubernetes.protobuf', 'application/json'] as const;

/** The API content type kube-proxy accepts; the client speaks JSON either way. */
export function checkContentType(value: string, at: ValueSource): string {
  if (!(CONTENT_TYPES as readonly string[]).includes(value))
    invalidValue(at, value, `expected one of ${CONTENT_TYPES.join(', ')}`);
  return value;
}
