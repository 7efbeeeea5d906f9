// Rate limits for warnings that the API server's answers can repeat without end (an unknown event type per
// line, malformed objects): a few per window per message, then a count of what was left out, logged with
// the next one let through. Pure: time is an argument.

export class LogLimiter {
  readonly #burst: number;
  readonly #windowMs: number;
  readonly #windows = new Map<string, { startMs: number; logged: number; suppressed: number }>();

  /** `burst` lines per `windowMs` for each message. */
  constructor(burst: number, windowMs: number) {
    this.#burst = burst;
    this.#windowMs = windowMs;
  }

  /**
   * Whether a line with this message may be logged at `nowMs`: undefined = leave it out (counted), else
   * how many were left out since the last one let through (log it as `suppressed` when > 0).
   */
  admit(message: string, nowMs: number): number | undefined {
    let w = this.#windows.get(message);
    if (w === undefined || nowMs - w.startMs >= this.#windowMs) {
      w = { startMs: nowMs, logged: 0, suppressed: w?.suppressed ?? 0 };
      this.#windows.set(message, w);
    }
    if (w.logged >= this.#burst) {
      w.suppressed++;
      return undefined;
    }
    w.logged++;
    const suppressed = w.suppressed;
    w.suppressed = 0;
    return suppressed;
  }
}
