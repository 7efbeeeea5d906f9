// kube-proxy's BoundedFrequencyRunner: runs `fn` when asked, at most once per minInterval (with a burst),
// at least once per maxInterval, never two at once, and again after a failure.
import type { Clock, TimerHandle } from '../lib/clock.ts';
import { realClock } from '../lib/clock.ts';

export type RunnerOptions = {
  /** Runs allowed back to back before minInterval applies (kube-proxy uses 2). */
  burstRuns?: number;
  /** Delay before retrying a failed run (default: minInterval, at least 1 s, at most maxInterval). */
  retryIntervalMs?: number;
  clock?: Clock;
  /** Called with the error of a failed run (the runner retries it). */
  onError?: (err: unknown) => void;
};

export class BoundedFrequencyRunner {
  readonly name: string;
  readonly #fn: () => unknown;
  readonly #minInterval: number;
  readonly #maxInterval: number;
  readonly #burst: number;
  readonly #retryInterval: number;
  readonly #clock: Clock;
  readonly #onError: (err: unknown) => void;
  #tokens: number;
  #lastRefill: number;
  #running = false;
  #pending = false;
  #stopped = true;
  #timer: TimerHandle | undefined;
  #timerAt = Number.POSITIVE_INFINITY;
  #current: Promise<void> | undefined;

  constructor(
    name: string,
    fn: () => unknown,
    minIntervalMs: number,
    maxIntervalMs: number,
    options: RunnerOptions = {},
  ) {
    if (maxIntervalMs < minIntervalMs)
      throw new RangeError(`${name}: maxInterval (${maxIntervalMs}) < minInterval (${minIntervalMs})`);
    this.name = name;
    this.#fn = fn;
    this.#minInterval = minIntervalMs;
    this.#maxInterval = maxIntervalMs;
    this.#burst = Math.max(1, options.burstRuns ?? 2);
    this.#retryInterval = options.retryIntervalMs ?? Math.min(maxIntervalMs, Math.max(minIntervalMs, 1000));
    this.#clock = options.clock ?? realClock;
    this.#onError = options.onError ?? (() => {});
    this.#tokens = this.#burst;
    this.#lastRefill = this.#clock.now();
  }

  /** Starts the periodic loop: a first run now, then at least one per maxInterval. */
  start(): void {
    if (!this.#stopped) return;
    this.#stopped = false;
    this.run();
  }

  /** Asks for a run as soon as the rate limit allows. Calls while one is pending or running coalesce. */
  run(): void {
    if (this.#stopped) return;
    this.#pending = true;
    if (!this.#running) this.#schedule();
  }

  /** Stops the loop; resolves when a run in progress has finished. */
  async stop(): Promise<void> {
    this.#stopped = true;
    this.#pending = false;
    this.#clearTimer();
    await this.#current;
  }

  #refill(now: number): void {
    if (this.#minInterval <= 0) {
      this.#tokens = this.#burst;
      return;
    }
    const earned = (now - this.#lastRefill) / this.#minInterval;
    this.#tokens = Math.min(this.#burst, this.#tokens + earned);
    this.#lastRefill = now;
  }

  #schedule(): void {
    const now = this.#clock.now();
    this.#refill(now);
    if (this.#pending) {
      if (this.#tokens >= 1) {
        this.#setTimer(0);
      } else {
        this.#setTimer(Math.ceil((1 - this.#tokens) * this.#minInterval));
      }
    } else {
      this.#setTimer(this.#maxInterval);
    }
  }

  #setTimer(delay: number): void {
    const at = this.#clock.now() + delay;
    if (this.#timer !== undefined && this.#timerAt <= at) return;
    this.#clearTimer();
    this.#timerAt = at;
    this.#timer = this.#clock.setTimeout(() => {
      this.#timer = undefined;
      this.#timerAt = Number.POSITIVE_INFINITY;
      this.#tick();
    }, delay);
  }

  #clearTimer(): void {
    if (this.#timer !== undefined) this.#clock.clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#timerAt = Number.POSITIVE_INFINITY;
  }

  #tick(): void {
    if (this.#stopped || this.#running) return;
    this.#refill(this.#clock.now());
    if (this.#tokens < 1) {
      this.#pending = true;
      this.#schedule();
      return;
    }
    this.#tokens -= 1;
    this.#pending = false;
    this.#running = true;
    this.#current = this.#invoke();
  }

  async #invoke(): Promise<void> {
    let failed = false;
    try {
      await this.#fn();
    } catch (err) {
      failed = true;
      this.#onError(err);
    }
    this.#running = false;
    this.#current = undefined;
    if (this.#stopped) return;
    if (failed && !this.#pending) {
      this.#setTimer(this.#retryInterval);
      this.#pending = true;
      return;
    }
    this.#schedule();
  }
}
