// Round robin over a shuffled endpoint list, with ClientIP session affinity (the userspace proxier's
// LoadBalancerRR). One instance per service port, updated in place by the proxier. No I/O, no timers:
// time comes in as `nowMs`. An idle one holds its endpoint list and nothing else: the affinity table is
// made by the first ClientIP pick (10,000 idle service ports kept 10,000 empty maps), the outlier
// detector by the first failed connect (or ejection from another process); its settings are one object
// shared by the balancers made alike.
import type { Endpoint, EndpointKey } from '../state/endpoint.ts';
import type { SessionAffinity } from '../state/service-port.ts';
import { DEFAULT_STICKY_MAX_AGE_SECONDS } from '../state/service-port.ts';
import type { EjectionEvent, OutlierOptions } from './outlier.ts';
import { OutlierDetector } from './outlier.ts';
import { rendezvousPick } from './rendezvous.ts';

type AffinityEntry = { endpoint: Endpoint; lastUsedMs: number };

/** Up to this many endpoints, a set comparison scans the list instead of building a Set. */
const SCAN_MAX = 16;

/** What balancers made with the same arguments share (every balancer of a proxier). */
type Settings = {
  readonly random: () => number;
  /** Passive outlier ejection's settings; undefined = off. */
  readonly outlier: OutlierOptions | undefined;
  /**
   * A client without an affinity entry gets the endpoint rendezvous hashing gives it, not the next in
   * the round: so every worker process (--workers) sends one client to the same endpoint.
   */
  readonly affinityByHash: boolean;
};

let lastSettings: Settings | undefined;

/** The settings of these arguments: those of the last balancer made, when it was made alike. */
function settingsOf(
  random: () => number,
  outlier: OutlierOptions | undefined,
  affinityByHash: boolean,
): Settings {
  const last = lastSettings;
  if (last?.random === random && last.outlier === outlier && last.affinityByHash === affinityByHash)
    return last;
  lastSettings = Object.freeze({ random, outlier, affinityByHash });
  return lastSettings;
}

export class RoundRobinBalancer {
  #endpoints: readonly Endpoint[] = NO_ENDPOINTS;
  #index = 0;
  /** How long a ClientIP affinity entry lives unused; 0: no affinity (sessionAffinity None). */
  #ttlMs = 0;
  /** ClientIP affinity by client IP; undefined until the first ClientIP pick. */
  #sticky: Map<string, AffinityEntry> | undefined;
  readonly #settings: Settings;
  /** The outlier detector: undefined until the first failure (or ejection elsewhere) needs one. */
  #outlier: OutlierDetector | undefined;

  constructor(random: () => number = Math.random, outlier?: OutlierOptions, affinityByHash = false) {
    this.#settings = settingsOf(random, outlier, affinityByHash);
  }

  /**
   * The passive outlier detector; undefined while it has nothing to remember (off, or no connect has
   * failed yet: an idle service port's was 56 bytes of nothing).
   */
  get outlier(): OutlierDetector | undefined {
    return this.#outlier;
  }

  /** The outlier detector, made on first use; undefined when outlier ejection is off. */
  #detector(): OutlierDetector | undefined {
    const options = this.#settings.outlier;
    if (this.#outlier === undefined && options !== undefined) this.#outlier = new OutlierDetector(options);
    return this.#outlier;
  }

  /** The endpoints in visiting order. */
  get endpoints(): readonly Endpoint[] {
    return this.#endpoints;
  }

  get sessionAffinity(): SessionAffinity {
    return this.#ttlMs > 0 ? 'ClientIP' : 'None';
  }

  get stickyEntries(): number {
    return this.#sticky?.size ?? 0;
  }

  /**
   * Sets the affinity type and timeout. A new timeout applies to existing entries too (the legacy
   * proxier kept the old one). Turning affinity off forgets every entry.
   */
  setAffinity(type: SessionAffinity, ttlSeconds: number): void {
    if (type !== 'ClientIP') {
      this.#ttlMs = 0;
      this.#sticky = undefined;
      return;
    }
    this.#ttlMs = (ttlSeconds > 0 ? ttlSeconds : DEFAULT_STICKY_MAX_AGE_SECONDS) * 1000;
  }

