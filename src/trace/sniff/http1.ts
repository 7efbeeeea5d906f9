// HTTP/1.x sniffer: request lines, Host and status lines of the requests on a keep-alive connection,
// following Content-Length and chunked bodies to find the next message without buffering them. Header
// values other than Host are never copied out. Pure: no I/O; never throws; bounded memory.
import { equalsLower, latin1 } from './bytes.ts';
import { Latin1Cache } from './latin1-cache.ts';
import type { Http1Info, HttpExchange, Sniffer, SniffLimits } from './types.ts';

/** Longest line we will hold (request line, a kept header, a chunk-size line). */
const MAX_LINE = 8192;
const MAX_PIPELINE = 256;
const MAX_PATH = 1024;
const MAX_HOST = 255;
const MAX_METHOD = 24;

const S_START = 0;
const S_HEADERS = 1;
const S_BODY = 2;
const S_CHUNK_SIZE = 3;
const S_CHUNK_DATA = 4;
const S_CHUNK_END = 5;
const S_TRAILERS = 6;
/** The rest of this direction is opaque (a tunnel, or a body that runs to close). */
const S_OPAQUE = 7;

const H_OTHER = 0;
const H_HOST = 1;
const H_CONTENT_LENGTH = 2;
const H_TRANSFER_ENCODING = 3;
const H_UPGRADE = 4;

/** Paths and Host values, shared by every HTTP/1 sniffer (sniffing is synchronous, on one thread). */
const strings = new Latin1Cache();

/** One request and its response as they are parsed; info() copies out the HttpExchange fields. */
class Exchange {
  readonly index: number;
  readonly method: string;
  readonly path: string;
  readonly version: string;
  readonly host: string | undefined;
  readonly startMs: number;
  status: number | undefined = undefined;
  ttfbMs: number | undefined = undefined;
  durationMs: number | undefined = undefined;
  /** The Upgrade the request asked for (what a 101 switches to). */
  readonly upgrade: string | undefined;
  /** The next recorded exchange, and the next request waiting for its response (linked lists: no arrays). */
  nextRecorded: Exchange | undefined = undefined;
  nextPending: Exchange | undefined = undefined;

  constructor(index: number, d: Direction) {
    this.index = index;
    this.method = d.method;
    this.path = d.path;
    this.version = d.version;
    this.host = d.host;
    this.startMs = d.startMs;
    this.upgrade = d.upgrade;
  }

  // What framing the response needs (read once per response: no fields for them).
  get head(): boolean {
    return this.method === 'HEAD';
  }
  get connect(): boolean {
    return this.method === 'CONNECT';
  }

  toJSON(): HttpExchange {
    return {
      index: this.index,
      method: this.method,
      path: this.path,
      version: this.version,
      host: this.host,
      startMs: this.startMs,
      status: this.status,
      ttfbMs: this.ttfbMs,
      durationMs: this.durationMs,
    };
  }
}

/**
 * Parse state of one direction while a message is in it. Between messages it holds nothing a connection
 * needs, so the sniffer gives it back (idleDirections) and an idle keep-alive connection keeps none.
 */
class Direction {
  isRequest: boolean;
  state = S_START;
  /** A line that spans chunks; only allocated when one does. */
  line: Buffer | undefined = undefined;
  lineLen = 0;
  /** The current header line has a name we do not keep: drop bytes to its end. */
  skipping = false;
  /** The buffered partial line already has its ':' (a kept header). */
  colonSeen = false;
  remaining = 0;
  startMs = 0;
  // The message head being read.
  method = '';
  path = '';
  version = '';
  status = 0;
  host: string | undefined = undefined;
  upgrade: string | undefined = undefined;
  contentLength = -1;
  chunked = false;
  otherCoding = false;

  constructor(isRequest: boolean) {
    this.isRequest = isRequest;
  }

  /** Nothing of a message is held: the last one ended and no part of the next has arrived. */
  get idle(): boolean {
    return this.state === S_START && this.lineLen === 0 && !this.skipping;
  }

