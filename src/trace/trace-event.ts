// What a trace event is: the shapes /debug/trace streams, the raw form the tracer records on the data path
// (a table entry and a marker or sniffer event, no allocation), and the one place a raw event becomes an
// object and an NDJSON line. Pure: no I/O.
import { jsonSafe } from '../lib/printable.ts';
import type { ConnectionRecord, TableEntry } from './connection-table.ts';
import type { SniffEvent } from './sniff/types.ts';

/** Who an event is about; every trace event carries these. */
export type TraceEventConnection = {
  readonly id: number;
  readonly service: string;
  readonly protocol: 'TCP' | 'UDP';
  readonly client: string;
  readonly endpoint: string | null;
};

export type OpenedEvent = TraceEventConnection & { readonly type: 'opened'; readonly atMs: number };

export type ClosedEvent = TraceEventConnection & {
  readonly type: 'closed';
  readonly atMs: number;
  readonly startMs: number;
  readonly durationMs: number;
  readonly closeReason: ConnectionRecord['closeReason'];
  readonly bytesFromClient: number;
  readonly bytesToClient: number;
  readonly attempts: ConnectionRecord['attempts'];
  readonly app: ConnectionRecord['app'];
};

// DNS events carry the message ID as `id`; in a trace event `id` is the connection's, so it is `dnsId`.
type WithDnsId<E> = E extends { readonly id: number } ? Omit<E, 'id'> & { readonly dnsId: number } : E;
/** A sniffer event as the trace stream shows it. */
export type TraceSniffEvent = WithDnsId<SniffEvent>;

/** One line of /debug/trace: a connection opened or closed, or a request the sniffer saw. */
export type TraceEvent = OpenedEvent | ClosedEvent | (TraceEventConnection & TraceSniffEvent);

/** The line that stands for events a subscriber did not get (too slow, or over the tracer's budget). */
export type DroppedEvent = { readonly type: 'dropped'; readonly count: number; readonly atMs: number };

// Raw events as recorded: a sniffer event, or one of these shared markers read back from the entry.
export const OPENED = { type: 'opened' } as const;
export const CLOSED = { type: 'closed' } as const;
export type RawEvent = SniffEvent | typeof OPENED | typeof CLOSED;

function connectionOf(e: TableEntry): TraceEventConnection {
  return { id: e.id, service: e.service, protocol: e.protocol, client: e.client, endpoint: e.endpoint };
}

/** The event object of a raw event (built off the data path, when someone reads it). */
export function toTraceEvent(entry: TableEntry, ev: RawEvent): TraceEvent {
  if (ev === OPENED) return { type: 'opened', atMs: entry.startMs, ...connectionOf(entry) };
  if (ev === CLOSED) {
    const r = entry.record!;
    return {
      type: 'closed',
      atMs: r.endMs ?? r.startMs,
      ...connectionOf(entry),
      endpoint: r.endpoint,
      startMs: r.startMs,
      durationMs: r.durationMs,
      closeReason: r.closeReason,
      bytesFromClient: r.bytesFromClient,
      bytesToClient: r.bytesToClient,
      attempts: r.attempts,
      app: r.app,
    };
  }
  const s = ev as SniffEvent;
  const head = { type: s.type, atMs: s.atMs, ...connectionOf(entry) };
  if (s.type === 'dns-query' || s.type === 'dns-response') {
    const { id, ...rest } = s;
    return { ...head, ...rest, dnsId: id } as TraceEvent;
  }
  return { ...head, ...s } as TraceEvent;
}

/** One NDJSON line (with its newline), safe on a terminal (see jsonSafe: the values are exact). */
export function traceLine(event: TraceEvent | DroppedEvent): string {
  return `${jsonSafe(JSON.stringify(event))}\n`;
}

/** The line for `count` events a subscriber did not get. */
export function droppedLine(count: number, atMs: number): string {
  return traceLine({ type: 'dropped', count, atMs });
}
