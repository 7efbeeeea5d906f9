// The tracer: decides per service port what watching a connection costs (nothing; a table entry and an
// access-log line; or also a protocol sniffer on its first bytes) and hands events to a small ring of
// recent events and to the live stream of its (capped) subscribers. Nothing here throws into the relay or
// buffers without limit.
import type { Logger } from '../lib/log.ts';
import type { ConnectionInfo, ConnectionObserver } from '../relay/observer.ts';
import { noopObserver } from '../relay/observer.ts';
import type { ServicePort, TraceMode } from '../state/service-port.ts';
import type { ConnectionFilter, ConnectionTable, TableEntry } from './connection-table.ts';
import type { EventStreamStats, LineSink, Subscription } from './event-stream.ts';
import { EventStream } from './event-stream.ts';
import { DEFAULT_MAX_REQUESTS, sniffLimits, startSniffer } from './sniff/classify.ts';
import type { SniffLimits } from './sniff/types.ts';
import type { RawEvent, TraceEvent } from './trace-event.ts';
import { CLOSED, OPENED, toTraceEvent, traceLine } from './trace-event.ts';

export type { LineSink, Subscription } from './event-stream.ts';
export type {
  ClosedEvent,
  DroppedEvent,
  OpenedEvent,
  TraceEvent,
  TraceEventConnection,
  TraceSniffEvent,
} from './trace-event.ts';

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
  /** Subscribers at once (/debug/trace followers); past it subscribe() returns undefined. Default 32. */
  maxSubscribers?: number;
  /** How often events are handed to subscribers, in one batch; default 50 ms. */
  flushIntervalMs?: number;
  /**
   * The share of time the live stream may spend building and writing events for subscribers, all of them
   * together (what does not fit is dropped, and counted); default 0.005, 5 ms a second, whatever the load
   * and however many follow.
   */
  maxStreamCpuShare?: number;
  now?: () => number;
};

export type TracerStats = EventStreamStats & {
  /** Events emitted (opened, closed, sniffer events) since start. */
  events: number;
};

export interface Tracer {
  readonly mode: TraceMode;
  readonly table: ConnectionTable;
  /** The observer for a service port: its `trace` annotation, else the default mode. Shared instances. */
  observerFor(servicePort: Pick<ServicePort, 'trace'>): ConnectionObserver;
  /**
   * Live events matching `filter` as objects (shared by every subscriber: read, never change them), a
   * batch at a time; `onEvent` must not block (pause() when its sink is full). Undefined when
   * maxSubscribers are subscribed.
   */
  subscribe(filter: ConnectionFilter, onEvent: (event: TraceEvent) => void): Subscription | undefined;
  /**
   * Live events matching `filter` as NDJSON, a batch at a time, with a `{"type":"dropped","count":n}` line
   * where events were lost. Undefined when maxSubscribers are subscribed. Events recorded before the call
   * are not streamed: read them with recentLines().
   */
  subscribeLines(filter: ConnectionFilter, sink: LineSink): Subscription | undefined;
  /** Buffered events matching `filter`, oldest first: the newest `limit` of them. */
  recentEvents(filter?: ConnectionFilter, limit?: number): TraceEvent[];
  /** The same as NDJSON; each line is serialized once and kept while its event is in the buffer. */
  recentLines(filter?: ConnectionFilter, limit?: number): string;
  stats(): TracerStats;
}

const DEFAULT_RECENT_EVENTS = 1000;
const DEFAULT_MAX_PENDING = 1024;
const DEFAULT_MAX_SUBSCRIBERS = 32;
const DEFAULT_FLUSH_INTERVAL_MS = 50;
// An event's line costs 2-10 µs to build and write (an HTTP connection has four), and the kernel's side of
// the writes, which completes later, as much again: 0.5 % streams 500-2,500 events a second, and 100
// followers cost a saturated proxy about 2 % of its connections (test/integration/trace-followers).
const DEFAULT_MAX_STREAM_CPU_SHARE = 0.005;

