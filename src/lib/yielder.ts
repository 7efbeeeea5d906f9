// Long loops on the event loop's thread (opening thousands of listeners, applying a huge manifest) give
// the data path a turn every few milliseconds. Awaiting a promise is not enough: promise continuations
// and nextTicks run before any I/O, so a loop of awaits still holds the event loop; setImmediate does not.
import { performance } from 'node:perf_hooks';

/** How long bulk work may hold the event loop before it lets I/O and timers run. */
export const SLICE_MS = 10;

export class Yielder {
  readonly sliceMs: number;
  #last = performance.now();

  constructor(sliceMs = SLICE_MS) {
    this.sliceMs = sliceMs;
  }

  /** True when a turn is due; check it first (`if (y.due) await y.turn()`) so the loop stays sync. */
  get due(): boolean {
    return performance.now() - this.#last >= this.sliceMs;
  }

  /** Lets the event loop run everything that is ready, then resumes. */
  async turn(): Promise<void> {
    await new Promise((resolve) => setImmediate(resolve));
    this.#last = performance.now();
  }
}
