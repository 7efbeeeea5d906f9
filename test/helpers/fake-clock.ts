// A manual clock for timer-driven code: time moves only when the test calls advance().
import type { Clock, TimerHandle } from '../../src/lib/clock.ts';

type Timer = { id: number; at: number; fn: () => void };

export class FakeClock implements Clock {
  #now: number;
  #nextId = 1;
  #timers: Timer[] = [];

  constructor(start = 1_000_000) {
    this.#now = start;
  }

  now(): number {
    return this.#now;
  }

  setTimeout(fn: () => void, ms: number): TimerHandle {
    const timer = { id: this.#nextId++, at: this.#now + Math.max(0, ms), fn };
    this.#timers.push(timer);
    return timer;
  }

  clearTimeout(handle: TimerHandle): void {
    this.#timers = this.#timers.filter((t) => t !== handle);
  }

  get pendingTimers(): number {
    return this.#timers.length;
  }

  /** Moves time forward, firing due timers in order; awaits microtasks between them. */
  async advance(ms: number): Promise<void> {
    const end = this.#now + ms;
    for (;;) {
      await flush();
      this.#timers.sort((a, b) => a.at - b.at || a.id - b.id);
      const next = this.#timers[0];
      if (!next || next.at > end) break;
      this.#timers.shift();
      this.#now = next.at;
      next.fn();
    }
    this.#now = end;
    await flush();
  }
}

async function flush(): Promise<void> {
  for (let i = 0; i < 5; i++) await new Promise<void>((resolve) => setImmediate(resolve));
}
