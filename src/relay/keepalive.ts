// TCP keep-alive for the connections that live. Enabling it costs four setsockopt calls per socket,
// eight per proxied connection, about a tenth of a short connection's cost, and a connection that ends
// within seconds never sends a probe. So a sweep of the process's sweeper turns it on, on both sockets,
// for every connection that has been open for a sweep interval; the probes then start after the usual
// idle delay.
import type { ReadonlyActiveList } from './active-list.ts';
import type { Sweepable } from './sweeper.ts';
import { processSweeper, type Sweeper } from './sweeper.ts';

/** What the sweep needs to know of one proxied connection. */
export interface KeepAliveCandidate {
  /**
   * Turns keep-alive on for both sockets with this idle delay; false (nothing done) while dialling or
   * after the end.
   */
  turnKeepAliveOn(delayMs: number): boolean;
  readonly startMs: number;
  keepAliveOn: boolean;
}

/** A set of connections (a listener's), and the idle delay before the first probe. */
export interface KeepAliveSource {
  readonly connections: ReadonlyActiveList<KeepAliveCandidate>;
  readonly keepAliveDelayMs: number;
  /** True once the listener is closed: dropped from the sweep when it has no connection left. */
  readonly closed: boolean;
}

const KEEPALIVE_SWEEP_MS = 10_000;

/** The listeners whose connections get keep-alive; swept by a Sweeper every `intervalMs`. */
export class KeepAliveSweeper implements Sweepable {
  readonly #sources = new Set<KeepAliveSource>();
  readonly #intervalMs: number;
  readonly #sweeper: Sweeper;

  constructor(intervalMs = KEEPALIVE_SWEEP_MS, sweeper: Sweeper = processSweeper) {
    this.#intervalMs = intervalMs;
    this.#sweeper = sweeper;
  }

  /** Listeners swept (a closed one stays until its last connection ended). */
  get size(): number {
    return this.#sources.size;
  }

  add(source: KeepAliveSource): void {
    this.#sources.add(source);
    this.#sweeper.add(this, this.#intervalMs);
  }

  /**
   * Turns keep-alive on for every connection open for at least one interval at `nowMs`. Returns false
   * (and leaves the sweeper) once no listener is left.
   */
  sweep(nowMs: number): boolean {
    const before = nowMs - this.#intervalMs;
    for (const source of this.#sources) {
      if (source.closed && source.connections.size === 0) {
        this.#sources.delete(source);
        continue;
      }
      for (const conn of source.connections) {
        if (conn.keepAliveOn || conn.startMs > before) continue;
        if (conn.turnKeepAliveOn(source.keepAliveDelayMs)) conn.keepAliveOn = true;
      }
    }
    if (this.#sources.size > 0) return true;
    this.#sweeper.delete(this);
    return false;
  }
}

/** The process's keep-alive sweep, for listeners not given one. */
export const defaultKeepAliveSweeper = new KeepAliveSweeper();
