// What the main process and its workers (--workers) say to each other over the IPC channel (structured
// clone: `serialization: 'advanced'`). The main process owns the sources, the state, the port
// allocation and the rules; it hands each worker the service ports it runs, their endpoints and their
// proxy ports, as a whole table when the worker starts and as deltas after each sync (only what
// changed: one added Service among 10,000 is one entry). Types and pure builders only.
import type { Config } from '../config/config.ts';
import type { ServicePortStats } from '../relay/service-context.ts';
import type { ServicePortEndpoints } from '../state/endpoint.ts';
import type { ServicePort, ServicePortKey } from '../state/service-port.ts';
import type { Snapshot } from '../state/snapshot.ts';
import type { ConnectionFilter, ConnectionListing, ListOptions } from '../trace/connection-table.ts';

/** The first message a worker gets: what it needs to build its proxier. */
export type InitMessage = {
  readonly t: 'init';
  readonly id: number;
  readonly processes: number;
  readonly config: Config;
  /** Where the main process's listeners bind (it falls back to IPv4 where IPv6 is missing). */
  readonly listenHost: string;
};

/**
 * The service ports (`null`: gone), endpoints (`null`: none) and proxy ports (`ns/name:port/PROTO[...]`
 * → port, `null`: gone) that changed. A `full` table replaces what the worker had: its `ports` are all
 * of them.
 */
export type TableMessage = {
  readonly t: 'table';
  readonly full: boolean;
  readonly servicePorts: readonly (readonly [ServicePortKey, ServicePort | null])[];
  readonly endpoints: readonly (readonly [ServicePortKey, ServicePortEndpoints | null])[];
  readonly ports?: readonly (readonly [string, number | null])[];
};

/** Stop accepting, let connections finish within `graceMs`, then exit. */
export type DrainMessage = { readonly t: 'drain'; readonly graceMs: number };

/** Asks for the worker's per service port counters (answered with a StatsReply of the same id). */
export type StatsRequest = { readonly t: 'stats'; readonly id: number };

/** Asks for the worker's connection table (answered with a ConnectionsReply of the same id). */
export type ConnectionsRequest = {
  readonly t: 'connections';
  readonly id: number;
  readonly options: ListOptions;
};

/** Follow the trace stream (`sub` names the follower of the main process's /debug/trace). */
export type TraceFollow = {
  readonly t: 'trace-follow';
  readonly sub: number;
  readonly filter: ConnectionFilter;
};
export type TraceUnfollow = { readonly t: 'trace-unfollow'; readonly sub: number };
/** The buffered trace events (NDJSON), answered with a TraceRecentReply of the same id. */
export type TraceRecentRequest = {
  readonly t: 'trace-recent';
  readonly id: number;
  readonly filter: ConnectionFilter;
  readonly limit: number | undefined;
};

/**
 * An ejection one process decided (outlier detection), for the others: the same endpoint of the same
 * service port skipped until the same time. From a worker to the main process, which passes it on.
 */
export type EjectionMessage = {
  readonly t: 'ejection';
  readonly key: ServicePortKey;
  readonly endpoint: string;
  readonly untilMs: number;
  readonly ejections: number;
};

export type ToWorker =
  | EjectionMessage
  | InitMessage
  | TableMessage
  | DrainMessage
  | StatsRequest
  | ConnectionsRequest
  | TraceFollow
  | TraceUnfollow
  | TraceRecentRequest;

/** The worker is listening on what it was given (after each table it applied). */
export type SyncedMessage = { readonly t: 'synced'; readonly servicePorts: number; readonly failed: number };

export type StatsReply = {
  readonly t: 'stats';
  readonly id: number;
  readonly stats: readonly (readonly [ServicePortKey, ServicePortStats])[];
};

export type ConnectionsReply = {
  readonly t: 'connections';
  readonly id: number;
  readonly listing: ConnectionListing;
};

/** Lines of a followed trace stream, as the worker's stream batched them. */
export type TraceLines = { readonly t: 'trace-lines'; readonly sub: number; readonly data: Uint8Array };
export type TraceRecentReply = { readonly t: 'trace-recent'; readonly id: number; readonly lines: string };

export type FromWorker =
  | EjectionMessage
  | { readonly t: 'ready' }
  | SyncedMessage
  | StatsReply
  | ConnectionsReply
  | TraceLines
  | TraceRecentReply;

/** The whole table of `snapshot`, for a worker that starts. */
export function fullTable(snapshot: Snapshot | undefined, ports: ReadonlyMap<string, number>): TableMessage {
  return {
    t: 'table',
    full: true,
    servicePorts: snapshot === undefined ? [] : [...snapshot.servicePorts],
    endpoints: snapshot === undefined ? [] : [...snapshot.endpoints],
    ports: [...ports],
  };
}

/**
 * What changed in `snapshot` (a checkout the main process applied): its service ports and the proxy
 * ports that changed (after a sync; undefined: gone), or its endpoints (as soon as the main process's
 * balancers have them).
 */
export function tableDelta(
  snapshot: Snapshot,
  part: 'service-ports' | 'endpoints',
  ports?: ReadonlyMap<string, number | undefined>,
): TableMessage {
  return {
    t: 'table',
    full: false,
    servicePorts:
      part === 'service-ports'
        ? [...snapshot.changedServicePorts].map((k) => [k, snapshot.servicePorts.get(k) ?? null] as const)
        : [],
    endpoints:
      part === 'endpoints'
        ? [...snapshot.changedEndpoints].map((k) => [k, snapshot.endpoints.get(k) ?? null] as const)
        : [],
    ...(ports === undefined ? {} : { ports: [...ports].map(([k, port]) => [k, port ?? null] as const) }),
  };
}
