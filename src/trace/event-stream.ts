// The live trace stream: what the tracer's subscribers (the /debug/trace followers) get. On the data path
// an event is only recorded (two array pushes, and only while someone subscribes); a timer hands the batch
// on, where each event's object and NDJSON line are built once for every subscriber, within a time budget
// (maxCpuShare of the time that passes, for building the lines and writing them), so what the stream
// costs is bounded whatever the load, the machine's speed and however many follow. Subscribers are
// capped; a slow one has a bounded queue and counts what it did not get.
import type { ConnectionFilter, TableEntry } from './connection-table.ts';
import type { RawEvent, TraceEvent } from './trace-event.ts';
import { droppedLine, toTraceEvent, traceLine } from './trace-event.ts';

export type EventStreamOptions = {
  /** Subscribers at once; past it subscribe() returns undefined. */
  maxSubscribers: number;
  /** Events queued per subscriber before it drops. */
  maxPending: number;
  /** How often events are handed on, in one batch. */
  flushIntervalMs: number;
  /**
   * The share of time the stream may spend building events (objects, lines, the shared bytes) and writing
   * them, for all subscribers together; what does not fit is dropped, and counted.
   */
  maxCpuShare: number;
  /** Epoch ms, for the events' timestamps. */
  now: () => number;
  /** Monotonic ms with a fraction, for the budget (performance.now). */
  clock: () => number;
};

/** A live event stream. Delivery is batched on a timer, never on the data path. */
export interface Subscription {
  /** Events not delivered: the subscriber's queue was full, or the stream was over its budget. */
  readonly dropped: number;
  /** Stops delivery; events queue (up to maxPending, then drop) until resume(). */
  pause(): void;
  resume(): void;
  /** Idempotent. */
  close(): void;
}

/** Where `subscribeLines` delivers: NDJSON, each event's line serialized once for every subscriber. */
export interface LineSink {
  /**
   * Whether it takes more now. False when its buffer is over its bound (a reader that does not keep up):
   * delivery waits, batches queue up to maxPending events and then drop, until the subscription's resume().
   */
  ready(): boolean;
  write(ndjson: Buffer): void;
}

export type EventStreamStats = {
  subscribers: number;
  maxSubscribers: number;
  /** Subscriptions refused since start because maxSubscribers were subscribed. */
  refusedSubscribers: number;
  /** Events not delivered to a subscriber (counted once per subscriber) since start. */
  droppedEvents: number;
  /** Events not built for anyone because the stream had spent its time budget, since start. */
  overBudgetEvents: number;
};

/** Events collected between two flushes at most (160,000 a second at 50 ms); the rest are dropped. */
const MAX_BATCH = 8192;
/** The budget saves up at most this long a stretch of its share: a burst after a quiet time is whole. */
const BUDGET_WINDOW_MS = 10_000;
/** Bytes of batches queued for one line subscriber at most (beyond what its sink buffers). */
const MAX_QUEUED_BYTES = 1024 * 1024;

/** One event of a flush, shared by every subscriber: its object and line are built at most once. */
class Shared {
  readonly #stream: EventStream;
  readonly entry: TableEntry;
  readonly raw: RawEvent;
  #event: TraceEvent | undefined = undefined;
  #line: string | undefined = undefined;

  constructor(stream: EventStream, entry: TableEntry, raw: RawEvent) {
    this.#stream = stream;
    this.entry = entry;
    this.raw = raw;
  }

  get event(): TraceEvent {
    if (this.#event === undefined) {
      const t = this.#stream.clock();
      this.#event = toTraceEvent(this.entry, this.raw);
      this.#stream.charge(t);
    }
    return this.#event;
  }

  get line(): string {
    if (this.#line === undefined) {
      const event = this.event;
      const t = this.#stream.clock();
      this.#line = traceLine(event);
      this.#stream.charge(t);
    }
    return this.#line;
  }
}

/** NDJSON for one subscriber from one flush: `events` lines, and a dropped line for `dropped` more. */
type Lines = { readonly buf: Buffer; readonly events: number; readonly dropped: number };

/** What one flush hands on: the collected events, each built on first use while the budget lasts. */
class Batch {
  readonly #stream: EventStream;
  readonly entries: TableEntry[];
  readonly #raws: RawEvent[];
  readonly #shared: (Shared | null | undefined)[];
  /** Events recorded but not collected (past MAX_BATCH): lost for every subscriber. */
  readonly lost: number;
  readonly atMs: number;
  #whole: Lines | undefined = undefined;