  /** Back to a new direction's state (its line buffer is kept for the next user). */
  clear(isRequest: boolean): void {
    this.isRequest = isRequest;
    this.state = S_START;
    this.lineLen = 0;
    this.skipping = false;
    this.colonSeen = false;
    this.remaining = 0;
    this.startMs = 0;
    this.method = '';
    this.path = '';
    this.version = '';
    this.status = 0;
    this.resetHead();
  }

  resetHead(): void {
    this.host = undefined;
    this.upgrade = undefined;
    this.contentLength = -1;
    this.chunked = false;
    this.otherCoding = false;
  }
}

type StopReason = 'truncated' | 'malformed' | 'upgrade' | 'eof';

// Directions given back between messages, for the next chunk of any connection to take: a keep-alive
// request takes one and gives it back without allocating, and an idle connection holds none.
const MAX_IDLE_DIRECTIONS = 16;
const idleDirections: Direction[] = [];

function takeDirection(isRequest: boolean): Direction {
  const d = idleDirections.pop();
  if (d === undefined) return new Direction(isRequest);
  d.clear(isRequest);
  return d;
}

function giveBack(d: Direction): void {
  if (idleDirections.length < MAX_IDLE_DIRECTIONS) idleDirections.push(d);
}

/** Sniffs an HTTP/1.x connection: done after maxRequests exchanges, an upgrade, or a parse limit. */
export class Http1Sniffer implements Sniffer {
  readonly #limits: SniffLimits;
  // Only while a message is part-way through; undefined between messages.
  #req: Direction | undefined = undefined;
  #res: Direction | undefined = undefined;
  // The first maxRequests exchanges, and the requests waiting for their response (oldest first).
  #recorded: Exchange | undefined = undefined;
  #pending: Exchange | undefined = undefined;
  #lastPending: Exchange | undefined = undefined;
  #pendingCount = 0;
  #requests = 0;
  #responses = 0;
  #upgrade: string | undefined = undefined;
  /** Why sniffing stopped; undefined while it goes on. One field: an idle connection keeps this object. */
  #stoppedBy: StopReason | undefined = undefined;

  constructor(limits: SniffLimits) {
    this.#limits = limits;
  }

