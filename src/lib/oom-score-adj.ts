// --oom-score-adj, as kube-proxy: written to /proc/self/oom_score_adj so the kernel kills the proxy
// last. Where it cannot apply (not root, a container without CAP_SYS_RESOURCE, no /proc) that is said
// once at debug level, as kube-proxy does at V(2); a warning only when it should have worked.
// The decision is pure; the file access is injected.
import { readFileSync, writeFileSync } from 'node:fs';
import type { Logger } from './log.ts';

const OOM_SCORE_ADJ = '/proc/self/oom_score_adj';
const STATUS = '/proc/self/status';
/** CAP_SYS_RESOURCE (linux/capability.h): what lowering oom_score_adj takes. */
const CAP_SYS_RESOURCE = 24n;

export type OomFiles = { read(path: string): string; write(path: string, text: string): void };

const realFiles: OomFiles = {
  read: (path) => readFileSync(path, 'utf8'),
  write: (path, text) => writeFileSync(path, text),
};

export type OomFailure = {
  /** The value asked for. */
  value: number;
  /** The value in place, when it could be read. */
  current: number | undefined;
  /** Whether the process holds CAP_SYS_RESOURCE; undefined when unknown. */
  canLower: boolean | undefined;
  /** The error code of the write. */
  code: string | undefined;
};

/**
 * Why a failed write is expected (a reason to log at debug level), or undefined when it should have
 * worked (a warning): no /proc (not Linux), or a lower value without CAP_SYS_RESOURCE (not root, or a
 * container that does not grant it; the kubelet sets critical pods' score itself).
 */
export function expectedOomFailure(f: OomFailure): string | undefined {
  if (f.code === 'ENOENT' || f.code === 'ENOTDIR') return 'no /proc/self/oom_score_adj';
  const lowering = f.current === undefined || f.value < f.current;
  if ((f.code === 'EACCES' || f.code === 'EPERM') && lowering && f.canLower !== true)
    return 'lowering it needs CAP_SYS_RESOURCE';
  return undefined;
}

/** The CapEff line of /proc/self/status → whether CAP_SYS_RESOURCE is in it; undefined if absent. */
export function hasSysResource(status: string): boolean | undefined {
  const m = /^CapEff:\s*([0-9a-f]+)\s*$/im.exec(status);
  if (!m) return undefined;
  return ((BigInt(`0x${m[1]}`) >> CAP_SYS_RESOURCE) & 1n) === 1n;
}

/** Applies `value`; logs once: debug when it does not apply here, warn when it should have worked. */
export function applyOomScoreAdj(value: number, log: Logger, files: OomFiles = realFiles): void {
  const current = readNumber(files, OOM_SCORE_ADJ);
  if (current === value) {
    log.debug({ value }, 'oom_score_adj already set');
    return;
  }
  try {
    files.write(OOM_SCORE_ADJ, String(value));
    log.debug({ value, was: current }, 'Set oom_score_adj');
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    let canLower: boolean | undefined;
    try {
      canLower = hasSysResource(files.read(STATUS));
    } catch {
      canLower = undefined;
    }
    const reason = expectedOomFailure({ value, current, canLower, code });
    if (reason !== undefined) log.debug({ value, current, reason }, 'Not setting oom_score_adj');
    else log.warn({ value, current, err }, 'Cannot set oom_score_adj');
  }
}

function readNumber(files: OomFiles, path: string): number | undefined {
  try {
    const n = Number.parseInt(files.read(path).trim(), 10);
    return Number.isNaN(n) ? undefined : n;
  } catch {
    return undefined;
  }
}
