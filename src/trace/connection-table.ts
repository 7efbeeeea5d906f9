// The connection table: active TCP connections and UDP sessions, and a bounded ring of recently closed ones
// that counts what it pushed out. Byte counts of active entries are read live from the relay's
// ConnectionInfo at query time, never copied per chunk. Per connection it allocates one entry and nothing
// else: the active ones are a list linked through the entries, found from the connection's observerData.
// No I/O, no timers.
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

/** A closed connection's facts, copied from the relay object at close (one flat object, off the data path). */
type ClosedFacts = {
  readonly id: number;
  readonly service: string;
  readonly protocol: 'TCP' | 'UDP';
  readonly clientAddress: string;
  readonly clientPort: number;
  readonly endpoint: string | null;
  readonly startMs: number;
  readonly endMs: number;
  readonly bytesFromClient: number;
  readonly bytesToClient: number;
  readonly attempts: readonly ConnectAttempt[];
  readonly closeReason: CloseReason | null;
  /** The sniffer's info at close; null when there was none, or when the entry kept it (Sniffer.end). */
  readonly app: AppInfo | null;
};

/**
 * One connection in the table. While active it keeps only the live connection (its facts are read from it:
 * none of them changes once it has opened), the sniffer and the list links; at close the facts are copied
 * into one flat object and the connection is let go, and the sniffer too unless its info no longer changes
 * (Sniffer.end: then it stands for its info, read when asked, instead of a copy made for every closed
 * connection). Idle traced connections are many; closed ones are at most the recent ring.
 */
export class TableEntry {
  /** The live connection while active. */
  info: ConnectionInfo | undefined;
  /** Set at close. */
  final: ClosedFacts | undefined = undefined;
  /** Protocols mode only, from the first bytes on; kept after close when it ended (Sniffer.end). */
  sniffer: Sniffer | undefined = undefined;
  /** Protocols mode: the connection is sniffed (its app is `no-data` until bytes start a sniffer). */
  sniffed = false;
  /** False once the sniffer is done (or there is none): data callbacks return on this one check. */
  sniffing = false;
  // The active list, newest at the tail.
  prev: TableEntry | undefined = undefined;
  next: TableEntry | undefined = undefined;

  constructor(conn: ConnectionInfo) {
    this.info = conn;
  }

  get closed(): boolean {
    return this.final !== undefined;
  }
  get id(): number {
    return (this.info ?? this.final!).id;
  }
  get service(): string {
    return (this.info ?? this.final!).service;
  }
  get protocol(): 'TCP' | 'UDP' {
    return (this.info ?? this.final!).protocol;
  }
  get clientAddress(): string {
    return (this.info ?? this.final!).clientAddress;
  }
  get clientPort(): number {
    return (this.info ?? this.final!).clientPort;
  }
  /** The endpoint relayed to (`ip:port`), else null. */
  get endpoint(): string | null {
    const conn = this.info;
    return conn === undefined ? this.final!.endpoint : (conn.endpoint?.key ?? null);
  }
  get startMs(): number {
    return (this.info ?? this.final!).startMs;
  }

  /** Protocols mode: data callbacks feed a sniffer, started by the first bytes (startSniffer). */
  sniff(): void {
    this.sniffed = true;
    this.sniffing = true;
  }

  /** What the sniffer knows so far; null when the connection is not sniffed. */
  appInfo(): AppInfo | null {
    if (this.sniffer !== undefined) return this.sniffer.info();
    if (this.final !== undefined) return this.final.app;
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
    const f = this.final;
    if (f === undefined) return undefined;
    return {
      id: f.id,
      service: f.service,
      protocol: f.protocol,
      client: joinHostPort(f.clientAddress, f.clientPort),
      endpoint: f.endpoint,
      state: 'closed',
      startMs: f.startMs,
      endMs: f.endMs,
      durationMs: Math.max(0, f.endMs - f.startMs),
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
    if (this.final !== undefined) return;
    const s = this.sniffer;
    let app: AppInfo | null = null;
    if (s === undefined) app = this.sniffed ? NO_DATA : null;
    else if (s.end?.() !== true) {
      app = s.info();
      this.sniffer = undefined;
    }
    this.final = {
      id: conn.id,
      service: conn.service,
      protocol: conn.protocol,
      clientAddress: conn.clientAddress,
      clientPort: conn.clientPort,
      endpoint: conn.endpoint?.key ?? null,
      startMs: conn.startMs,
      endMs: conn.endMs,
      bytesFromClient: conn.bytesFromClient,
      bytesToClient: conn.bytesToClient,
      attempts: copyAttempts(conn.failedAttempts),
      closeReason: conn.closeReason ?? null,
      app,
    };
    this.info = undefined;
    this.sniffing = false;
  }
}

/**
 * Active connections plus a ring of the last `maxRecent` closed ones. A connection closed without having
 * been opened (no endpoints, connect failures) goes straight to the ring. The table keeps each active
 * connection's entry in its `observerData`.
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
    const entry = new TableEntry(conn);
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
    if (entry === undefined) entry = new TableEntry(conn);
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
      e = next;
    }
    this.#head = undefined;
    this.#tail = undefined;
    this.#activeCount = 0;
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

  #remember(entry: TableEntry): void {
    const size = this.maxRecent;
    if (size === 0) {
      this.#dropped++;
      return;
    }
    if (this.#recent === size) this.#dropped++;
    else this.#recent++;
    this.#ring[this.#next] = entry;
    this.#next = this.#next + 1 === size ? 0 : this.#next + 1;
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
