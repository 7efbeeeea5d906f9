// What a listener needs to know about its service port, read once per connection: the balancer of the
// client's family (updated in place by the proxier), counters (plain fields, read by metrics on scrape)
// and the observer.
import type { Balancer } from '../loadbalancer/balancer.ts';
import type { ServicePortName } from '../state/service-port.ts';
import type { ConnectionObserver } from './observer.ts';
import type { ProxyProtocolVersion } from './proxy-protocol.ts';

export type ServicePortStats = {
  /** TCP connections accepted / UDP sessions opened. */
  accepted: number;
  active: number;
  bytesFromClients: number;
  bytesToClients: number;
  /** Connections or datagrams turned away because the service port had no endpoints. */
  noEndpoints: number;
  /** Connections that failed after every connect attempt. */
  connectFailed: number;
  /** Failed connect attempts by reason (refused, timeout, unreachable, error); countConnectFailure. */
  connectFailures: Readonly<Record<string, number>>;
  /** Endpoint picks by endpoint key (`ip:port`); countPick. */
  picks: ReadonlyMap<string, number>;
  udpSessionsEvicted: number;
  /** UDP sessions closed because their endpoint left the balancer (the next datagram picks again). */
  udpSessionsEndpointRemoved: number;
  /** Endpoints ejected by passive outlier detection. */
  ejections: number;
  /**
   * Connections closed at accept, and UDP sessions not opened, by reason: `limit`
   * (--max-connections-per-service), `fd-exhausted` (shed while file descriptors ran out) or `loop`
   * (it came back from this proxy's own sockets too many times: own-traffic.ts); countRejected.
   */
  rejected: Readonly<Record<string, number>>;
};

/**
 * What the counters by key of every new ServicePortStats start as, shared: the first count gives a
 * service port its own (an idle one's three empty collections were 0.4 KB).
 */
const NO_COUNTS: Readonly<Record<string, number>> = Object.freeze({});
const NO_PICKS: ReadonlyMap<string, number> = new Map();

export function newServicePortStats(): ServicePortStats {
  return {
    accepted: 0,
    active: 0,
    bytesFromClients: 0,
    bytesToClients: 0,
    noEndpoints: 0,
    connectFailed: 0,
    connectFailures: NO_COUNTS,
    picks: NO_PICKS,
    udpSessionsEvicted: 0,
    udpSessionsEndpointRemoved: 0,
    ejections: 0,
    rejected: NO_COUNTS,
  };
}

/**
 * The counters of every TCP service port that has had no connection yet: all zero, frozen, shared.
 * What reads them (metrics, debug pages) sees the zeros a service port of its own would show.
 */
export const IDLE_STATS: ServicePortStats = Object.freeze(newServicePortStats());

/**
 * The counters of `context` to count on: its own from now on, made on first use (in its owner's, for
 * a context that shares them, so both see the same).
 */
export function liveStats(context: ServicePortContext): ServicePortStats {
  if (context.stats !== IDLE_STATS) return context.stats;
  const owner = context.statsOwner ?? context;
  if (owner.stats === IDLE_STATS) owner.stats = newServicePortStats();
  context.stats = owner.stats;
  return context.stats;
}

/** One balancer per client family; a single-stack service port has the same instance under both. */
export type FamilyBalancers<B extends Balancer = Balancer> = { readonly IPv4: B; readonly IPv6: B };

/** The relays read a Balancer; the proxier, which owns them, builds contexts of its concrete balancer. */
export type ServicePortContext<B extends Balancer = Balancer> = {
  readonly name: ServicePortName;
  readonly protocol: 'TCP' | 'UDP';
  /** The primary family's balancer: what status, metrics and debug pages read. */
  readonly balancer: B;
  /**
   * What the relays pick from, by the client's family. NAT never changes the family, so the client's
   * family is the original destination's: IPv4 ClusterIP traffic only reaches IPv4 endpoints.
   */
  readonly balancers: FamilyBalancers<B>;
  /**
   * Its counters. A TCP service port's start as IDLE_STATS, shared and frozen: its listener gives it
   * its own at its first connection (liveStats), so an idle one holds none (~0.12 KiB).
   */
  stats: ServicePortStats;
  /** The context whose counters this one shares (a service port's second listener: its primary's). */
  readonly statsOwner?: ServicePortContext<B>;
  observer: ConnectionObserver;
  /**
   * The PROXY protocol header new TCP connections send their endpoint first, and what it says of
   * the service port; undefined: none. Swapped by the proxier when the Service changes.
   */
  proxyProtocol?: ProxyProtocolSettings | undefined;
};

/** What a PROXY protocol header says of the service port besides the client (original-destination.ts). */
export type ProxyProtocolSettings = {
  readonly version: ProxyProtocolVersion;
  /** The ClusterIP of each family ('' for a family the service port has none of). */
  readonly clusterIPs: { readonly IPv4: string; readonly IPv6: string };
  readonly port: number;
  readonly nodePort: number;
};

/** Counts one rejected connection or session under `reason`. */
export function countRejected(stats: ServicePortStats, reason: string): void {
  stats.rejected = counted(stats.rejected, reason);
}

/** Counts one failed connect attempt under `reason`. */
export function countConnectFailure(stats: ServicePortStats, reason: string): void {
  stats.connectFailures = counted(stats.connectFailures, reason);
}

/** `counts` (its own, the shared empty one replaced) with one more under `reason`. */
function counted(counts: Readonly<Record<string, number>>, reason: string): Record<string, number> {
  const own: Record<string, number> = counts === NO_COUNTS ? {} : (counts as Record<string, number>);
  own[reason] = (own[reason] ?? 0) + 1;
  return own;
}

export function countPick(stats: ServicePortStats, key: string): void {
  let picks = stats.picks as Map<string, number>;
  if (picks === NO_PICKS) {
    picks = new Map();
    stats.picks = picks;
  }
  picks.set(key, (picks.get(key) ?? 0) + 1);
}

/**
 * Forgets the picks of endpoints that are gone, so their series leave the metrics: called when the
 * endpoint set changed, with what every balancer of the service port (both lists) now holds.
 * O(picks); a gone endpoint that comes back counts from 0 again (a counter reset, as a restart is).
 */
export function retainPicks(stats: ServicePortStats, current: ReadonlySet<string>): void {
  if (stats.picks === NO_PICKS) return;
  const picks = stats.picks as Map<string, number>;
  for (const key of picks.keys()) if (!current.has(key)) picks.delete(key);
}
