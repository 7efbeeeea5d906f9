// What this process may use, read once at start from /proc: the file-descriptor limit (Node raises the
// soft limit to the hard one at start; every listener, connection side and UDP session takes one) and
// the effective capabilities (iptables needs CAP_NET_ADMIN). Parsers are pure; readers are sync and
// tiny, and return undefined where /proc is not there.
import { readFileSync } from 'node:fs';

export type FdLimits = { soft: number; hard: number };

/** Linux capability numbers we care about (include/uapi/linux/capability.h). */
export const CAP_NET_ADMIN = 12;
export const CAP_NET_RAW = 13;

/** `Max open files` of a /proc/<pid>/limits text; `unlimited` is Infinity. Undefined when absent. */
export function parseFdLimits(text: string): FdLimits | undefined {
  const m = /^Max open files\s+(\d+|unlimited)\s+(\d+|unlimited)\s/m.exec(text);
  if (!m) return undefined;
  const n = (v: string) => (v === 'unlimited' ? Number.POSITIVE_INFINITY : Number(v));
  return { soft: n(m[1]!), hard: n(m[2]!) };
}

/** The effective capability set of a /proc/<pid>/status text, as a bigint mask. Undefined when absent. */
export function parseEffectiveCapabilities(text: string): bigint | undefined {
  const m = /^CapEff:\s*([0-9a-f]+)$/m.exec(text);
  return m ? BigInt(`0x${m[1]}`) : undefined;
}

export function hasCapability(mask: bigint, cap: number): boolean {
  return (mask & (1n << BigInt(cap))) !== 0n;
}

/** This process's descriptor limits, or undefined without /proc. */
export function readFdLimits(): FdLimits | undefined {
  try {
    return parseFdLimits(readFileSync('/proc/self/limits', 'utf8'));
  } catch {
    return undefined;
  }
}

/** This process's effective capabilities, or undefined without /proc. */
export function readEffectiveCapabilities(): bigint | undefined {
  try {
    return parseEffectiveCapabilities(readFileSync('/proc/self/status', 'utf8'));
  } catch {
    return undefined;
  }
}

/**
 * The cap on UDP sessions across service ports: `configured`, or for 0 ("auto") half the soft descriptor
 * limit (the other half for listeners and TCP), at least 1024 and at most 65536.
 */
export function udpSessionCap(configured: number, limits: FdLimits | undefined): number {
  if (configured > 0) return configured;
  const soft = limits?.soft ?? 65_536;
  return Math.min(65_536, Math.max(1024, Math.floor(soft / 2)));
}

/**
 * The cap on concurrent TCP connections per service port: `configured` when given (0 = none); by
 * default (-1, which no flag value can be) an eighth of the soft descriptor limit, at least 64. A connection takes
 * two descriptors, so the clients of one service port can hold at most a quarter of them and never
 * starve the others. No cap when the limit is unlimited.
 */
export function tcpConnectionCap(configured: number, limits: FdLimits | undefined): number {
  if (configured >= 0) return configured;
  const soft = limits?.soft ?? 65_536;
  if (!Number.isFinite(soft)) return 0;
  return Math.max(64, Math.floor(soft / 8));
}