  constructor(stream: EventStream, entries: TableEntry[], raws: RawEvent[], lost: number, atMs: number) {
    this.#stream = stream;
    this.entries = entries;
    this.#raws = raws;
    this.#shared = new Array(entries.length);
    this.lost = lost;
    this.atMs = atMs;
  }

  get length(): number {
    return this.entries.length;
  }

  /** Event i, or null when the budget ran out before anyone needed it (then it is dropped for all). */
  at(i: number): Shared | null {
    let s = this.#shared[i];
    if (s === undefined) {
      s = this.#stream.affords() ? new Shared(this.#stream, this.entries[i]!, this.#raws[i]!) : null;
      this.#shared[i] = s;
    }
    return s;
  }

  /** Events [from, n) matching `filter` (all when undefined). */
  count(from: number, filter: ConnectionFilter | undefined): number {
    if (filter === undefined) return Math.max(0, this.length - from);
    let n = 0;
    for (let i = from; i < this.length; i++) if (this.entries[i]!.matches(filter)) n++;
    return n;
  }

  /** NDJSON of every event (what unfiltered subscribers take, the same bytes for all of them). */
  whole(): Lines {
    if (this.#whole === undefined) this.#whole = this.lines(0, undefined);
    return this.#whole;
  }

  /** NDJSON of events [from, n) matching `filter` (all when undefined), with a line for those dropped. */
  lines(from: number, filter: ConnectionFilter | undefined): Lines {
    let text = '';
    let events = 0;
    let dropped = this.lost;
    for (let i = from; i < this.length; i++) {
      if (filter !== undefined && !this.entries[i]!.matches(filter)) continue;
      const s = this.at(i);
      if (s === null) dropped++;
      else {
        text += s.line;
        events++;
      }
    }
    if (dropped > 0) text += droppedLine(dropped, this.atMs);
    const t = this.#stream.clock();
    const buf = Buffer.from(text);
    this.#stream.charge(t);
    return { buf, events, dropped };
  }
}

function selectsAll(f: ConnectionFilter): boolean {
  return f.service === undefined && f.client === undefined && f.id === undefined;
}

/** A subscriber: its filter, the events of the batch it joined during (already in its backlog), delivery. */
abstract class Subscriber implements Subscription {
  readonly stream: EventStream;
  readonly filter: ConnectionFilter;
  readonly all: boolean;
  /** Events of the batch being collected when it joined: the caller read those from the recent buffer. */
  skip: number;
  paused = false;
  closed = false;
  dropped = 0;
  #scheduled = false;
  readonly #resume = (): void => {
    this.#scheduled = false;
    if (!this.paused && !this.closed) this.#safely();
  };

  constructor(stream: EventStream, filter: ConnectionFilter, skip: number) {
    this.stream = stream;
    this.filter = filter;
    this.all = selectsAll(filter);
    this.skip = skip;
  }

  lose(n: number): void {
    this.dropped += n;
    this.stream.droppedEvents += n;
  }

  pause(): void {
    this.paused = true;
  }

  resume(): void {
    this.paused = false;
    // A later turn: resume() may be called from inside the subscriber's own delivery.
    if (!this.#scheduled && !this.closed) {
      this.#scheduled = true;
      setImmediate(this.#resume);
    }
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.clear();
    this.stream.unsubscribe(this);
  }

  /** At a flush: takes its share of the batch, then hands on what it can. */
  take(batch: Batch): void {
    const from = Math.min(this.skip, batch.length);
    this.skip = 0;
    if (this.closed) return;
    this.#safely(() => {
      this.queue(batch, from);
      if (!this.paused) this.deliver();
    });
  }

  #safely(fn: () => void = () => this.deliver()): void {
    try {
      fn();
    } catch {
      // A broken sink ends its own subscription, never the stream or the proxy.
      this.close();
    }
  }

  protected abstract queue(batch: Batch, from: number): void;
  protected abstract deliver(): void;
  protected abstract clear(): void;
}

/** In-process subscribers: event objects, one call each; pause() from inside onEvent stops the calls. */
class EventSubscriber extends Subscriber {
  readonly #onEvent: (event: TraceEvent) => void;
  #queue: Shared[] = [];
  #head = 0;

  constructor(stream: EventStream, filter: ConnectionFilter, skip: number, onEvent: (e: TraceEvent) => void) {
    super(stream, filter, skip);
    this.#onEvent = onEvent;
  }

