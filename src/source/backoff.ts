// When to retry a failed list or watch: client-go's exponential backoff manager. Failures count up and the
// delay doubles to a cap; the count starts over only after a quiet period, so neither a successful list
// nor one event resets it (a 410 storm relisted every 0.7 s when each list did). Pure: time is an argument.

export type BackoffPolicy = {
  /** Delay before the first retry. */
  initialMs: number;
  /** Cap of the doubling. */
  maxMs: number;
  /** A failure this long after the previous one starts the count over (client-go: 2 min). */
  resetMs: number;
};

/**
 * Delay before retry `attempt` (1-based): initial × 2^(attempt-1), capped at max, then jittered down by
 * up to half so that many proxies restarted together do not retry in lockstep.
 */
export function backoffDelay(
  attempt: number,
  backoff: { initialMs: number; maxMs: number },
  random: () => number = Math.random,
): number {
  const base = Math.min(backoff.maxMs, backoff.initialMs * 2 ** Math.min(Math.max(attempt - 1, 0), 30));
  return Math.round(base * (1 - random() / 2));
}

/** The failure count of one list+watch loop. */
export class Backoff {
  readonly #policy: BackoffPolicy;
  #attempt = 0;
  #lastMs = Number.NEGATIVE_INFINITY;

  constructor(policy: BackoffPolicy) {
    this.#policy = policy;
  }

  /**
   * Records a failure at `nowMs` and returns its attempt number: 1 for the first failure after `resetMs`
   * without any (the loop was healthy for a while), else one more than the last.
   */
  fail(nowMs: number): number {
    if (nowMs - this.#lastMs >= this.#policy.resetMs) this.#attempt = 0;
    this.#lastMs = nowMs;
    return ++this.#attempt;
  }

  /** The delay before retry `attempt`, jittered. */
  delay(attempt: number, random?: () => number): number {
    return backoffDelay(attempt, this.#policy, random);
  }
}
