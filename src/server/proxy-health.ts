// kube-proxy's healthz logic, made honest: unhealthy when a queued change has not been applied within
// the health timeout (2 × --iptables-sync-period), so a stuck proxier turns red. Pure: time comes in.

export type HealthStatus = {
  healthy: boolean;
  /** 503 reasons for /healthz: not yet synced once, or a change pending too long. */
  reason: 'ok' | 'not-synced' | 'stale';
  lastUpdated: string;
  currentTime: string;
};

const ZERO_TIME = '0001-01-01T00:00:00Z';

export class ProxyHealth {
  readonly timeoutMs: number;
  #lastUpdated = 0;
  /** The oldest queued change not applied yet; 0 = none pending. */
  #oldestPending = 0;
  /** The oldest change queued after the running sync took its snapshot: that sync does not apply it. */
  #queuedSinceSyncStart = 0;
  #syncing = false;

  constructor(timeoutMs: number) {
    this.timeoutMs = timeoutMs;
  }

  /** A change arrived that the next sync must apply. */
  queuedUpdate(nowMs: number): void {
    if (this.#oldestPending === 0) this.#oldestPending = nowMs;
    if (this.#syncing && this.#queuedSinceSyncStart === 0) this.#queuedSinceSyncStart = nowMs;
  }

  /** A sync takes its snapshot now: changes queued from here on are left for the next one. */
  syncStarted(): void {
    this.#syncing = true;
    this.#queuedSinceSyncStart = 0;
  }

  /** A sync applied everything that was queued before it started (see syncStarted). */
  updated(nowMs: number): void {
    this.#lastUpdated = nowMs;
    this.#oldestPending = this.#queuedSinceSyncStart;
    this.#queuedSinceSyncStart = 0;
    this.#syncing = false;
  }

  get lastUpdatedMs(): number {
    return this.#lastUpdated;
  }

  /** Liveness: false only when a queued change has waited longer than the timeout. */
  isLive(nowMs: number): boolean {
    return this.#oldestPending === 0 || nowMs - this.#oldestPending < this.timeoutMs;
  }

  /** Readiness (/healthz): synced at least once and not stale. */
  status(nowMs: number, options: { requireSynced: boolean } = { requireSynced: true }): HealthStatus {
    const stale = !this.isLive(nowMs);
    const notSynced = options.requireSynced && this.#lastUpdated === 0;
    const healthy = !stale && !notSynced;
    return {
      healthy,
      reason: stale ? 'stale' : notSynced ? 'not-synced' : 'ok',
      // As kube-proxy: a healthy answer reports the current time as lastUpdated.
      lastUpdated: healthy
        ? new Date(nowMs).toISOString()
        : this.#lastUpdated === 0
          ? ZERO_TIME
          : new Date(this.#lastUpdated).toISOString(),
      currentTime: new Date(nowMs).toISOString(),
    };
  }
}
