// TCP keep-alive for the connections that live. Enabling it costs four setsockopt calls per socket,
// eight per proxied connection, about a tenth of a short connection's cost, and a connection that ends
// within seconds never sends a probe. So one process-wide timer turns it on, on both sockets, for every
// connection that has been open for a sweep interval; the probes then start after the usual idle delay.
import type net from 'node:net';

/** What the sweeper needs to know of one proxied connection. */
export interface KeepAliveCandidate {
  /** Both sockets, once connected; undefined while dialling or after the end. */
  keepAliveSockets(): readonly [net.Socket, net.Socket] | undefined;
  readonly startMs: number;
  keepAliveOn: boolean;
}

/** A set of connections (a listener's), and the idle delay before the first probe. */
export interface KeepAliveSource {
  readonly connections: ReadonlySet<KeepAliveCandidate>;
  readonly keepAliveDelayMs: number;
  /** True once the listener is closed: dropped from the sweep when it has no connection left. */
  readonly closed: boolean;
}

export const KEEPALIVE_SWEEP_MS = 10_000;

export class KeepAliveSweeper {
  readonly #sources = new Set<KeepAliveSource>();
  readonly #intervalMs: number;
  readonly #now: () => number;
  #timer: NodeJS.Timeout | undefined;

  constructor(intervalMs = KEEPALIVE_SWEEP_MS, now: () => number = Date.now) {
    this.#intervalMs = intervalMs;
    this.#now = now;
  }

  /** Listeners swept (a closed one stays until its last connection ended). */
  get size(): number {
    return this.#sources.size;
  }

  add(source: KeepAliveSource): void {
    this.#sources.add(source);
    if (this.#timer === undefined) {
      this.#timer = setInterval(() => this.sweep(), this.#intervalMs);
      this.#timer.unref();
    }
  }

  /** Turns keep-alive on for every connection open for at least one interval. */
  sweep(): void {
    const before = this.#now() - this.#intervalMs;
    for (const source of this.#sources) {
      if (source.closed && source.connections.size === 0) {
        this.#sources.delete(source);
        continue;
      }
      for (const conn of source.connections) {
        if (conn.keepAliveOn || conn.startMs > before) continue;
        const sockets = conn.keepAliveSockets();
        if (sockets === undefined) continue;
        conn.keepAliveOn = true;
        for (const s of sockets) if (!s.destroyed) s.setKeepAlive(true, source.keepAliveDelayMs);
      }
    }
    if (this.#sources.size === 0 && this.#timer !== undefined) {
      clearInterval(this.#timer);
      this.#timer = undefined;
    }
  }
}

/** The process's sweeper, for listeners not given one. */
export const defaultKeepAliveSweeper = new KeepAliveSweeper();
