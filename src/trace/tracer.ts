// The tracer: decides per service port what watching a connection costs (nothing; a table entry and an
// access-log line; or also a protocol sniffer on its first bytes) and fans events out to a small ring of
// recent events and to bounded subscribers. Nothing here throws into the relay or buffers without limit.
import type { Logger } from '../lib/log.ts';
import type { ConnectionInfo, ConnectionObserver } from '../relay/observer.ts';
import { noopObserver } from '../relay/observer.ts';
import type { ServicePort, TraceMode } from '../state/service-port.ts';
import type { ConnectionFilter, ConnectionRecord, ConnectionTable, TableEntry } from './connection-table.ts';
import { DEFAULT_MAX_REQUESTS, sniffLimits, startSniffer } from './sniff/classify.ts';
import type { SniffEvent, SniffLimits } from './sniff/types.ts';

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

export type TracerOptions = {
  /** The default for service ports without a trace annotation (--trace). */
  mode: TraceMode;
  table: ConnectionTable;
  /** One line per closed connection (of traced service ports) when set. */
  accessLog?: Logger | undefined;
  /** Requests (HTTP exchanges, DNS queries, Redis commands) kept per connection; default 16. */
  maxRequests?: number;
  /** Events kept for `/debug/trace?follow=false`; default 1000, 0 keeps none. */
  recentEvents?: number;
  /** Events queued per subscriber before it drops; default 1024. */
  maxPending?: number;
  now?: () => number;
};

/** A live event stream. Delivery is asynchronous (batched on setImmediate), never on the data path. */
export interface Subscription {
  /** Events not delivered because the subscriber's queue was full. */
  readonly dropped: number;
  /** Stops delivery; events queue (up to maxPending, then drop) until resume(). */
  pause(): void;
  resume(): void;
  /** Idempotent. */
  close(): void;
}

export type TracerStats = {
  /** Events emitted (opened, closed, sniffer events) since start. */
  events: number;
  subscribers: number;
  /** Events dropped by slow subscribers since start. */
  droppedEvents: number;
};

export interface Tracer {
  readonly mode: TraceMode;
  readonly table: ConnectionTable;
  /** The observer for a service port: its `trace` annotation, else the default mode. Shared instances. */
  observerFor(servicePort: Pick<ServicePort, 'trace'>): ConnectionObserver;
  /** Live events matching `filter`; `onEvent` must not block (pause() when the sink is full). */
  subscribe(filter: ConnectionFilter, onEvent: (event: TraceEvent) => void): Subscription;
  /** Buffered events matching `filter`, oldest first: the newest `limit` of them. */
  recentEvents(filter?: ConnectionFilter, limit?: number): TraceEvent[];
  stats(): TracerStats;
}

const DEFAULT_RECENT_EVENTS = 1000;
const DEFAULT_MAX_PENDING = 1024;

// Raw events as stored: a sniffer event, or one of these shared markers read back from the entry.
const OPENED = { type: 'opened' } as const;
const CLOSED = { type: 'closed' } as const;
type RawEvent = SniffEvent | typeof OPENED | typeof CLOSED;

function connectionOf(e: TableEntry): TraceEventConnection {
  return { id: e.id, service: e.service, protocol: e.protocol, client: e.client, endpoint: e.endpoint };
}

