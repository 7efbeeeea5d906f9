// Applies --conntrack-max-per-core, --conntrack-min and the two TCP conntrack timeouts as kube-proxy does
// (pkg/proxy/conntrack/sysctls.go): a pure decision (conntrackWrites) and the I/O at the edge
// (applyConntrackSettings, with the sysctl reader/writer injected). Never throws: a read-only /proc/sys
// (common in containers) is one clear log line.
import { readFile, writeFile } from 'node:fs/promises';
import { availableParallelism, cpus } from 'node:os';
import type { Logger } from '../lib/log.ts';

export const NF_CONNTRACK_MAX = '/proc/sys/net/netfilter/nf_conntrack_max';
export const NF_CONNTRACK_TCP_TIMEOUT_ESTABLISHED =
  '/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established';
export const NF_CONNTRACK_TCP_TIMEOUT_CLOSE_WAIT =
  '/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait';
export const NF_CONNTRACK_HASHSIZE = '/sys/module/nf_conntrack/parameters/hashsize';

/** Reads and writes integer kernel settings by path (/proc/sys/..., /sys/module/...). */
export interface Sysctl {
  /** The value, or undefined when it cannot be read (no such entry, no permission). */
  read(path: string): Promise<number | undefined>;
  /** Writes the value; rejects with the system error (EROFS, EACCES, ENOENT, ...). */
  write(path: string, value: number): Promise<void>;
}

/** The real /proc/sys and /sys. */
export const realSysctl: Sysctl = {
  async read(path) {
    try {
      const n = Number.parseInt((await readFile(path, 'utf8')).trim(), 10);
      return Number.isNaN(n) ? undefined : n;
    } catch {
      return undefined;
    }
  },
  async write(path, value) {
    await writeFile(path, String(value));
  },
};

/** The Config fields this module applies; 0 means "leave it as it is" (kube-proxy's meaning). */
export type ConntrackSettings = {
  readonly maxPerCore: number;
  readonly min: number;
  readonly tcpEstablishedTimeoutMs: number;
  readonly tcpCloseWaitTimeoutMs: number;
};

/** kube-proxy's getConntrackMax: maxPerCore × CPUs, at least min; 0 (leave it) when maxPerCore is 0. */
export function conntrackMax(settings: ConntrackSettings, cpuCount: number): number {
  if (settings.maxPerCore <= 0) return 0;
  return Math.max(settings.maxPerCore * cpuCount, settings.min);
}

/** What the kernel holds now (undefined: could not be read). */
export type ConntrackCurrent = {
  readonly max: number | undefined;
  readonly hashsize: number | undefined;
  readonly tcpEstablishedTimeout: number | undefined;
  readonly tcpCloseWaitTimeout: number | undefined;
};

export type SysctlWrite = { readonly path: string; readonly value: number };

/**
 * The writes kube-proxy would make, in its order: nf_conntrack_max only when it would grow (never
 * lowered), the conntrack hash size when it is below max/4, each TCP timeout (in whole seconds) when
 * it differs. A value that could not be read counts as different (the hash size: is left). Pure.
 */
export function conntrackWrites(
  settings: ConntrackSettings,
  cpuCount: number,
  current: ConntrackCurrent,
): SysctlWrite[] {
  const writes: SysctlWrite[] = [];
  const max = conntrackMax(settings, cpuCount);
  if (max > 0) {
    if (current.max === undefined || current.max < max) writes.push({ path: NF_CONNTRACK_MAX, value: max });
    const hashsize = Math.floor(max / 4);
    // kube-proxy stops when it cannot read the hash size; here only the hash size is skipped.
    if (current.hashsize !== undefined && current.hashsize < hashsize)
      writes.push({ path: NF_CONNTRACK_HASHSIZE, value: hashsize });
  }
  const timeout = (path: string, ms: number, now: number | undefined) => {
    const seconds = Math.floor(ms / 1000);
    if (seconds > 0 && now !== seconds) writes.push({ path, value: seconds });
  };
  timeout(
    NF_CONNTRACK_TCP_TIMEOUT_ESTABLISHED,
    settings.tcpEstablishedTimeoutMs,
    current.tcpEstablishedTimeout,
  );
  timeout(NF_CONNTRACK_TCP_TIMEOUT_CLOSE_WAIT, settings.tcpCloseWaitTimeoutMs, current.tcpCloseWaitTimeout);
  return writes;
}

/** The node's CPU count (nf_conntrack_max is host-wide: all online CPUs, not this process's share). */
export function cpuCount(): number {
  return cpus().length || availableParallelism();
}

export type ApplyConntrackDeps = {
  readonly sysctl: Sysctl;
  readonly log: Logger;
  /** Default: cpuCount(). */
  readonly cpuCount?: number;
};

/** Reads the current values, writes what conntrackWrites says, logs each write. Never rejects. */
export async function applyConntrackSettings(
  settings: ConntrackSettings,
  deps: ApplyConntrackDeps,
): Promise<{ written: SysctlWrite[]; failed: SysctlWrite[] }> {
  const { sysctl, log } = deps;
  const [max, hashsize, tcpEstablishedTimeout, tcpCloseWaitTimeout] = await Promise.all([
    sysctl.read(NF_CONNTRACK_MAX),
    sysctl.read(NF_CONNTRACK_HASHSIZE),
    sysctl.read(NF_CONNTRACK_TCP_TIMEOUT_ESTABLISHED),
    sysctl.read(NF_CONNTRACK_TCP_TIMEOUT_CLOSE_WAIT),
  ]);
  const current = { max, hashsize, tcpEstablishedTimeout, tcpCloseWaitTimeout };
  const written: SysctlWrite[] = [];
  const failed: SysctlWrite[] = [];
  for (const w of conntrackWrites(settings, deps.cpuCount ?? cpuCount(), current)) {
    try {
      await sysctl.write(w.path, w.value);
      written.push(w);
      log.info({ entry: w.path, value: w.value }, 'Set sysctl');
    } catch (err) {
      failed.push(w);
      const code = (err as NodeJS.ErrnoException).code;
      const readOnly = code === 'EROFS' || code === 'EACCES' || code === 'EPERM';
      log.warn(
        { entry: w.path, value: w.value, code, err },
        readOnly
          ? 'Cannot set conntrack sysctl: read-only here (common in containers); set it on the host, or mind the conntrack table'
          : 'Cannot set conntrack sysctl',
      );
    }
  }
  return { written, failed };
}
