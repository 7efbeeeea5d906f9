// The sync loop: when the proxier syncs. A change to Services goes through the bounded-frequency runner
// (--iptables-min-sync-period, --iptables-sync-period, retry and a full sync after a failure); an
// endpoint-only change goes to the balancers at once (the fast path). Health and metrics learn of it
// through callbacks: this file knows neither.

import type { Clock } from '../lib/clock.ts';
import { realClock } from '../lib/clock.ts';
import type { Logger } from '../lib/log.ts';
import type { Snapshot } from '../state/snapshot.ts';
import { BoundedFrequencyRunner } from './bounded-frequency-runner.ts';
import type { Proxier, SyncResult } from './proxier.ts';

/** What the loop reads of the state: whether a change is pending, and the change counters. */
export interface SyncLoopSource {
  readonly isInitialized: boolean;
  readonly onlyEndpointsPending: boolean;
  readonly pendingServiceChanges: number;
  readonly pendingEndpointChanges: number;
  /** Handler calls since start (the metrics' change counters). */
  readonly serviceChangesTotal: number;
  readonly endpointChangesTotal: number;
}

/** A checkout the proxier applied (a sync, or the endpoint fast path). */
export type AppliedChanges = {
  readonly snapshot: Snapshot;
  readonly nowMs: number;
  /** Handler calls taken since the previous report. */
  readonly serviceChanges: number;
  readonly endpointChanges: number;
};

/** How the loop reports; every callback is optional. Thrown errors are the caller's bug, not caught. */
export type SyncLoopCallbacks = {
  /** A sync was asked for (healthz queuedUpdate). */
  onQueued?(nowMs: number): void;
  /** A sync is about to check the state out (healthz: changes queued from now on are not in it). */
  onSyncStarted?(): void;
  /** A checkout was applied, by a sync or by the fast path (change counters, programming latency). */
  onApplied?(applied: AppliedChanges): void;
  /** A sync finished; awaited before the runner allows the next one. */
  onSynced?(result: SyncResult, snapshot: Snapshot | undefined, nowMs: number): void | Promise<void>;
  /** The fast path applied endpoint changes without a sync. */
  onEndpointsApplied?(snapshot: Snapshot): void;
  /** A sync threw; the loop asks for a full sync and the runner retries. */
  onSyncFailed?(err: unknown): void;
};

export type SyncLoopOptions = {
  /** --iptables-min-sync-period */
  minSyncPeriodMs: number;
  /** --iptables-sync-period: at least one sync per period. */
  syncPeriodMs: number;
};

export type SyncLoopDeps = {
  proxier: Pick<
    Proxier,
    | 'sync'
    | 'applyEndpointChanges'
    | 'requestFullSync'
    | 'lastSyncMs'
    | 'syncing'
    | 'portalsPending'
    | 'snapshot'
    | 'releaseChanges'
  >;
  source: SyncLoopSource;
  log: Logger;
  clock?: Clock;
  /** Runs the fast path after the current tick (default setImmediate: a watch chunk carries several events). */
  defer?: (fn: () => void) => void;
};

export class SyncLoop {
  /** The runner around Proxier.sync(); start() and stop() are the loop's lifecycle. */
  readonly runner: BoundedFrequencyRunner;
  readonly #proxier: SyncLoopDeps['proxier'];
  readonly #source: SyncLoopSource;
  readonly #log: Logger;
  readonly #clock: Clock;
  readonly #defer: (fn: () => void) => void;
  readonly #on: SyncLoopCallbacks;
  /** An endpoint-only change is waiting for the next tick (see onChange). */
  #endpointsQueued = false;
  #stopped = false;
  /** The source's change totals already reported. */
  #countedServiceChanges = 0;
  #countedEndpointChanges = 0;

  constructor(options: SyncLoopOptions, deps: SyncLoopDeps, callbacks: SyncLoopCallbacks = {}) {
    this.#proxier = deps.proxier;
    this.#source = deps.source;
    this.#log = deps.log;
    this.#clock = deps.clock ?? realClock;
    this.#defer = deps.defer ?? ((fn) => setImmediate(fn));
    this.#on = callbacks;
    this.runner = new BoundedFrequencyRunner(
      'userspace-proxy-sync-runner',
      () => this.#sync(),
      options.minSyncPeriodMs,
      options.syncPeriodMs,
      { clock: deps.clock, onError: (err) => this.#failed(err) },
    );
  }

  /** Starts the runner: a first sync now, then at least one per sync period. */
  start(): void {
    this.runner.start();
  }

  /**
   * Stops the runner; resolves when a sync in progress has finished. Changes arriving afterwards (a
   * source still closing) are neither applied nor reported.
   */
  stop(): Promise<void> {
    this.#stopped = true;
    return this.runner.stop();
  }

  /**
   * A change is pending in the source. Endpoint-only changes are applied straight away (once per
   * tick); everything else goes through the rate-limited runner.
   */
  onChange(): void {
    if (this.#stopped) return;
    const proxier = this.#proxier;
    if (this.#source.onlyEndpointsPending && proxier.lastSyncMs !== 0 && !proxier.syncing) {
      if (!this.#endpointsQueued) {
        this.#endpointsQueued = true;
        this.#defer(() => this.#applyEndpointChanges());
      }
      return;
    }
    this.queue();
  }

  /** Asks the runner for a sync (after the rate limit); reported to onQueued. */
  queue(): void {
    this.#on.onQueued?.(this.#clock.now());
    if (this.#source.isInitialized) this.runner.run();
  }

  #applyEndpointChanges(): void {
    this.#endpointsQueued = false;
    if (this.#stopped) return;
    const snapshot = this.#proxier.applyEndpointChanges();
    if (snapshot === undefined) {
      // A Service changed meanwhile, or a sync started: the runner takes it all.
      if (this.#source.pendingEndpointChanges > 0 || this.#source.pendingServiceChanges > 0) this.queue();
      return;
    }
    this.#applied(snapshot);
    // A list that became empty or stopped being empty changes the rules (REJECT / DROP): a sync.
    if (this.#proxier.portalsPending) this.queue();
    this.#on.onEndpointsApplied?.(snapshot);
    this.#proxier.releaseChanges();
  }

  async #sync(): Promise<void> {
    // proxier.sync() checks the state out synchronously, before its first await.
    this.#on.onSyncStarted?.();
    const result = await this.#proxier.sync();
    if (result === undefined) return;
    const now = this.#clock.now();
    const snapshot = this.#proxier.snapshot;
    if (snapshot !== undefined) this.#applied(snapshot, now);
    await this.#on.onSynced?.(result, snapshot, now);
    // Told to everyone: the change sets need not stay until the next change.
    this.#proxier.releaseChanges();
    if (this.#log.isLevelEnabled('debug')) this.#log.debug({ ...result }, 'Synced');
  }

  #applied(snapshot: Snapshot, nowMs = this.#clock.now()): void {
    const { serviceChangesTotal, endpointChangesTotal } = this.#source;
    const serviceChanges = serviceChangesTotal - this.#countedServiceChanges;
    const endpointChanges = endpointChangesTotal - this.#countedEndpointChanges;
    this.#countedServiceChanges = serviceChangesTotal;
    this.#countedEndpointChanges = endpointChangesTotal;
    this.#on.onApplied?.({ snapshot, nowMs, serviceChanges, endpointChanges });
  }

  #failed(err: unknown): void {
    this.#on.onSyncFailed?.(err);
    this.#proxier.requestFullSync();
    this.#log.error({ err }, 'Sync failed');
  }
}
