// kube-proxy's healthz logic, made honest: unhealthy when a queued change has not been applied within
// the health timeout (2 × --iptables-sync-period), so a stuck proxier turns red; and, for /healthz only,
// when this Node is not eligible (being deleted, or tainted by the Cluster Autoscaler). Pure: time
// and the Node's state come in.

export type HealthStatus = {
  healthy: boolean;
  /** 503 reasons: not yet synced once, a change pending too long, or (/healthz) the node is going away. */
  reason: 'ok' | 'not-synced' | 'stale' | 'node-ineligible';
  /** kube-proxy's nodeEligible: false while this Node is being deleted or has the autoscaler taint. */
  nodeEligible: boolean;
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
  // As kube-proxy: eligible while starting up, until a Node event says otherwise.
  #nodeEligible = true;

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

  /** This Node's eligibility (see isNodeEligible in source/node-info.ts); only /healthz reads it. */
  setNodeEligible(eligible: boolean): void {
    this.#nodeEligible = eligible;
  }

  get nodeEligible(): boolean {
    return this.#nodeEligible;
  }

  get lastUpdatedMs(): number {
    return this.#lastUpdated;
  }

  /** Liveness: false only when a queued change has waited longer than the timeout. */
  isLive(nowMs: number): boolean {
    return this.#oldestPending === 0 || nowMs - this.#oldestPending < this.timeoutMs;
  }

  /**
   * Readiness (/healthz): synced at least once, not stale, and this Node eligible. With
   * `requireSynced: false` (/livez) only staleness counts: neither the first sync nor the Node.
   */
  status(nowMs: number, options: { requireSynced: boolean } = { requireSynced: true }): HealthStatus {
    const stale = !this.isLive(nowMs);
    const notSynced = options.requireSynced && this.#lastUpdated === 0;
    const ineligible = options.requireSynced && !this.#nodeEligible;
    const healthy = !stale && !notSynced && !ineligible;
    return {
      healthy,
      reason: stale ? 'stale' : notSynced ? 'not-synced' : ineligible ? 'node-ineligible' : 'ok',
      nodeEligible: this.#nodeEligible,
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
