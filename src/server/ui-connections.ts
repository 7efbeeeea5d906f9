// /ui/api/connections: the connection table for the console, one page of it, with the filters the console
// offers beyond /debug/connections' (endpoint, protocol) and an offset. The rows are the very records
// /debug/connections serves, so the console shows nothing that endpoint does not. Pure: filters and pages
// a listing (the table's, or, with worker processes, the merged one).
import type {
  ConnectionListing,
  ConnectionRecord,
  ConnectionState,
  ListOptions,
} from '../trace/connection-table.ts';
import type { AppProtocol } from '../trace/sniff/types.ts';

/** What the protocol filter takes: the transport, or what the sniffer recognised. */
export const PROTOCOL_FILTERS: readonly string[] = [
  'TCP',
  'UDP',
  'http1',
  'h2c',
  'tls',
  'dns',
  'postgres',
  'mysql',
  'redis',
  'unknown',
] satisfies readonly ('TCP' | 'UDP' | AppProtocol)[];

export type ConnectionsQuery = {
  /** As /debug/connections: `ns`, `ns/name` or `ns/name:port`. */
  readonly service: string | undefined;
  /** As /debug/connections: an IP, or `ip:port`. */
  readonly client: string | undefined;
  /** An IP or `ip:port`: connections relayed to it or that tried it and failed. */
  readonly endpoint: string | undefined;
  /** One of PROTOCOL_FILTERS. */
  readonly protocol: string | undefined;
  readonly state: ConnectionState | undefined;
  readonly offset: number;
  readonly limit: number;
};

export type UiConnectionsBody = {
  /** Active ones first, newest first; then closed ones, newest first. */
  rows: ConnectionRecord[];
  /** Matches before paging. */
  matched: { active: number; recent: number };
  offset: number;
  limit: number;
  /** Closed records pushed out of the table's ring since start. */
  dropped: number;
};

/** What to ask the table for: its own filters (service, client, state) apply before any record is built. */
export function listOptionsOf(query: ConnectionsQuery): ListOptions {
  return { service: query.service, client: query.client, state: query.state };
}

/** One page of the connections of `listing` (listed with listOptionsOf(query)) that match `query`. */
export function uiConnections(listing: ConnectionListing, query: ConnectionsQuery): UiConnectionsBody {
  const keep = (r: ConnectionRecord) =>
    (query.endpoint === undefined || matchesEndpoint(r, query.endpoint)) &&
    (query.protocol === undefined || matchesProtocol(r, query.protocol));
  const active = listing.active.filter(keep);
  const recent = listing.recent.filter(keep);
  const all = active.length + recent.length;
  const from = Math.min(query.offset, all);
  const to = Math.min(all, from + query.limit);
  const rows: ConnectionRecord[] = [];
  for (let i = from; i < to; i++) rows.push(i < active.length ? active[i]! : recent[i - active.length]!);
  return {
    rows,
    matched: { active: active.length, recent: recent.length },
    offset: query.offset,
    limit: query.limit,
    dropped: listing.dropped,
  };
}

/** `ip:port` of the endpoint or of a failed attempt equals `filter`, or its IP does. */
export function matchesEndpoint(r: ConnectionRecord, filter: string): boolean {
  if (r.endpoint !== null && sameEndpoint(r.endpoint, filter)) return true;
  return r.attempts.some((a) => sameEndpoint(a.endpoint, filter));
}

function sameEndpoint(key: string, filter: string): boolean {
  if (key === filter) return true;
  const colon = key.lastIndexOf(':');
  const ip = key.startsWith('[') ? key.slice(1, colon - 1) : key.slice(0, colon);
  return ip === filter;
}

export function matchesProtocol(r: ConnectionRecord, filter: string): boolean {
  if (filter === 'TCP' || filter === 'UDP') return r.protocol === filter;
  return r.app?.protocol === filter;
}