  /**
   * Replaces the endpoint set. Returns false (and keeps order, position and affinity) when the set is
   * the same. Otherwise the list is reshuffled, the round-robin position carries on (legacy reset it to 0,
   * which skewed fairness), and affinity entries survive when their endpoint still exists.
   */
  setEndpoints(endpoints: readonly Endpoint[]): boolean {
    if (sameKeys(this.#endpoints, endpoints)) {
      // Same set; pick up changed fields (e.g. conditions) without disturbing the order.
      if (endpoints.length > 0) {
        const byKey = new Map(endpoints.map((e) => [e.key, e]));
        this.#endpoints = this.#endpoints.map((e) => byKey.get(e.key) ?? e);
        if (this.#sticky !== undefined)
          for (const entry of this.#sticky.values())
            entry.endpoint = byKey.get(entry.endpoint.key) ?? entry.endpoint;
      }
      return false;
    }
    const shuffled = endpoints.slice();
    for (let i = shuffled.length - 1; i > 0; i--) {
      const j = Math.floor(this.#settings.random() * (i + 1));
      const t = shuffled[i]!;
      shuffled[i] = shuffled[j]!;
      shuffled[j] = t;
    }
    this.#endpoints = shuffled;
    this.#outlier?.retain(shuffled);
    this.#index = shuffled.length === 0 ? 0 : this.#index % shuffled.length;
    const sticky = this.#sticky;
    if (sticky !== undefined && sticky.size > 0) {
      const byKey = new Map(shuffled.map((e) => [e.key, e]));
      for (const [ip, entry] of sticky) {
        const current = byKey.get(entry.endpoint.key);
        if (current) entry.endpoint = current;
        else sticky.delete(ip);
      }
    }
    return true;
  }

  /**
   * The endpoint for a new connection from `clientIP`, or undefined when there is none. With ClientIP
   * affinity a live entry is reused and refreshed (it does not advance the round robin); `resetAffinity`
   * (set after a failed connect) ignores the entry and overwrites it with the next round-robin pick.
   */
  pick(clientIP: string, nowMs: number, resetAffinity = false): Endpoint | undefined {
    const list = this.#endpoints;
    if (list.length === 0) return undefined;
    const sticky = this.#ttlMs > 0;
    const outlier = this.#outlier !== undefined && this.#outlier.ejectedCount > 0 ? this.#outlier : undefined;
    if (sticky && !resetAffinity) {
      const entry = this.#sticky?.get(clientIP);
      if (
        entry !== undefined &&
        nowMs - entry.lastUsedMs < this.#ttlMs &&
        !outlier?.isEjected(entry.endpoint.key, nowMs)
      ) {
        entry.lastUsedMs = nowMs;
        return entry.endpoint;
      }
    }
    // A reset (a failed connect) takes the round robin: the hashed endpoint is the one that failed.
    let endpoint =
      sticky && this.#settings.affinityByHash && !resetAffinity
        ? rendezvousPick(
            clientIP,
            list,
            outlier === undefined ? undefined : (e) => outlier.isEjected(e.key, nowMs),
          )
        : undefined;
    if (endpoint === undefined) {
      endpoint = list[this.#index]!;
      this.#index = this.#index + 1 === list.length ? 0 : this.#index + 1;
      // Skip ejected endpoints; the detector never ejects them all, so this ends within one lap.
      for (let i = 1; i < list.length && outlier?.isEjected(endpoint.key, nowMs); i++) {
        endpoint = list[this.#index]!;
        this.#index = this.#index + 1 === list.length ? 0 : this.#index + 1;
      }
    }
    if (sticky) {
      this.#sticky ??= new Map();
      const entry = this.#sticky.get(clientIP);
      if (entry !== undefined) {
        entry.endpoint = endpoint;
        entry.lastUsedMs = nowMs;
      } else {
        this.#sticky.set(clientIP, { endpoint, lastUsedMs: nowMs });
      }
    }
    return endpoint;
  }

  /** A connect to `endpoint` failed; returns the ejection it caused, if any. */
  reportFailure(endpoint: Endpoint, nowMs: number): EjectionEvent | undefined {
    return this.#detector()?.failed(endpoint.key, nowMs, this.#endpoints.length);
  }

  /**
   * Another process of this proxy ejected `endpoint` (OutlierDetector.ejectedElsewhere). False when
   * outlier ejection is off or it was not applied here.
   */
  ejectedElsewhere(endpoint: string, untilMs: number, ejections: number, nowMs: number): boolean {
    if (untilMs <= nowMs) return false;
    return (
      this.#detector()?.ejectedElsewhere(endpoint, untilMs, ejections, this.#endpoints.length, nowMs) ?? false
    );
  }

  /** A connect to `endpoint` succeeded. */
  reportSuccess(endpoint: Endpoint): void {
    this.#outlier?.succeeded(endpoint.key);
  }

  /** Forgets `clientIP`'s affinity if it points at `endpoint` (a connect to it failed). */
  resetAffinity(clientIP: string, endpoint: Endpoint): void {
    const entry = this.#sticky?.get(clientIP);
    if (entry !== undefined && entry.endpoint.key === endpoint.key) this.#sticky!.delete(clientIP);
  }

  /** Deletes affinity entries unused for the timeout. Returns how many were removed. */
  cleanupStaleStickySessions(nowMs: number): number {
    const sticky = this.#sticky;
    if (sticky === undefined) return 0;
    let removed = 0;
    for (const [ip, entry] of sticky) {
      if (nowMs - entry.lastUsedMs >= this.#ttlMs) {
        sticky.delete(ip);
        removed++;
      }
    }
    return removed;
  }
}

const NO_ENDPOINTS: readonly Endpoint[] = Object.freeze([]);

/** True when the two lists (each without duplicate keys) hold the same keys, in any order. */
function sameKeys(current: readonly Endpoint[], next: readonly Endpoint[]): boolean {
  if (current.length !== next.length) return false;
  if (current.length <= SCAN_MAX) return next.every((e) => current.some((c) => c.key === e.key));
  const keys = new Set<EndpointKey>(current.map((e) => e.key));
  return next.every((e) => keys.has(e.key));
}
