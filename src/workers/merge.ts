// What the processes of one proxy (--workers) report, made one: counters of each service port summed,
// connection listings merged newest first. Pure.
import type { ServicePortStats } from '../relay/service-context.ts';
import type { ConnectionListing, ConnectionRecord } from '../trace/connection-table.ts';

/** `own` plus every other process's counters of the same service port (a new object; `own` is untouched). */
export function mergeStats(own: ServicePortStats, others: readonly ServicePortStats[]): ServicePortStats {
  if (others.length === 0) return own;
  const connectFailures = { ...own.connectFailures };
  const picks = new Map(own.picks);
  const rejected = { ...own.rejected };
  const out: ServicePortStats = { ...own, connectFailures, picks, rejected };
  for (const s of others) {
    out.accepted += s.accepted;
    out.active += s.active;
    out.bytesFromClients += s.bytesFromClients;
    out.bytesToClients += s.bytesToClients;
    out.noEndpoints += s.noEndpoints;
    out.connectFailed += s.connectFailed;
    out.udpSessionsEvicted += s.udpSessionsEvicted;
    out.udpSessionsEndpointRemoved += s.udpSessionsEndpointRemoved;
    out.ejections += s.ejections;
    addCounts(connectFailures, s.connectFailures);
    addCounts(rejected, s.rejected);
    for (const [k, n] of s.picks) picks.set(k, (picks.get(k) ?? 0) + n);
  }
  return out;
}

function addCounts(into: Record<string, number>, from: Readonly<Record<string, number>>): void {
  for (const [k, n] of Object.entries(from)) into[k] = (into[k] ?? 0) + n;
}

/** One listing of several processes' (each newest first): newest first, `limit` of each list. */
export function mergeListings(listings: readonly ConnectionListing[], limit?: number): ConnectionListing {
  if (listings.length === 1) return listings[0]!;
  const newest = (a: ConnectionRecord, b: ConnectionRecord) => b.startMs - a.startMs || b.id - a.id;
  const max = limit ?? Number.POSITIVE_INFINITY;
  return {
    active: listings
      .flatMap((l) => l.active)
      .sort(newest)
      .slice(0, max),
    recent: listings
      .flatMap((l) => l.recent)
      .sort((a, b) => (b.endMs ?? 0) - (a.endMs ?? 0) || newest(a, b))
      .slice(0, max),
    totals: {
      active: listings.reduce((n, l) => n + l.totals.active, 0),
      recent: listings.reduce((n, l) => n + l.totals.recent, 0),
    },
    dropped: listings.reduce((n, l) => n + l.dropped, 0),
  };
}
