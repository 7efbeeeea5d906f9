// Passive outlier ejection (Envoy's consecutive-failure detector, for connects): an endpoint that fails
// `consecutiveFailures` connects in a row is skipped for a back-off that doubles each time it is ejected
// again, and comes back on its own when the back-off ends. Never ejects past `maxEjectionPercent` of the
// endpoints, and never the last one (panic threshold). Pure: time comes in as `nowMs`.

export type OutlierOptions = {
  /** Connect failures in a row that eject an endpoint. */
  consecutiveFailures: number;
  /** First ejection time; doubles with each ejection that follows a return without a success. */
  baseEjectionMs: number;
  maxEjectionMs: number;
  /** At most this share of a service port's endpoints is ejected at once (at least one, if there are two). */
  maxEjectionPercent: number;
};

export const DEFAULT_OUTLIER_OPTIONS: OutlierOptions = {
  consecutiveFailures: 3,
  baseEjectionMs: 5_000,
  maxEjectionMs: 300_000,
  maxEjectionPercent: 50,
};

type Health = { failures: number; ejections: number; ejectedUntilMs: number };

export type EjectionEvent = { endpoint: string; untilMs: number; ejections: number; failures: number };

export class OutlierDetector {
  readonly options: OutlierOptions;
  /** By endpoint key, for endpoints with failures; undefined until the first (an idle service port's is). */
  #health: Map<string, Health> | undefined;
  #ejected = 0;

  constructor(options: OutlierOptions = DEFAULT_OUTLIER_OPTIONS) {
    this.options = options;
  }

  /** How many endpoints are ejected right now (as of the last call that looked at time). */
  get ejectedCount(): number {
    return this.#ejected;
  }

  /** True when `endpoint` should be skipped at `nowMs`. Returns ejected endpoints whose time is up. */
  isEjected(endpoint: string, nowMs: number): boolean {
    const h = this.#health?.get(endpoint);
    if (h === undefined || h.ejectedUntilMs === 0) return false;
    if (nowMs < h.ejectedUntilMs) return true;
    // Back on probation: one more failure ejects it again, for longer.
    h.ejectedUntilMs = 0;
    h.failures = this.options.consecutiveFailures - 1;
    this.#ejected--;
    return false;
  }

  /**
   * A connect to `endpoint` failed. Returns the ejection when this failure ejected it; `total` is the
   * number of endpoints of the service port (for the ejection cap).
   */
  failed(endpoint: string, nowMs: number, total: number): EjectionEvent | undefined {
    const h = this.#healthOf(endpoint);
    if (h.ejectedUntilMs !== 0) return undefined;
    h.failures++;
    if (h.failures < this.options.consecutiveFailures) return undefined;
    const cap = Math.min(total - 1, Math.floor((total * this.options.maxEjectionPercent) / 100) || 1);
    if (this.#ejected >= cap) return undefined;
    const duration = Math.min(this.options.maxEjectionMs, this.options.baseEjectionMs * 2 ** h.ejections);
    h.ejections++;
    h.ejectedUntilMs = nowMs + duration;
    this.#ejected++;
    return { endpoint, untilMs: h.ejectedUntilMs, ejections: h.ejections, failures: h.failures };
  }

  /**
   * Another process of this proxy ejected `endpoint` until `untilMs` (--workers): skipped here too, and
   * its next failure here after that time ejects it for longer, as if the ejection had been this one's.
   * Nothing when it is ejected already, or when the cap would be passed (never every endpoint).
   */
  ejectedElsewhere(
    endpoint: string,
    untilMs: number,
    ejections: number,
    total: number,
    nowMs: number,
  ): boolean {
    if (untilMs <= nowMs) return false;
    const h = this.#healthOf(endpoint);
    if (h.ejectedUntilMs !== 0) return false;
    const cap = Math.min(total - 1, Math.floor((total * this.options.maxEjectionPercent) / 100) || 1);
    if (this.#ejected >= cap) return false;
    h.ejections = Math.max(h.ejections, ejections);
    h.failures = 0;
    h.ejectedUntilMs = untilMs;
    this.#ejected++;
    return true;
  }

  /** A connect to `endpoint` succeeded: its failure streak and back-off history are forgotten. */
  succeeded(endpoint: string): void {
    const h = this.#health?.get(endpoint);
    if (h === undefined) return;
    if (h.ejectedUntilMs !== 0) this.#ejected--;
    this.#health!.delete(endpoint);
  }

  /** Forgets endpoints that are gone from the service port (`endpoints`: what it holds now). */
  retain(endpoints: readonly { readonly key: string }[]): void {
    const health = this.#health;
    if (health === undefined || health.size === 0) return;
    const keys = new Set(endpoints.map((e) => e.key));
    for (const [key, h] of health) {
      if (keys.has(key)) continue;
      if (h.ejectedUntilMs !== 0) this.#ejected--;
      health.delete(key);
    }
  }

  /** Endpoints ejected at `nowMs`, with when they return (for /debug/services). */
  ejected(nowMs: number): { endpoint: string; untilMs: number }[] {
    const out: { endpoint: string; untilMs: number }[] = [];
    if (this.#health === undefined) return out;
    for (const [endpoint, h] of this.#health)
      if (h.ejectedUntilMs > nowMs) out.push({ endpoint, untilMs: h.ejectedUntilMs });
    return out;
  }

  /** The health of `endpoint`, made on its first failure. */
  #healthOf(endpoint: string): Health {
    this.#health ??= new Map();
    let h = this.#health.get(endpoint);
    if (h === undefined) {
      h = { failures: 0, ejections: 0, ejectedUntilMs: 0 };
      this.#health.set(endpoint, h);
    }
    return h;
  }
}