/** Builds the event object only when someone reads it (off the data path). */
function toTraceEvent(entry: TableEntry, ev: RawEvent): TraceEvent {
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

const noop = (): void => {};

class Subscriber implements Subscription {
  readonly #tracer: TracerImpl;
  readonly #filter: ConnectionFilter;
  readonly #onEvent: (event: TraceEvent) => void;
  readonly #max: number;
  #entries: TableEntry[] = [];
  #events: RawEvent[] = [];
  #head = 0;
  #paused = false;
  #scheduled = false;
  #closed = false;
  dropped = 0;
  readonly #flush = (): void => this.#deliver();

  constructor(tracer: TracerImpl, filter: ConnectionFilter, onEvent: (e: TraceEvent) => void, max: number) {
    this.#tracer = tracer;
    this.#filter = filter;
    this.#onEvent = onEvent;
    this.#max = max;
  }

  /** On the data path: a filter check and an array push, or a dropped count. */
  offer(entry: TableEntry, ev: RawEvent): void {
    if (!entry.matches(this.#filter)) return;
    if (this.#entries.length - this.#head >= this.#max) {
      this.dropped++;
      this.#tracer.droppedEvents++;
      return;
    }
    this.#entries.push(entry);
    this.#events.push(ev);
    this.#schedule();
  }

  pause(): void {
    this.#paused = true;
  }

  resume(): void {
    this.#paused = false;
    this.#schedule();
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#entries = [];
    this.#events = [];
    this.#head = 0;
    this.#tracer.unsubscribe(this);
  }

  #schedule(): void {
    if (this.#scheduled || this.#paused || this.#closed || this.#head === this.#entries.length) return;
    this.#scheduled = true;
    setImmediate(this.#flush);
  }

  #deliver(): void {
    this.#scheduled = false;
    const entries = this.#entries;
    const events = this.#events;
    while (this.#head < entries.length && !this.#paused && !this.#closed) {
      const i = this.#head++;
      try {
        this.#onEvent(toTraceEvent(entries[i]!, events[i]!));
      } catch {
        // A broken sink ends its own subscription, never the proxy.
        this.close();
      }
    }
    if (this.#closed) return;
    if (this.#head === entries.length) {
      entries.length = 0;
      events.length = 0;
      this.#head = 0;
    } else if (this.#head > 1024) {
      entries.splice(0, this.#head);
      events.splice(0, this.#head);
      this.#head = 0;
    }
  }
}

/** `connections`: a table entry and an access-log line per connection; never sees a byte. */
class TableObserver implements ConnectionObserver {
  readonly wantsData: boolean = false;
  readonly tracer: TracerImpl;

  constructor(tracer: TracerImpl) {
    this.tracer = tracer;
  }

  opened(conn: ConnectionInfo): void {
    this.tracer.opened(conn, false);
  }

  closed(conn: ConnectionInfo): void {
    this.tracer.closed(conn);
  }
}

/**
 * `protocols`: also a sniffer per connection, started by its first bytes and fed until it is done; then
 * the relay stops calling (the TCP relay checks one boolean per chunk; UDP sessions keep calling, at the
 * cost of one field read).
 */
class SniffingObserver extends TableObserver {
  override readonly wantsData: boolean = true;

  override opened(conn: ConnectionInfo): void {
    this.tracer.opened(conn, true);
  }

  clientData(conn: ConnectionInfo, chunk: Buffer): boolean {
    // The table keeps the entry in observerData; a closed connection has none.
    const e = conn.observerData as TableEntry | undefined;
    return e?.sniffing === true && this.tracer.sniff(e, true, chunk);
  }

  endpointData(conn: ConnectionInfo, chunk: Buffer): boolean {
    const e = conn.observerData as TableEntry | undefined;
    return e?.sniffing === true && this.tracer.sniff(e, false, chunk);
  }
}

class TracerImpl implements Tracer {
  readonly mode: TraceMode;
  readonly table: ConnectionTable;
  readonly now: () => number;
  /** Shared by every sniffer; their events go to #sniffed, the entry whose bytes are being fed. */
  readonly #limits: SniffLimits;
  #sniffed: TableEntry | undefined = undefined;
  readonly #maxPending: number;
  readonly #logClosed: (entry: TableEntry) => void;
  readonly #observers: Record<TraceMode, ConnectionObserver>;
  #subscribers: Subscriber[] = [];
  // The recent-events ring: parallel arrays, so recording an event allocates nothing.
  readonly #ringSize: number;
  readonly #ringEntries: (TableEntry | undefined)[];
  readonly #ringEvents: (RawEvent | undefined)[];
  #ringNext = 0;
  #ringCount = 0;
  events = 0;
  droppedEvents = 0;

  constructor(options: TracerOptions) {
    this.mode = options.mode;
    this.table = options.table;
    this.now = options.now ?? Date.now;
    // Sniffers emit synchronously from the feeding call: #sniffed is the entry being fed.
    this.#limits = sniffLimits({
      maxRequests: options.maxRequests ?? DEFAULT_MAX_REQUESTS,
      onEvent: (ev) => this.#emit(this.#sniffed!, ev),
    });
    this.#maxPending = Math.max(1, options.maxPending ?? DEFAULT_MAX_PENDING);
    const log = options.accessLog;
    // The record is built only when there is an access log to write it to.
    this.#logClosed = log === undefined ? noop : (entry) => log.info(entry.record, 'Connection closed');
    this.#ringSize = Math.max(0, Math.floor(options.recentEvents ?? DEFAULT_RECENT_EVENTS));
    this.#ringEntries = new Array(this.#ringSize);
    this.#ringEvents = new Array(this.#ringSize);
    this.#observers = {
      none: noopObserver,
      connections: new TableObserver(this),
      protocols: new SniffingObserver(this),
    };
  }

  // An arrow field so that `observerFor: tracer.observerFor` can be handed to the proxier as is.
  readonly observerFor = (servicePort: Pick<ServicePort, 'trace'>): ConnectionObserver =>
    this.#observers[servicePort.trace ?? this.mode];

  opened(conn: ConnectionInfo, sniff: boolean): void {
    const entry = this.table.open(conn);
    if (sniff) entry.sniff();
    this.#emit(entry, OPENED);
  }

  /** Feeds a chunk to the entry's sniffer (starting it on the first bytes); returns whether it wants more. */
  sniff(entry: TableEntry, fromClient: boolean, chunk: Buffer): boolean {
    this.#sniffed = entry;
    const s = entry.sniffer;
    if (s === undefined) {
      const transport = entry.protocol === 'UDP' ? 'udp' : 'tcp';
      entry.sniffer = startSniffer(this.#limits, transport, fromClient, chunk, this.now());
    } else if (fromClient) s.onClientData(chunk, this.now());
    else s.onEndpointData(chunk, this.now());
    this.#sniffed = undefined;
    if (entry.sniffer?.done) entry.sniffing = false;
    return entry.sniffing;
  }

  closed(conn: ConnectionInfo): void {
    const entry = this.table.close(conn);
    this.#emit(entry, CLOSED);
    this.#logClosed(entry);
  }

  subscribe(filter: ConnectionFilter, onEvent: (event: TraceEvent) => void): Subscription {
    const sub = new Subscriber(this, filter, onEvent, this.#maxPending);
    // Copy on write: #emit iterates the array without guarding against changes mid-loop.
    this.#subscribers = [...this.#subscribers, sub];
    return sub;
  }

  unsubscribe(sub: Subscriber): void {
    this.#subscribers = this.#subscribers.filter((s) => s !== sub);
  }

  recentEvents(filter: ConnectionFilter = {}, limit = Number.POSITIVE_INFINITY): TraceEvent[] {
    const out: TraceEvent[] = [];
    const size = this.#ringSize;
    for (let i = 1; i <= this.#ringCount && out.length < limit; i++) {
      const at = (this.#ringNext - i + size) % size;
      const entry = this.#ringEntries[at]!;
      if (entry.matches(filter)) out.push(toTraceEvent(entry, this.#ringEvents[at]!));
    }
    return out.reverse();
  }

  stats(): TracerStats {
    return { events: this.events, subscribers: this.#subscribers.length, droppedEvents: this.droppedEvents };
  }

  #emit(entry: TableEntry, ev: RawEvent): void {
    this.events++;
    const size = this.#ringSize;
    if (size > 0) {
      const at = this.#ringNext;
      this.#ringEntries[at] = entry;
      this.#ringEvents[at] = ev;
      this.#ringNext = at + 1 === size ? 0 : at + 1;
      if (this.#ringCount < size) this.#ringCount++;
    }
    const subs = this.#subscribers;
    for (let i = 0; i < subs.length; i++) subs[i]!.offer(entry, ev);
  }
}

/**
 * The tracer. `observerFor(servicePort)` returns one of three shared observers by the port's `trace`
 * annotation (else `mode`): `none` → noopObserver (no entry, no cost); `connections` → a table entry,
 * opened/closed events and an access-log line, `wantsData: false`; `protocols` → also a sniffer per
 * connection fed from clientData/endpointData until it is done, with its per-request events.
 */
export function createTracer(options: TracerOptions): Tracer {
  return new TracerImpl(options);
}