  get done(): boolean {
    if (this.#stoppedBy !== undefined) return true;
    if (this.#limits.keepCounting) return false;
    return this.#requests >= this.#limits.maxRequests && this.#pendingCount === 0;
  }

  onClientData(buf: Buffer, nowMs: number): void {
    if (this.done) return;
    const d = this.#req ?? takeDirection(true);
    this.#feed(d, buf, nowMs);
    this.#req = this.#keep(d);
  }

  onEndpointData(buf: Buffer, nowMs: number): void {
    if (this.done) return;
    const d = this.#res ?? takeDirection(false);
    this.#feed(d, buf, nowMs);
    this.#res = this.#keep(d);
  }

  /** The direction when it is part-way through a message; else it is given back. */
  #keep(d: Direction): Direction | undefined {
    if (!this.done) {
      if (!d.idle) return d;
      giveBack(d);
      return undefined;
    }
    // No byte will be fed any more (stopped, or the last exchange ended with part of a request after it).
    giveBack(d);
    this.#req = undefined;
    this.#res = undefined;
    return undefined;
  }

  /** The connection closed: a message part-way through is let go; info() reads only what stays. */
  end(): boolean {
    if (this.#req !== undefined) giveBack(this.#req);
    if (this.#res !== undefined) giveBack(this.#res);
    this.#req = undefined;
    this.#res = undefined;
    // A request still waiting for its response is in info() only when recorded (kept by #recorded).
    this.#pending = undefined;
    this.#lastPending = undefined;
    return true;
  }

  info(): Http1Info {
    return {
      protocol: 'http1',
      exchanges: this.#exchangeList(),
      requests: this.#requests,
      responses: this.#responses,
      upgrade: this.#upgrade,
      truncated: this.#stoppedBy === 'truncated',
      malformed: this.#stoppedBy === 'malformed',
    };
  }

  #feed(d: Direction, buf: Buffer, nowMs: number): void {
    let i = 0;
    const n = buf.length;
    while (i < n && this.#stoppedBy === undefined) {
      const st = d.state;
      if (st === S_BODY || st === S_CHUNK_DATA) {
        const left = n - i;
        if (d.remaining > left) {
          d.remaining -= left;
          return;
        }
        i += d.remaining;
        d.remaining = 0;
        if (st === S_BODY) this.#messageEnd(d, nowMs);
        else d.state = S_CHUNK_END;
        continue;
      }
      if (st === S_OPAQUE) return;
      if (st === S_START && d.lineLen === 0) d.startMs = nowMs;
      const j = findByte(buf, 0x0a, i, n);
      if (j === -1) {
        this.#stash(d, buf, i, n);
        return;
      }
      if (d.skipping) {
        d.skipping = false;
        i = j + 1;
        continue;
      }
      if (d.lineLen > 0) {
        if (!this.#append(d, buf, i, j)) return;
        const len = d.lineLen;
        d.lineLen = 0;
        d.colonSeen = false;
        i = j + 1;
        this.#line(d, d.line!, 0, len, nowMs);
      } else {
        const s = i;
        i = j + 1;
        this.#line(d, buf, s, j, nowMs);
      }
    }
  }

  /** Keeps the start of a line that continues in the next chunk, unless it is a header we drop. */
  #stash(d: Direction, buf: Buffer, i: number, n: number): void {
    if (d.skipping || i >= n) return;
    if ((d.state === S_HEADERS || d.state === S_TRAILERS) && !d.colonSeen) {
      const c = buf.indexOf(0x3a, i);
      if (c !== -1 && c < n) {
        if (!this.#append(d, buf, i, c)) return;
        if (d.state === S_TRAILERS || this.#headerId(d, d.line!, 0, d.lineLen) === H_OTHER) {
          d.skipping = true;
          d.lineLen = 0;
          return;
        }
        d.colonSeen = true;
        i = c;
      }
    }
    this.#append(d, buf, i, n);
  }

  /** Appends buf[s, e) to the pending line; false (and stopped) past MAX_LINE. */
  #append(d: Direction, buf: Buffer, s: number, e: number): boolean {
    const need = d.lineLen + (e - s);
    if (need > MAX_LINE) {
      this.#stop('truncated');
      return false;
    }
    if (d.line === undefined || d.line.length < need) {
      const next = Buffer.allocUnsafe(Math.min(MAX_LINE, Math.max(256, need * 2)));
      if (d.line !== undefined) d.line.copy(next, 0, 0, d.lineLen);
      d.line = next;
    }
    buf.copy(d.line, d.lineLen, s, e);
    d.lineLen = need;
    return true;
  }

  /** One complete line b[s, e) (without its LF) in state d.state. */
  #line(d: Direction, b: Buffer, s: number, e: number, nowMs: number): void {
    const raw = e - s;
    if (e > s && b[e - 1] === 0x0d) e--;
    switch (d.state) {
      case S_START:
        if (e === s) return; // RFC 9112 §2.2: ignore empty lines before a request line.
        if (raw > MAX_LINE) {
          this.#stop('truncated');
          return;
        }
        if (d.isRequest) this.#requestLine(d, b, s, e);
        else this.#statusLine(d, b, s, e);
        return;
      case S_HEADERS:
      case S_TRAILERS: {
        if (e === s) {
          if (d.state === S_HEADERS) this.#headEnd(d, nowMs);
          else this.#messageEnd(d, nowMs);
          return;
        }
        const c = findByte(b, 0x3a, s, e);
        const id = c === -1 || c >= e || c - s > MAX_LINE ? -1 : this.#headerId(d, b, s, c);
        if (id === H_OTHER || (id !== -1 && d.state === S_TRAILERS)) return;
        if (raw > MAX_LINE) {
          this.#stop('truncated');
          return;
        }
        if (id === -1) {
          this.#stop('malformed');
          return;
        }
        this.#header(d, id, b, c + 1, e);
        return;
      }
      case S_CHUNK_SIZE: {
        if (raw > MAX_LINE) {
          this.#stop('truncated');
          return;
        }
        let size = 0;
        let digits = 0;
        for (let p = s; p < e; p++) {
          const c = b[p]!;
          const v =
            c >= 0x30 && c <= 0x39
              ? c - 0x30
              : (c | 0x20) >= 0x61 && (c | 0x20) <= 0x66
                ? (c | 0x20) - 87
                : -1;
          if (v === -1) {
            if (c === 0x3b || c === 0x20 || c === 0x09) break; // chunk extensions
            this.#stop('malformed');
            return;
          }
          if (++digits > 12) {
            this.#stop('malformed');
            return;
          }
          size = size * 16 + v;
        }
        if (digits === 0) {
          this.#stop('malformed');
          return;
        }
        if (size === 0) d.state = S_TRAILERS;
        else {
          d.remaining = size;
          d.state = S_CHUNK_DATA;
        }
        return;
      }
      case S_CHUNK_END:
        if (e !== s) {
          this.#stop('malformed');
          return;
        }
        d.state = S_CHUNK_SIZE;
        return;
    }
  }

  #headerId(d: Direction, b: Buffer, s: number, e: number): number {
    switch (e - s) {
      case 4:
        return d.isRequest && equalsLower(b, s, e, 'host') ? H_HOST : H_OTHER;
      case 7:
        return d.isRequest && equalsLower(b, s, e, 'upgrade') ? H_UPGRADE : H_OTHER;
      case 14:
        return equalsLower(b, s, e, 'content-length') ? H_CONTENT_LENGTH : H_OTHER;
      case 17:
        return equalsLower(b, s, e, 'transfer-encoding') ? H_TRANSFER_ENCODING : H_OTHER;
      default:
        return H_OTHER;
    }
  }

