// The connection table: active TCP connections and UDP sessions, and a bounded ring of recently closed ones
// that counts what it pushed out. Byte counts of active entries are read live from the relay's
// ConnectionInfo at query time, never copied per chunk. Under churn a connection allocates nothing here:
// entries (and their closed facts) are reused once nothing holds them; the active ones are a list linked
// through the entries, found from the connection's observerData. No I/O, no timers.
import { joinHostPort } from '../lib/host-port.ts';
import type { CloseReason } from '../relay/close-reason.ts';
import type { ConnectAttempt, ConnectionInfo } from '../relay/observer.ts';
import type { AppInfo, Sniffer } from './sniff/types.ts';

export type ConnectionState = 'active' | 'closed';

/** One connection or session as /debug/connections, the trace stream and the access log show it. */
export type ConnectionRecord = {
  readonly id: number;
  /** `ns/name:portName`. */
  readonly service: string;
  readonly protocol: 'TCP' | 'UDP';
  /** `ip:port` (`[ip]:port` for IPv6). */
  readonly client: string;
  /** The endpoint relayed to (`ip:port`); null when none was reached. */
  readonly endpoint: string | null;
  readonly state: ConnectionState;
  /** Epoch ms (the relay's clock). */
  readonly startMs: number;
  readonly endMs: number | null;
  /** Lifetime so far (active) or in total (closed). */
  readonly durationMs: number;
  readonly bytesFromClient: number;
  readonly bytesToClient: number;
  /** Failed connect attempts, in order (endpoint and error code). */
  readonly attempts: readonly ConnectAttempt[];
  readonly closeReason: CloseReason | null;
  /** What the protocol sniffer learnt; null when the connection was not sniffed. */
  readonly app: AppInfo | null;
};

/** Query filters shared by /debug/connections, /debug/trace and subscriptions. */
export type ConnectionFilter = {
  /** `ns/name:port` (one service port), `ns/name` (every port of a service) or `ns` (a namespace). */
  readonly service?: string | undefined;
  /** Client IP, or `ip:port`. */
  readonly client?: string | undefined;
  readonly id?: number | undefined;
};

export type ListOptions = ConnectionFilter & {
  /** Only active or only closed connections; both when unset. */
  readonly state?: ConnectionState | undefined;
  /** At most this many of each list (the newest); unlimited when unset. */
  readonly limit?: number | undefined;
};

export type ConnectionListing = {
  /** Newest first. */
  active: ConnectionRecord[];
  /** Newest first. */
  recent: ConnectionRecord[];
  /** Matches before `limit`. */
  totals: { active: number; recent: number };
  /** Closed records pushed out of the ring since start. */
  dropped: number;
};

export type ConnectionTableOptions = {
  /** Closed connections kept (ring buffer); default 1000, 0 keeps none. */
  maxRecent?: number;
  now?: () => number;
};

const DEFAULT_MAX_RECENT = 1000;

const NO_ATTEMPTS: readonly ConnectAttempt[] = Object.freeze([]);
const NO_DATA: AppInfo = Object.freeze({ protocol: 'unknown', reason: 'no-data' });

function copyAttempts(a: readonly ConnectAttempt[]): readonly ConnectAttempt[] {
  return a.length === 0 ? NO_ATTEMPTS : a.slice();
}

/** True when `service` (`ns/name:port`) is selected by `filter` (see ConnectionFilter.service). */
export function matchesService(service: string, filter: string): boolean {
  if (filter.includes(':')) return service === filter;
  const sep = filter.includes('/') ? 0x3a /* : */ : 0x2f; /* / */
  return service.startsWith(filter) && service.charCodeAt(filter.length) === sep;
}

/** True when the client `ip` (with `port`) is selected by `filter` (an IP, or ip:port). */
export function matchesClient(ip: string, port: number, filter: string): boolean {
  return ip === filter || joinHostPort(ip, port) === filter;
}

/**
 * A closed connection's facts, written at close (one object per entry, written over when it is reused).
 * What it holds is shared or old by then (the service's name, the endpoint's key, a shared client address)
 * or written in place (the times): a reused entry keeps nothing young for a scavenge to copy.
 */
class ClosedFacts {
  id = 0;
  service = '';
  protocol: 'TCP' | 'UDP' = 'TCP';
  clientAddress = '';
  clientPort = 0;
  endpoint: string | null = null;
  /** Start and end (epoch ms): a number in a field would be a new heap number at each close. */
  readonly times = new Float64Array(2);
  bytesFromClient = 0;
  bytesToClient = 0;
  attempts: readonly ConnectAttempt[] = NO_ATTEMPTS;
  closeReason: CloseReason | null = null;
  /** The sniffer's info at close, when the entry did not keep the sniffer (Sniffer.end); else unused. */
  app: AppInfo | null = null;
}