  protected queue(batch: Batch, from: number): void {
    if (batch.lost > 0) this.lose(batch.lost);
    const max = this.stream.maxPending;
    for (let i = from; i < batch.length; i++) {
      if (!this.all && !batch.entries[i]!.matches(this.filter)) continue;
      const s = batch.at(i);
      if (s === null || this.#queue.length - this.#head >= max) this.lose(1);
      else this.#queue.push(s);
    }
  }

  protected deliver(): void {
    const q = this.#queue;
    while (this.#head < q.length && !this.paused && !this.closed) this.#onEvent(q[this.#head++]!.event);
    if (this.#head === q.length) {
      q.length = 0;
      this.#head = 0;
    } else if (this.#head > 1024) {
      q.splice(0, this.#head);
      this.#head = 0;
    }
  }

  protected clear(): void {
    this.#queue = [];
    this.#head = 0;
  }
}

type Chunk = { readonly buf: Buffer; readonly events: number; readonly droppedBefore: number };

/**
 * NDJSON subscribers (the HTTP followers): one chunk per flush, the batch's shared bytes when unfiltered;
 * while the sink is not ready, chunks queue up to maxPending events (and MAX_QUEUED_BYTES), then drop,
 * and a `{"type":"dropped"}` line says how many before the next chunk it gets.
 */
class LineSubscriber extends Subscriber {
  readonly #sink: LineSink;
  #queue: Chunk[] = [];
  #queuedEvents = 0;
  #queuedBytes = 0;
  /** Dropped since the last queued chunk. */
  #pendingDrop = 0;

  constructor(stream: EventStream, filter: ConnectionFilter, skip: number, sink: LineSink) {
    super(stream, filter, skip);
    this.#sink = sink;
  }

  protected queue(batch: Batch, from: number): void {
    if (this.#queue.length > 0 && this.#queuedEvents >= this.stream.maxPending) {
      // Nothing is built for a follower that is not reading: its share is only counted.
      const n = batch.count(from, this.all ? undefined : this.filter) + batch.lost;
      this.#pendingDrop += n;
      this.lose(n);
      return;
    }
    const chunk =
      this.all && from === 0 ? batch.whole() : batch.lines(from, this.all ? undefined : this.filter);
    if (chunk.dropped > 0) this.lose(chunk.dropped);
    if (chunk.buf.length === 0) return;
    if (
      this.#queue.length > 0 &&
      (this.#queuedEvents + chunk.events > this.stream.maxPending ||
        this.#queuedBytes + chunk.buf.length > MAX_QUEUED_BYTES)
    ) {
      this.#pendingDrop += chunk.events + chunk.dropped;
      this.lose(chunk.events);
      return;
    }
    this.#queue.push({ buf: chunk.buf, events: chunk.events, droppedBefore: this.#pendingDrop });
    this.#pendingDrop = 0;
    this.#queuedEvents += chunk.events;
    this.#queuedBytes += chunk.buf.length;
  }

  protected deliver(): void {
    const q = this.#queue;
    while (!this.closed && !this.paused && (q.length > 0 || this.#pendingDrop > 0)) {
      if (!this.#sink.ready()) {
        this.paused = true;
        return;
      }
      const c = q.shift();
      if (c === undefined) {
        this.#write(Buffer.from(droppedLine(this.#pendingDrop, this.stream.now())));
        this.#pendingDrop = 0;
        continue;
      }
      this.#queuedEvents -= c.events;
      this.#queuedBytes -= c.buf.length;
      if (c.droppedBefore > 0) this.#write(Buffer.from(droppedLine(c.droppedBefore, this.stream.now())));
      this.#write(c.buf);
    }
  }

  /** Writing costs too (a socket write is a system call, and loopback delivery runs in it): charged. */
  #write(buf: Buffer): void {
    const t = this.stream.clock();
    this.#sink.write(buf);
    this.stream.charge(t);
  }

  protected clear(): void {
    this.#queue = [];
    this.#queuedEvents = 0;
    this.#queuedBytes = 0;
  }
}

/** The stream. `record` is the data path's one call; the rest runs on the flush timer. */
export class EventStream {
  readonly maxPending: number;
  readonly maxSubscribers: number;
  readonly now: () => number;
  readonly clock: () => number;
  readonly #flushIntervalMs: number;
  readonly #share: number;
  #subscribers: Subscriber[] = [];
  // Events since the last flush, collected only while someone subscribes: parallel arrays, swapped with
  // a spare pair at each flush, so collecting allocates nothing.
  #entries: TableEntry[] = [];
  #raws: RawEvent[] = [];
  #spareEntries: TableEntry[] = [];
  #spareRaws: RawEvent[] = [];
  #lost = 0;
  #timer: NodeJS.Timeout | undefined = undefined;
  readonly #flush = (): void => this.#deliverBatch();
  // The budget: ms the stream may spend, refilled at maxCpuShare of the time passed, up to
  // BUDGET_WINDOW_MS's worth; what building an event or a batch's bytes, or a write, took is taken from it
  // (it may go below zero: the next flushes build nothing until it is paid back).
  #budgetMs: number;
  #refilledAt: number;
  refusedSubscribers = 0;
  droppedEvents = 0;
  overBudgetEvents = 0;

  constructor(options: EventStreamOptions) {
    this.maxPending = Math.max(1, options.maxPending);
    this.maxSubscribers = Math.max(0, options.maxSubscribers);
    this.now = options.now;
    this.#flushIntervalMs = Math.max(0, options.flushIntervalMs);
    this.clock = options.clock;
    this.#share = Math.min(1, Math.max(0, options.maxCpuShare));
    this.#budgetMs = this.#share * BUDGET_WINDOW_MS;
    this.#refilledAt = this.clock();
  }

  /** On the data path: nothing without subscribers; else two pushes (and a timer per batch). */
  record(entry: TableEntry, raw: RawEvent): void {
    if (this.#subscribers.length === 0) return;
    if (this.#entries.length >= MAX_BATCH) this.#lost++;
    else {
      this.#entries.push(entry);
      this.#raws.push(raw);
    }
    if (this.#timer === undefined) {
      this.#timer = setTimeout(this.#flush, this.#flushIntervalMs);
      this.#timer.unref();
    }
  }

  /** Undefined when maxSubscribers are subscribed. */
  subscribe(filter: ConnectionFilter, onEvent: (event: TraceEvent) => void): Subscription | undefined {
    if (!this.#room()) return undefined;
    return this.#add(new EventSubscriber(this, filter, this.#entries.length, onEvent));
  }

  /** Undefined when maxSubscribers are subscribed. */
  subscribeLines(filter: ConnectionFilter, sink: LineSink): Subscription | undefined {
    if (!this.#room()) return undefined;
    return this.#add(new LineSubscriber(this, filter, this.#entries.length, sink));
  }

  unsubscribe(sub: Subscriber): void {
    this.#subscribers = this.#subscribers.filter((s) => s !== sub);
  }

  /** Whether there is time left to build an event; false (and counted) when the budget is spent. */
  affords(): boolean {
    if (this.#budgetMs > 0) return true;
    this.overBudgetEvents++;
    return false;
  }

  /** Takes the time since `startedAt` (a clock() reading) from the budget. */
  charge(startedAt: number): void {
    this.#budgetMs -= this.clock() - startedAt;
  }

  stats(): EventStreamStats {
    return {
      subscribers: this.#subscribers.length,
      maxSubscribers: this.maxSubscribers,
      refusedSubscribers: this.refusedSubscribers,
      droppedEvents: this.droppedEvents,
      overBudgetEvents: this.overBudgetEvents,
    };
  }

  #room(): boolean {
    if (this.#subscribers.length < this.maxSubscribers) return true;
    this.refusedSubscribers++;
    return false;
  }

  #add<S extends Subscriber>(sub: S): S {
    // Copy on write: a flush iterates the array without guarding against changes mid-loop.
    this.#subscribers = [...this.#subscribers, sub];
    return sub;
  }

  #deliverBatch(): void {
    this.#timer = undefined;
    const now = this.now();
    const t = this.clock();
    this.#budgetMs = Math.min(
      this.#share * BUDGET_WINDOW_MS,
      this.#budgetMs + (t - this.#refilledAt) * this.#share,
    );
    this.#refilledAt = t;
    const entries = this.#entries;
    const raws = this.#raws;
    const batch = new Batch(this, entries, raws, this.#lost, now);
    this.#entries = this.#spareEntries;
    this.#raws = this.#spareRaws;
    this.#lost = 0;
    const subs = this.#subscribers;
    for (let k = 0; k < subs.length; k++) subs[k]!.take(batch);
    entries.length = 0;
    raws.length = 0;
    this.#spareEntries = entries;
    this.#spareRaws = raws;
  }
}
