// One coarse timer for the process, for everything on the data path that expires or ages: idle UDP
// sessions (every 25 ms), TCP keep-alive for connections that live (every 10 s). Each item has its own
// period; the one timer is armed for the earliest due item and only while something is registered,
// and unref'd so it never holds the process. Time comes from an injected clock, so tests drive it.

import { type Clock, realClock, type TimerHandle } from '../lib/clock.ts';

export interface Sweepable {
  /** Expire what is idle at `nowMs`; return false when there is nothing left to watch. */
  sweep(nowMs: number): boolean;
}

type Entry = { everyMs: number; dueMs: number };

/** 25 ms keeps the 250 ms default UDP session timeout within 10 %. */
const DEFAULT_SWEEP_MS = 25;

export class Sweeper {
  /** The period of an item added without one. */
  readonly intervalMs: number;
  readonly #clock: Clock;
  readonly #items = new Map<Sweepable, Entry>();
  #timer: TimerHandle | undefined = undefined;
  #timerDueMs = Number.POSITIVE_INFINITY;

  constructor(intervalMs = DEFAULT_SWEEP_MS, clock: Clock = realClock) {
    this.intervalMs = intervalMs;
    this.#clock = clock;
  }

  /** Items registered. */
  get size(): number {
    return this.#items.size;
  }

  /** Sweeps `item` every `everyMs` from now on, until it returns false or is deleted; adding it again keeps its period. */
  add(item: Sweepable, everyMs = this.intervalMs): void {
    if (this.#items.has(item)) return;
    const dueMs = this.#clock.now() + everyMs;
    this.#items.set(item, { everyMs, dueMs });
    if (dueMs < this.#timerDueMs) this.#arm(dueMs);
  }

  delete(item: Sweepable): void {
    this.#items.delete(item);
    if (this.#items.size === 0) this.stop();
  }

  /** Disarms the timer (items stay registered, and the next add arms it again). */
  stop(): void {
    if (this.#timer !== undefined) this.#clock.clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#timerDueMs = Number.POSITIVE_INFINITY;
  }

  #arm(dueMs: number): void {
    this.stop();
    this.#timerDueMs = dueMs;
    this.#timer = this.#clock.setTimeout(this.#tick, Math.max(1, dueMs - this.#clock.now()));
  }

  readonly #tick = (): void => {
    this.#timer = undefined;
    this.#timerDueMs = Number.POSITIVE_INFINITY;
    const now = this.#clock.now();
    let next = Number.POSITIVE_INFINITY;
    for (const [item, entry] of this.#items) {
      if (entry.dueMs <= now) {
        if (!item.sweep(now)) {
          this.#items.delete(item);
          continue;
        }
        entry.dueMs = now + entry.everyMs;
      }
      if (entry.dueMs < next) next = entry.dueMs;
    }
    if (next !== Number.POSITIVE_INFINITY) this.#arm(next);
  };
}

/** The process's sweeper, for listeners not given one. */
export const processSweeper = new Sweeper();