// Client addresses of closed connections, one string each (a Service's clients repeat): the ring of recent
// connections keeps the shared one instead of each connection's own copy.
const ADDRESS_SLOTS = 64;
const addresses: (string | undefined)[] = new Array(ADDRESS_SLOTS);

/** `address`, or the equal string kept from an earlier connection. */
function sharedAddress(address: string): string {
  const n = address.length;
  if (n === 0) return address;
  const slot =
    (n * 31 + address.charCodeAt(n - 1) * 7 + address.charCodeAt(n >> 1) * 13) & (ADDRESS_SLOTS - 1);
  const kept = addresses[slot];
  if (kept === address) return kept;
  addresses[slot] = address;
  return address;
}

/** Entries at most kept for reuse (see TableEntry.release). */
const MAX_FREE = 1024;

// Entries nobody holds any more, for the next connections of any table (one thread): under churn a
// connection then allocates no entry.
const freeEntries: TableEntry[] = [];

/** An entry for `conn`, held once (by the caller). */
function takeEntry(conn: ConnectionInfo): TableEntry {
  const entry = freeEntries.pop() ?? new TableEntry();
  entry.info = conn;
  entry.hold();
  return entry;
}

/**
 * One connection in the table. While active it keeps only the live connection (its facts are read from it:
 * none of them changes once it has opened), the sniffer and the list links; at close the facts are written
 * into its ClosedFacts and the connection is let go (the sniffer too, unless it is kept in place of its
 * info: Sniffer.end). Entries are reused: the table and the tracer's events hold them (hold/release), and
 * one that nobody holds goes back to the pool, so that under churn the table and the event rings keep
 * their slots in place instead of an object (and a copy at each scavenge) per connection.
 */
export class TableEntry {
  /** The live connection while active. */
  info: ConnectionInfo | undefined = undefined;
  /** Protocols mode only, from the first bytes on; kept after close when it ended small (Sniffer.end). */
  sniffer: Sniffer | undefined = undefined;
  /** Protocols mode: the connection is sniffed (its app is `no-data` until bytes start a sniffer). */
  sniffed = false;
  /** False once the sniffer is done (or there is none): data callbacks return on this one check. */
  sniffing = false;
  // The active list, newest at the tail.
  prev: TableEntry | undefined = undefined;
  next: TableEntry | undefined = undefined;
  /** The final facts once closed; made at the entry's first close and written over at each later one. */
  #facts: ClosedFacts | undefined = undefined;
  /** Holders: the table (while active or in its ring) and each event of it the tracer keeps. */
  #holders = 0;

  /** Closed: no live connection any more (an entry is taken for one, and lets go of it at close). */
  get closed(): boolean {
    return this.info === undefined;
  }
  get id(): number {
    const c = this.info;
    return c !== undefined ? c.id : this.#facts!.id;
  }
  get service(): string {
    const c = this.info;
    return c !== undefined ? c.service : this.#facts!.service;
  }
  get protocol(): 'TCP' | 'UDP' {
    const c = this.info;
    return c !== undefined ? c.protocol : this.#facts!.protocol;
  }
  get clientAddress(): string {
    const c = this.info;
    return c !== undefined ? c.clientAddress : this.#facts!.clientAddress;
  }
  get clientPort(): number {
    const c = this.info;
    return c !== undefined ? c.clientPort : this.#facts!.clientPort;
  }
  /** The endpoint relayed to (`ip:port`), else null. */
  get endpoint(): string | null {
    const c = this.info;
    return c !== undefined ? (c.endpoint?.key ?? null) : this.#facts!.endpoint;
  }
  get startMs(): number {
    const c = this.info;
    return c !== undefined ? c.startMs : this.#facts!.times[0]!;
  }

  /** One more holder: it stays this connection's until each holder has released it. */
  hold(): void {
    this.#holders++;
  }

