// Running out of file descriptors (EMFILE/ENFILE), process-wide: counts where it happened, logs at most
// once per interval, and says when new connections should be shed for a moment. Node cannot pause
// accept(): on EMFILE libuv itself accepts and closes what it has no descriptor for (its reserve-fd
// trick, uv__emfile_trick in deps/uv/src/unix/stream.c), and when that drains the queue it returns
// without calling back, so Node's server never emits 'error' and nothing of ours hears of it. So a
// probe on the sweeper (one open and close of /dev/null a second) is what sees that accepts fail. The
// native listener (tcp-accept.ts) does hear of it, in the same seconds the probe sees it: `accept` counts
// the seconds (of the clock, FD_PROBE_MS each) in which either said so, so that one second without
// descriptors is one count and not two (or one per failed wake).
import { closeSync, openSync } from 'node:fs';
import type { Logger } from '../lib/log.ts';
import type { Sweepable } from './sweeper.ts';

/** Where a descriptor was missing. */
export type FdOperation = 'accept' | 'connect' | 'udp-session';

export type FdPressureOptions = {
  /** First shed period; doubles while descriptors stay short, up to `maxBackoffMs`. */
  baseBackoffMs: number;
  maxBackoffMs: number;
  /** At most one log line per operation per this interval (with the count of what it summarises). */
  logIntervalMs: number;
};

const DEFAULT_FD_PRESSURE_OPTIONS: FdPressureOptions = {
  baseBackoffMs: 100,
  maxBackoffMs: 1000,
  logIntervalMs: 5000,
};

/** True for the errors that mean "no file descriptor left" (per process or system-wide). */
export function isFdExhausted(err: NodeJS.ErrnoException | undefined): boolean {
  return err?.code === 'EMFILE' || err?.code === 'ENFILE';
}

/** Takes one descriptor and gives it back; returns the error when none could be had, else undefined. */
export type FdProbe = () => NodeJS.ErrnoException | undefined;

/** The real probe: an open and a close of /dev/null (two system calls). */
export const openProbe: FdProbe = () => {
  try {
    closeSync(openSync('/dev/null', 'r'));
    return undefined;
  } catch (err) {
    return isFdExhausted(err as NodeJS.ErrnoException) ? (err as NodeJS.ErrnoException) : undefined;
  }
};

/** How often the probe runs on the sweeper. */
export const FD_PROBE_MS = 1000;

export class FdPressure implements Sweepable {
  readonly options: FdPressureOptions;
  readonly #log: Logger | undefined;
  readonly #probe: FdProbe;
  /** Exhaustion events by operation (metrics read these); `accept` in seconds, see above. */
  readonly counts: Record<FdOperation, number> = { accept: 0, connect: 0, 'udp-session': 0 };
  /** The second (nowMs / FD_PROBE_MS) `accept` was last counted in. */
  #acceptSecond = Number.NEGATIVE_INFINITY;
  /** Connections or sessions turned away while shedding. */
  shed = 0;
  #untilMs = 0;
  #backoffMs: number;
  /** Per operation, so that accepts failing are said at once even while connects were being logged. */
  readonly #loggedMs: Record<FdOperation, number> = {
    accept: Number.NEGATIVE_INFINITY,
    connect: Number.NEGATIVE_INFINITY,
    'udp-session': Number.NEGATIVE_INFINITY,
  };
  readonly #unlogged: Record<FdOperation, number> = { accept: 0, connect: 0, 'udp-session': 0 };

  constructor(
    log?: Logger,
    options: FdPressureOptions = DEFAULT_FD_PRESSURE_OPTIONS,
    probe: FdProbe = openProbe,
  ) {
    this.#log = log;
    this.options = options;
    this.#backoffMs = options.baseBackoffMs;
    this.#probe = probe;
  }

  /**
   * The probe, every FD_PROBE_MS on the sweeper it is added to: no descriptor to be had means accepts
   * are failing (and libuv closes those connections itself), counted under `accept`. Always true.
   */
  sweep(nowMs: number): boolean {
    const err = this.#probe();
    if (err !== undefined) this.exhausted('accept', nowMs, err);
    return true;
  }

  /** A descriptor was missing for `op`: count it, start (or lengthen) the shed period, log if due. */
  exhausted(op: FdOperation, nowMs: number, err?: NodeJS.ErrnoException): void {
    if (op !== 'accept') this.counts[op]++;
    else {
      const second = Math.floor(nowMs / FD_PROBE_MS);
      if (second !== this.#acceptSecond) {
        this.counts.accept++;
        this.#acceptSecond = second;
      }
    }
    // Within a shed period that is still running, the back-off already grew for this episode.
    if (nowMs >= this.#untilMs) {
      this.#untilMs = nowMs + this.#backoffMs;
      this.#backoffMs = Math.min(this.options.maxBackoffMs, this.#backoffMs * 2);
    }
    this.#unlogged[op]++;
    if (this.#log !== undefined && nowMs - this.#loggedMs[op] >= this.options.logIntervalMs) {
      this.#log.warn(
        {
          operation: op,
          code: err?.code,
          events: this.#unlogged[op],
          shedForMs: this.#untilMs - nowMs,
          counts: { ...this.counts },
        },
        'Out of file descriptors, shedding new connections',
      );
      this.#loggedMs[op] = nowMs;
      this.#unlogged[op] = 0;
    }
  }

  /** A descriptor was had again (a connect succeeded): the next episode starts at the base back-off. */
  relieved(): void {
    this.#backoffMs = this.options.baseBackoffMs;
  }

  /** True while new connections should be closed at once (and counts one as shed). */
  shedding(nowMs: number): boolean {
    if (nowMs >= this.#untilMs) return false;
    this.shed++;
    return true;
  }
}