const noop = (): void => {};

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
 * the relay stops calling (one boolean per chunk or datagram; a UDP session then leaves JavaScript).
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
  readonly #logClosed: (entry: TableEntry) => void;
  readonly #observers: Record<TraceMode, ConnectionObserver>;
  readonly #stream: EventStream;
  // The recent-events ring: parallel arrays, so recording an event allocates nothing. A line is kept once
  // a reader of the ring has serialized it.
  readonly #ringSize: number;
  readonly #ringEntries: (TableEntry | undefined)[];
  readonly #ringEvents: (RawEvent | undefined)[];
  readonly #ringLines: (string | undefined)[];
  #ringNext = 0;
  #ringCount = 0;
  events = 0;

  constructor(options: TracerOptions) {
    this.mode = options.mode;
    this.table = options.table;
    this.now = options.now ?? Date.now;
    // Sniffers emit synchronously from the feeding call: #sniffed is the entry being fed.
    this.#limits = sniffLimits({
      maxRequests: options.maxRequests ?? DEFAULT_MAX_REQUESTS,
      onEvent: (ev) => this.#emit(this.#sniffed!, ev),
    });
    this.#stream = new EventStream({
      maxPending: options.maxPending ?? DEFAULT_MAX_PENDING,
      maxSubscribers: options.maxSubscribers ?? DEFAULT_MAX_SUBSCRIBERS,
      flushIntervalMs: options.flushIntervalMs ?? DEFAULT_FLUSH_INTERVAL_MS,
      maxCpuShare: options.maxStreamCpuShare ?? DEFAULT_MAX_STREAM_CPU_SHARE,
      now: this.now,
      clock: () => performance.now(),
    });
    const log = options.accessLog;
    // The record is built only when there is an access log to write it to.
    this.#logClosed = log === undefined ? noop : (entry) => log.info(entry.record, 'Connection closed');
    this.#ringSize = Math.max(0, Math.floor(options.recentEvents ?? DEFAULT_RECENT_EVENTS));
    this.#ringEntries = new Array(this.#ringSize);
    this.#ringEvents = new Array(this.#ringSize);
    this.#ringLines = new Array(this.#ringSize);
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

  subscribe(filter: ConnectionFilter, onEvent: (event: TraceEvent) => void): Subscription | undefined {
    return this.#stream.subscribe(filter, onEvent);
  }

  subscribeLines(filter: ConnectionFilter, sink: LineSink): Subscription | undefined {
    return this.#stream.subscribeLines(filter, sink);
  }

  recentEvents(filter: ConnectionFilter = {}, limit = Number.POSITIVE_INFINITY): TraceEvent[] {
    return this.#recent(filter, limit).map((at) =>
      toTraceEvent(this.#ringEntries[at]!, this.#ringEvents[at]!),
    );
  }

  recentLines(filter: ConnectionFilter = {}, limit = Number.POSITIVE_INFINITY): string {
    let text = '';
    for (const at of this.#recent(filter, limit)) {
      let line = this.#ringLines[at];
      if (line === undefined) {
        line = traceLine(toTraceEvent(this.#ringEntries[at]!, this.#ringEvents[at]!));
        this.#ringLines[at] = line;
      }
      text += line;
    }
    return text;
  }

  stats(): TracerStats {
    return { events: this.events, ...this.#stream.stats() };
  }

  /** Ring positions of the newest `limit` events matching `filter`, oldest first. */
  #recent(filter: ConnectionFilter, limit: number): number[] {
    const out: number[] = [];
    const size = this.#ringSize;
    for (let i = 1; i <= this.#ringCount && out.length < limit; i++) {
      const at = (this.#ringNext - i + size) % size;
      if (this.#ringEntries[at]!.matches(filter)) out.push(at);
    }
    return out.reverse();
  }

  #emit(entry: TableEntry, ev: RawEvent): void {
    this.events++;
    const size = this.#ringSize;
    if (size > 0) {
      const at = this.#ringNext;
      this.#ringEntries[at] = entry;
      this.#ringEvents[at] = ev;
      this.#ringLines[at] = undefined;
      this.#ringNext = at + 1 === size ? 0 : at + 1;
      if (this.#ringCount < size) this.#ringCount++;
    }
    this.#stream.record(entry, ev);
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