  /**
   * A holder lets go; the last one gives it back to the pool, with a sniffer it kept (Sniffer.recycle). A
   * holder that never releases costs only the reuse: the entry is then left to the garbage collector.
   */
  release(): void {
    if (this.#holders === 0 || --this.#holders > 0) return;
    this.info = undefined;
    this.sniffer?.recycle?.();
    this.sniffer = undefined;
    this.sniffed = false;
    this.sniffing = false;
    this.prev = undefined;
    this.next = undefined;
    const f = this.#facts;
    if (f !== undefined) {
      f.clientAddress = '';
      f.attempts = NO_ATTEMPTS;
      f.app = null;
    }
    if (freeEntries.length < MAX_FREE) freeEntries.push(this);
  }

  /** Protocols mode: data callbacks feed a sniffer, started by the first bytes (startSniffer). */
  sniff(): void {
    this.sniffed = true;
    this.sniffing = true;
  }

  /** What the sniffer knows so far; null when the connection is not sniffed. */
  appInfo(): AppInfo | null {
    if (this.sniffer !== undefined) return this.sniffer.info();
    if (this.info === undefined) return this.#facts!.app;
    return this.sniffed ? NO_DATA : null;
  }

  get client(): string {
    return joinHostPort(this.clientAddress, this.clientPort);
  }

  matches(filter: ConnectionFilter): boolean {
    return (
      (filter.id === undefined || filter.id === this.id) &&
      (filter.service === undefined || matchesService(this.service, filter.service)) &&
      (filter.client === undefined || matchesClient(this.clientAddress, this.clientPort, filter.client))
    );
  }

  /** The final record once closed (built on each call, off the data path). */
  get record(): ConnectionRecord | undefined {
    if (this.info !== undefined) return undefined;
    const f = this.#facts!;
    const startMs = f.times[0]!;
    const endMs = f.times[1]!;
    return {
      id: f.id,
      service: f.service,
      protocol: f.protocol,
      client: joinHostPort(f.clientAddress, f.clientPort),
      endpoint: f.endpoint,
      state: 'closed',
      startMs,
      endMs,
      durationMs: Math.max(0, endMs - startMs),
      bytesFromClient: f.bytesFromClient,
      bytesToClient: f.bytesToClient,
      attempts: f.attempts,
      closeReason: f.closeReason,
      app: this.appInfo(),
    };
  }

  /** The current view: live byte counts while active, the final record once closed. */
  snapshot(nowMs: number): ConnectionRecord {
    const conn = this.info;
    if (conn === undefined) return this.record!;
    return {
      id: conn.id,
      service: conn.service,
      protocol: conn.protocol,
      client: joinHostPort(conn.clientAddress, conn.clientPort),
      endpoint: conn.endpoint?.key ?? null,
      state: 'active',
      startMs: conn.startMs,
      endMs: null,
      durationMs: Math.max(0, nowMs - conn.startMs),
      bytesFromClient: conn.bytesFromClient,
      bytesToClient: conn.bytesToClient,
      attempts: copyAttempts(conn.failedAttempts),
      closeReason: null,
      app: this.appInfo(),
    };
  }

  /** Keeps the final values of the (closed) connection and lets go of it (and of a sniffer not kept). */
  finish(conn: ConnectionInfo): void {
    if (this.info === undefined) return;
    this.#facts ??= new ClosedFacts();
    const f = this.#facts;
    f.id = conn.id;
    f.service = conn.service;
    f.protocol = conn.protocol;
    f.clientAddress = sharedAddress(conn.clientAddress);
    f.clientPort = conn.clientPort;
    f.endpoint = conn.endpoint?.key ?? null;
    f.times[0] = conn.startMs;
    f.times[1] = conn.endMs;
    f.bytesFromClient = conn.bytesFromClient;
    f.bytesToClient = conn.bytesToClient;
    f.attempts = copyAttempts(conn.failedAttempts);
    f.closeReason = conn.closeReason ?? null;
    const s = this.sniffer;
    // A sniffer that ended small is kept and read when asked; any other is read now, once.
    if (s === undefined) f.app = this.sniffed ? NO_DATA : null;
    else if (s.end?.() === true) f.app = null;
    else {
      f.app = s.info();
      this.sniffer = undefined;
    }
    this.info = undefined;
    this.sniffing = false;
  }
}

/**
 * Active connections plus a ring of the last `maxRecent` closed ones. A connection closed without having
 * been opened (no endpoints, connect failures) goes straight to the ring. The table keeps each active
 * connection's entry in its `observerData`, and holds each entry while it is active or in the ring.
 */
export class ConnectionTable {
  readonly maxRecent: number;
  readonly now: () => number;
  // The active entries, oldest first: a list linked through TableEntry.prev/next.
  #head: TableEntry | undefined = undefined;
  #tail: TableEntry | undefined = undefined;
  #activeCount = 0;
  readonly #ring: (TableEntry | undefined)[];
  #next = 0;
  #recent = 0;
  #dropped = 0;