  /** A kept header's value b[s, e) (after the colon). */
  #header(d: Direction, id: number, b: Buffer, s: number, e: number): void {
    while (s < e && (b[s] === 0x20 || b[s] === 0x09)) s++;
    while (e > s && (b[e - 1] === 0x20 || b[e - 1] === 0x09)) e--;
    if (id === H_HOST) {
      // uri-host[:port] is visible ASCII; anything else means we lost the line structure.
      for (let p = s; p < e; p++) {
        if (b[p]! < 0x21 || b[p]! > 0x7e) {
          this.#stop('malformed');
          return;
        }
      }
      if (d.host === undefined) d.host = strings.get(b, s, e, MAX_HOST);
    } else if (id === H_UPGRADE) {
      d.upgrade = latin1(b, s, e, 32).toLowerCase();
    } else if (id === H_CONTENT_LENGTH) {
      let v = 0;
      if (e === s || e - s > 15) {
        this.#stop('malformed');
        return;
      }
      for (let p = s; p < e; p++) {
        const c = b[p]!;
        if (c < 0x30 || c > 0x39) {
          this.#stop('malformed');
          return;
        }
        v = v * 10 + (c - 0x30);
      }
      d.contentLength = v;
    } else {
      // Only the last coding matters for framing: "gzip, chunked" is chunked.
      let t = e;
      while (t > s && b[t - 1] !== 0x2c && b[t - 1] !== 0x20) t--;
      if (equalsLower(b, t, e, 'chunked')) d.chunked = true;
      else {
        d.chunked = false;
        d.otherCoding = true;
      }
    }
  }

  #requestLine(d: Direction, b: Buffer, s: number, e: number): void {
    let p = s;
    while (p < e && p - s <= MAX_METHOD) {
      const c = b[p]!;
      if (c === 0x20) break;
      // Methods are tokens; in practice upper-case letters, '-' and '_'.
      if (!((c >= 0x41 && c <= 0x5a) || c === 0x2d || c === 0x5f)) {
        this.#stop('malformed');
        return;
      }
      p++;
    }
    if (p === s || p >= e || b[p] !== 0x20) {
      this.#stop('malformed');
      return;
    }
    const ts = p + 1;
    let sp = e - 1;
    while (sp >= ts && b[sp] !== 0x20) sp--;
    if (sp < ts || !isHttpVersion(b, sp + 1, e)) {
      this.#stop('malformed');
      return;
    }
    let te = ts;
    while (te < sp && b[te] !== 0x3f && b[te] !== 0x23) te++;
    d.method = methodString(b, s, p);
    d.path = strings.get(b, ts, te, MAX_PATH);
    d.version = versionString(b, sp + 1);
    d.resetHead();
    d.state = S_HEADERS;
  }

  #statusLine(d: Direction, b: Buffer, s: number, e: number): void {
    if (e - s < 12 || !isHttpVersion(b, s, s + 8) || b[s + 8] !== 0x20) {
      this.#stop('malformed');
      return;
    }
    let status = 0;
    for (let p = s + 9; p < s + 12; p++) {
      const c = b[p]!;
      if (c < 0x30 || c > 0x39) {
        this.#stop('malformed');
        return;
      }
      status = status * 10 + (c - 0x30);
    }
    if (e > s + 12 && b[s + 12] !== 0x20) {
      this.#stop('malformed');
      return;
    }
    d.status = status;
    d.resetHead();
    d.state = S_HEADERS;
    const p = this.#pending;
    if (p !== undefined && p.ttfbMs === undefined) p.ttfbMs = d.startMs - p.startMs;
  }

  #headEnd(d: Direction, nowMs: number): void {
    if (d.isRequest) {
      this.#requestHeadEnd(d);
      return;
    }
    const p = this.#pending;
    const status = d.status;
    if (status >= 100 && status < 200) {
      if (status === 101) {
        if (p !== undefined) p.status = 101;
        this.#upgrade = p?.upgrade ?? 'unknown';
        this.#respond(p, 101, nowMs);
        this.#stop('upgrade');
        return;
      }
      d.state = S_START; // interim response: the final one follows for the same request
      return;
    }
    if (p !== undefined) p.status = status;
    this.#respond(p, status, nowMs);
    if (p?.connect && status < 300) {
      this.#upgrade = 'connect';
      this.#stop('upgrade');
      return;
    }
    if (p?.head || status === 204 || status === 304) {
      this.#messageEnd(d, nowMs);
      return;
    }
    this.#bodyStart(d, nowMs);
  }

  #requestHeadEnd(d: Direction): void {
    if (d.otherCoding && !d.chunked) {
      this.#stop('malformed'); // RFC 9112 §6.3: a request body we cannot frame
      return;
    }
    if (this.#pendingCount >= MAX_PIPELINE) {
      this.#stop('truncated');
      return;
    }
    const index = this.#requests++;
    const x = new Exchange(index, d);
    // The first maxRequests are recorded (a list of at most maxRequests: found by walking it).
    if (index < this.#limits.maxRequests) {
      let last = this.#recorded;
      if (last === undefined) this.#recorded = x;
      else {
        while (last.nextRecorded !== undefined) last = last.nextRecorded;
        last.nextRecorded = x;
      }
    }
    if (this.#lastPending === undefined) this.#pending = x;
    else this.#lastPending.nextPending = x;
    this.#lastPending = x;
    this.#pendingCount++;
    const sink = this.#limits.onEvent;
    if (sink) {
      sink({
        type: 'http-request',
        index,
        method: x.method,
        path: x.path,
        version: x.version,
        host: x.host,
        atMs: x.startMs,
      });
    }
    if (x.connect) {
      d.state = S_OPAQUE; // the client waits for the tunnel; what follows is not HTTP
      return;
    }
    this.#bodyStart(d, 0);
  }

  #bodyStart(d: Direction, nowMs: number): void {
    if (d.chunked) d.state = S_CHUNK_SIZE;
    else if (d.contentLength > 0 && !d.otherCoding) {
      d.remaining = d.contentLength;
      d.state = S_BODY;
    } else if ((d.contentLength === 0 && !d.otherCoding) || d.isRequest) this.#messageEnd(d, nowMs);
    else {
      // A response without framing runs to the end of the connection: nothing after it to see.
      this.#responseComplete(undefined);
      this.#stop('eof');
    }
  }

  #respond(p: Exchange | undefined, status: number, nowMs: number): void {
    this.#responses++;
    const sink = this.#limits.onEvent;
    if (sink === undefined || p === undefined) return;
    sink({
      type: 'http-response',
      index: p.index,
      method: p.method,
      path: p.path,
      host: p.host,
      status,
      ttfbMs: p.ttfbMs ?? nowMs - p.startMs,
      atMs: nowMs,
    });
  }

  #messageEnd(d: Direction, nowMs: number): void {
    d.state = S_START;
    if (!d.isRequest) this.#responseComplete(nowMs);
  }

  #responseComplete(nowMs: number | undefined): void {
    const p = this.#pending;
    if (p === undefined) return;
    this.#pending = p.nextPending;
    p.nextPending = undefined;
    if (this.#pending === undefined) this.#lastPending = undefined;
    this.#pendingCount--;
    if (nowMs !== undefined) p.durationMs = nowMs - p.startMs;
  }

  #exchangeList(): HttpExchange[] {
    const list: HttpExchange[] = [];
    for (let x = this.#recorded; x !== undefined; x = x.nextRecorded) list.push(x.toJSON());
    return list;
  }

  #stop(why: StopReason): void {
    // The first reason stays (a stop ends the parse: no second one follows).
    this.#stoppedBy ??= why;
  }
}

