// One shared coarse timer for everything that expires on the data path (UDP sessions), instead of a
// timer per session. Runs only while something is registered; unref'd so it never holds the process.

export interface Sweepable {
  /** Expire what is idle at `nowMs`; return false when there is nothing left to watch. */
  sweep(nowMs: number): boolean;
}

export class Sweeper {
  readonly intervalMs: number;
  readonly #items = new Set<Sweepable>();
  #timer: NodeJS.Timeout | undefined;

  constructor(intervalMs: number) {
    this.intervalMs = intervalMs;
  }

  add(item: Sweepable): void {
    this.#items.add(item);
    if (this.#timer === undefined) {
      this.#timer = setInterval(() => this.#tick(), this.intervalMs);
      this.#timer.unref();
    }
  }

  delete(item: Sweepable): void {
    this.#items.delete(item);
    if (this.#items.size === 0) this.stop();
  }

  stop(): void {
    if (this.#timer !== undefined) clearInterval(this.#timer);
    this.#timer = undefined;
  }

  #tick(): void {
    const now = Date.now();
    for (const item of this.#items) {
      if (!item.sweep(now)) this.#items.delete(item);
    }
    if (this.#items.size === 0) this.stop();
  }
}

/** The process's sweeper for UDP sessions; 25 ms keeps the 250 ms default timeout within 10 %. */
export const sessionSweeper = new Sweeper(25);