  constructor(options: ConnectionTableOptions = {}) {
    this.maxRecent = Math.max(0, Math.floor(options.maxRecent ?? DEFAULT_MAX_RECENT));
    this.now = options.now ?? Date.now;
    this.#ring = new Array(this.maxRecent);
  }

  get activeCount(): number {
    return this.#activeCount;
  }
  get recentCount(): number {
    return this.#recent;
  }
  /** Closed records pushed out of the ring (or not kept at all with maxRecent 0). */
  get dropped(): number {
    return this.#dropped;
  }

  /** Adds an opened connection. */
  open(conn: ConnectionInfo): TableEntry {
    const entry = takeEntry(conn);
    const tail = this.#tail;
    entry.prev = tail;
    if (tail === undefined) this.#head = entry;
    else tail.next = entry;
    this.#tail = entry;
    this.#activeCount++;
    conn.observerData = entry;
    return entry;
  }

  /** The active entry of a connection. */
  get(conn: ConnectionInfo): TableEntry | undefined {
    const entry = conn.observerData;
    return entry instanceof TableEntry && !entry.closed ? entry : undefined;
  }

  /** Moves a closed connection to the ring (creating its entry when it never opened); returns it. */
  close(conn: ConnectionInfo): TableEntry {
    let entry = this.get(conn);
    if (entry === undefined) entry = takeEntry(conn);
    else this.#unlink(entry);
    conn.observerData = undefined;
    entry.finish(conn);
    this.#remember(entry);
    return entry;
  }

  /** Active and recent records matching `options`, newest first. */
  list(options: ListOptions = {}): ConnectionListing {
    this.#reap();
    const now = this.now();
    const limit = options.limit ?? Number.POSITIVE_INFINITY;
    const active: TableEntry[] = [];
    const recent: TableEntry[] = [];
    if (options.state !== 'closed') {
      for (let e = this.#tail; e !== undefined; e = e.prev) if (e.matches(options)) active.push(e);
    }
    if (options.state !== 'active') {
      this.#eachRecent((e) => {
        if (e.matches(options)) recent.push(e);
      });
    }
    return {
      active: active.slice(0, limit).map((e) => e.snapshot(now)),
      recent: recent.slice(0, limit).map((e) => e.snapshot(now)),
      totals: { active: active.length, recent: recent.length },
      dropped: this.#dropped,
    };
  }

  /** Forgets everything (tests, or a debug reset). */
  clear(): void {
    for (let e = this.#head; e !== undefined; ) {
      const next = e.next;
      e.prev = undefined;
      e.next = undefined;
      if (e.info?.observerData === e) e.info.observerData = undefined;
      e.release();
      e = next;
    }
    this.#head = undefined;
    this.#tail = undefined;
    this.#activeCount = 0;
    for (const e of this.#ring) e?.release();
    this.#ring.fill(undefined);
    this.#next = 0;
    this.#recent = 0;
  }

  #unlink(entry: TableEntry): void {
    const { prev, next } = entry;
    if (prev === undefined) this.#head = next;
    else prev.next = next;
    if (next === undefined) this.#tail = prev;
    else next.prev = prev;
    entry.prev = undefined;
    entry.next = undefined;
    this.#activeCount--;
  }

  /** The table's hold on `entry` moves to the ring (and that of the entry it pushes out ends). */
  #remember(entry: TableEntry): void {
    const size = this.maxRecent;
    if (size === 0) {
      // Not released: the caller of close() still reads it (it is left to the garbage collector).
      this.#dropped++;
      return;
    }
    const out = this.#ring[this.#next];
    if (this.#recent === size) this.#dropped++;
    else this.#recent++;
    this.#ring[this.#next] = entry;
    this.#next = this.#next + 1 === size ? 0 : this.#next + 1;
    out?.release();
  }

  /** Newest first. */
  #eachRecent(fn: (e: TableEntry) => void): void {
    const size = this.maxRecent;
    for (let i = 1; i <= this.#recent; i++) fn(this.#ring[(this.#next - i + size) % size]!);
  }

  // A connection whose observer was swapped for the noop one (trace annotation changed to none while it
  // ran) is never reported closed: its relay object says so (endMs is set at close), so move it here.
  #reap(): void {
    for (let e = this.#head; e !== undefined; ) {
      const next = e.next;
      const conn = e.info!;
      if (conn.endMs > 0) {
        this.#unlink(e);
        conn.observerData = undefined;
        e.finish(conn);
        this.#remember(e);
      }
      e = next;
    }
  }
}