/** `HTTP/d.d` at b[s, e)? */
function isHttpVersion(b: Buffer, s: number, e: number): boolean {
  return (
    e - s === 8 &&
    b[s] === 0x48 &&
    b[s + 1] === 0x54 &&
    b[s + 2] === 0x54 &&
    b[s + 3] === 0x50 &&
    b[s + 4] === 0x2f &&
    b[s + 5]! >= 0x30 &&
    b[s + 5]! <= 0x39 &&
    b[s + 6] === 0x2e &&
    b[s + 7]! >= 0x30 &&
    b[s + 7]! <= 0x39
  );
}

function versionString(b: Buffer, s: number): string {
  if (b[s + 5] === 0x31) {
    if (b[s + 7] === 0x31) return 'HTTP/1.1';
    if (b[s + 7] === 0x30) return 'HTTP/1.0';
  }
  return b.toString('latin1', s, s + 8);
}

/** First index of `byte` in b[s, e), or -1. Lines are short: a JS scan beats the native call up to ~64 bytes. */
function findByte(b: Buffer, byte: number, s: number, e: number): number {
  const stop = e - s > 64 ? s + 64 : e;
  for (let p = s; p < stop; p++) if (b[p] === byte) return p;
  if (stop === e) return -1;
  const j = b.indexOf(byte, stop);
  return j === -1 || j >= e ? -1 : j;
}

const METHODS = ['GET', 'POST', 'PUT', 'HEAD', 'DELETE', 'PATCH', 'OPTIONS', 'CONNECT'];

/** The method as a string, without a copy for the common ones. */
function methodString(b: Buffer, s: number, e: number): string {
  for (const m of METHODS) {
    if (m.length !== e - s) continue;
    let i = 0;
    while (i < m.length && b[s + i] === m.charCodeAt(i)) i++;
    if (i === m.length) return m;
  }
  return b.toString('latin1', s, e);
}
