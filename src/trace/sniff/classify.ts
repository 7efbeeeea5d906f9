// Picks the protocol of a connection from its first bytes (the client's, or the server's for server-first
// MySQL) and hands every byte to that protocol's sniffer. Pure: no I/O, no timers; never throws.
import { DnsSniffer, looksLikeDnsQuery } from './dns.ts';
import { H2cSniffer, looksLikeH2c } from './h2.ts';
import { Http1Sniffer } from './http1.ts';
import { looksLikeMysqlGreeting, MysqlSniffer } from './mysql.ts';
import { looksLikePostgres, PostgresSniffer } from './postgres.ts';
import { looksLikeRedis, RedisSniffer } from './redis.ts';
import { looksLikeTls, TlsSniffer } from './tls.ts';
import type { AppInfo, SniffEventSink, Sniffer, SniffLimits, UnknownInfo } from './types.ts';

export type CreateSnifferOptions = {
  readonly protocol: 'tcp' | 'udp';
  /** HTTP exchanges, DNS queries or Redis commands recorded in info(); default 16. */
  readonly maxRequests?: number;
  /** After maxRequests, keep parsing to count the rest and emit their events; default false (done). */
  readonly keepCounting?: boolean;
  /** Per-request events (HTTP, DNS, Redis) as they happen; must be cheap and must not throw. */
  readonly onEvent?: SniffEventSink;
};

export const DEFAULT_MAX_REQUESTS = 16;
/** Every signature is decided within this many bytes (the h2 preface is the longest at 24). */
const DECIDE_BYTES = 32;
/** Bytes of the other direction held while the first one is undecided. */
const HOLD_BYTES = 4096;

type Decision = 'tls' | 'h2c' | 'http1' | 'redis' | 'postgres' | 'dns' | 'mysql' | 'no' | 'more';

const CONNECT = 'CONNECT';

/** An HTTP/1 request line start: upper-case method, SP, then an origin, asterisk or absolute target. */
function looksLikeHttpRequest(buf: Buffer, off: number, end: number): 'yes' | 'no' | 'more' {
  let p = off;
  for (; p < end && p - off <= 24; p++) {
    const c = buf[p]!;
    if (c === 0x20) break;
    if (!((c >= 0x41 && c <= 0x5a) || c === 0x2d || c === 0x5f)) return 'no';
  }
  if (p >= end) return 'more';
  if (p === off || buf[p] !== 0x20) return 'no';
  if (p + 1 >= end) return 'more';
  const t = buf[p + 1]!;
  if (t === 0x2f /* / */ || t === 0x2a /* * */) return 'yes';
  if (p - off === CONNECT.length && buf.toString('latin1', off, p) === CONNECT) return 'yes';
  // absolute-form, as sent to forward proxies
  for (let i = 0; i < 7; i++) {
    const q = p + 1 + i;
    if (q >= end) return 'more';
    const want = 'http://'.charCodeAt(i);
    if (buf[q] !== want) return i === 4 && buf[q] === 0x73 /* s */ ? matchHttps(buf, q + 1, end) : 'no';
  }
  return 'yes';
}

function matchHttps(buf: Buffer, p: number, end: number): 'yes' | 'no' | 'more' {
  for (let i = 0; i < 3; i++) {
    if (p + i >= end) return 'more';
    if (buf[p + i] !== '://'.charCodeAt(i)) return 'no';
  }
  return 'yes';
}

function looksLikeDnsOverTcp(buf: Buffer, off: number, end: number): 'yes' | 'no' | 'more' {
  if (end - off < 2) return 'more';
  if (buf.readUInt16BE(off) < 17) return 'no';
  return looksLikeDnsQuery(buf, off + 2, end);
}

/** The server spoke first: only MySQL does. */
function decideServer(buf: Buffer, off: number, end: number): Decision {
  const v = looksLikeMysqlGreeting(buf, off, end);
  return v === 'yes' ? 'mysql' : v === 'more' && end - off < DECIDE_BYTES ? 'more' : 'no';
}

/** The sniffer of a decided protocol. */
function protocolSniffer(d: Decision, transport: 'tcp' | 'udp', limits: SniffLimits): Sniffer {
  switch (d) {
    case 'tls':
      return new TlsSniffer();
    case 'h2c':
      return new H2cSniffer();
    case 'http1':
      return new Http1Sniffer(limits);
    case 'redis':
      return new RedisSniffer(limits);
    case 'postgres':
      return new PostgresSniffer();
    case 'dns':
      return new DnsSniffer(transport, limits);
    default:
      return new MysqlSniffer();
  }
}

/** The client spoke first: try each signature in order; an earlier 'more' waits for more bytes. */
function decideClient(buf: Buffer, off: number, end: number): Decision {
  const rules = CLIENT_RULES;
  for (let r = 0; r < rules.length; r++) {
    const [name, test] = rules[r]!;
    const v = test(buf, off, end);
    if (v === 'yes') return name;
    if (v === 'more') return end - off >= DECIDE_BYTES ? 'no' : 'more';
  }
  return 'no';
}

type Rule = readonly [Decision, (buf: Buffer, off: number, end: number) => 'yes' | 'no' | 'more'];

// Order matters: the h2 preface is also an HTTP/1-looking `PRI *` line.
const CLIENT_RULES: readonly Rule[] = [
  ['tls', looksLikeTls],
  ['h2c', looksLikeH2c],
  ['http1', looksLikeHttpRequest],
  ['redis', looksLikeRedis],
  ['postgres', looksLikePostgres],
  ['dns', looksLikeDnsOverTcp],
];

/** Bytes held back while undecided (copies: the relay may reuse its buffers). */
class Held {
  buf: Buffer | undefined = undefined;
  len = 0;
  overflow = false;

  add(b: Buffer, cap: number): void {
    if (this.len + b.length > cap) {
      this.overflow = true;
      return;
    }
    if (this.buf === undefined) this.buf = Buffer.allocUnsafe(cap);
    b.copy(this.buf, this.len);
    this.len += b.length;
  }

  view(): Buffer {
    return this.buf === undefined ? Buffer.alloc(0) : this.buf.subarray(0, this.len);
  }
}

/** Classifies, then forwards everything to the chosen protocol's sniffer. */
class ClassifyingSniffer implements Sniffer {
  readonly #udp: boolean;
  readonly #limits: SniffLimits;
  #delegate: Sniffer | undefined = undefined;
  #unknown: UnknownInfo['reason'] | undefined = undefined;
  #first: 'client' | 'server' | undefined = undefined;
  readonly #client = new Held();
  readonly #server = new Held();

  constructor(udp: boolean, limits: SniffLimits) {
    this.#udp = udp;
    this.#limits = limits;
  }

  get done(): boolean {
    return this.#delegate !== undefined ? this.#delegate.done : this.#unknown !== undefined;
  }

  onClientData(buf: Buffer, nowMs: number): void {
    if (this.#delegate !== undefined) {
      this.#delegate.onClientData(buf, nowMs);
      return;
    }
    if (this.#unknown !== undefined || buf.length === 0) return;
    if (this.#udp) {
      // One datagram is one whole message: decide on it alone.
      if (looksLikeDnsQuery(buf, 0, buf.length) !== 'yes') {
        this.#giveUp('unrecognized');
        return;
      }
      this.#delegate = protocolSniffer('dns', 'udp', this.#limits);
      this.#delegate.onClientData(buf, nowMs);
      return;
    }
    this.#first ??= 'client';
    this.#arrived(true, buf, nowMs);
  }

  onEndpointData(buf: Buffer, nowMs: number): void {
    if (this.#delegate !== undefined) {
      this.#delegate.onEndpointData(buf, nowMs);
      return;
    }
    if (this.#unknown !== undefined || buf.length === 0 || this.#udp) return;
    this.#first ??= 'server';
    this.#arrived(false, buf, nowMs);
  }

  info(): AppInfo {
    if (this.#delegate !== undefined) return this.#delegate.info();
    const reason = this.#unknown ?? (this.#first === undefined ? 'no-data' : 'incomplete');
    return { protocol: 'unknown', reason };
  }

  #arrived(fromClient: boolean, buf: Buffer, nowMs: number): void {
    const deciding = fromClient === (this.#first === 'client');
    const held = fromClient ? this.#client : this.#server;
    if (!deciding) {
      held.add(buf, HOLD_BYTES);
      if (held.overflow) this.#giveUp('incomplete');
      return;
    }
    let d: Decision;
    if (held.len === 0) {
      d = this.#decide(buf, 0, buf.length);
      if (d === 'no') {
        this.#giveUp('unrecognized');
        return;
      }
      if (d !== 'more') {
        this.#start(d, fromClient, buf, nowMs);
        return;
      }
    }
    // Rare: the signature is split across chunks. Hold at most DECIDE_BYTES and decide on those.
    const room = DECIDE_BYTES - held.len;
    held.add(buf.length > room ? buf.subarray(0, room) : buf, DECIDE_BYTES);
    const v = held.view();
    d = this.#decide(v, 0, v.length);
    if (d === 'more') return;
    if (d === 'no') {
      this.#giveUp('unrecognized');
      return;
    }
    // Replay what was held, then the part of this chunk that did not fit.
    const rest = buf.length > room ? buf.subarray(room) : undefined;
    this.#start(d, fromClient, undefined, nowMs);
    if (rest !== undefined && this.#delegate !== undefined) {
      if (fromClient) this.#delegate.onClientData(rest, nowMs);
      else this.#delegate.onEndpointData(rest, nowMs);
    }
  }

  #decide(buf: Buffer, off: number, end: number): Decision {
    return this.#first === 'client' ? decideClient(buf, off, end) : decideServer(buf, off, end);
  }

  /** Creates the sniffer for `d` and feeds it: held bytes of the first speaker, the other's, then `buf`. */
  #start(d: Decision, fromClient: boolean, buf: Buffer | undefined, nowMs: number): void {
    const s = this.#create(d);
    this.#delegate = s;
    const first = fromClient ? this.#client : this.#server;
    const other = fromClient ? this.#server : this.#client;
    if (first.len > 0) this.#feed(s, fromClient, first.view(), nowMs);
    if (other.len > 0) this.#feed(s, !fromClient, other.view(), nowMs);
    if (buf !== undefined) this.#feed(s, fromClient, buf, nowMs);
    first.buf = undefined;
    other.buf = undefined;
  }

  #feed(s: Sniffer, fromClient: boolean, buf: Buffer, nowMs: number): void {
    if (s.done) return;
    if (fromClient) s.onClientData(buf, nowMs);
    else s.onEndpointData(buf, nowMs);
  }

  #create(d: Decision): Sniffer {
    return protocolSniffer(d, 'tcp', this.#limits);
  }

  #giveUp(reason: UnknownInfo['reason']): void {
    this.#unknown = reason;
    this.#client.buf = undefined;
    this.#server.buf = undefined;
  }
}

/** What a connection that matched no signature is: done from the start, nothing to keep. */
const UNRECOGNIZED: Sniffer = Object.freeze({
  done: true,
  onClientData(): void {},
  onEndpointData(): void {},
  info: (): AppInfo => ({ protocol: 'unknown', reason: 'unrecognized' }),
  end: (): boolean => true,
});

/** Limits for startSniffer, made once and shared by every connection they apply to. */
export function sniffLimits(options: Omit<CreateSnifferOptions, 'protocol'> = {}): SniffLimits {
  return {
    maxRequests: Math.max(1, Math.floor(options.maxRequests ?? DEFAULT_MAX_REQUESTS)),
    keepCounting: options.keepCounting ?? false,
    onEvent: options.onEvent,
  };
}

/**
 * The sniffer of a connection, started by its first bytes (`buf`, from the client or, for a server that
 * speaks first, from the server) and already fed with them; undefined while `buf` is empty. When `buf`
 * alone decides the protocol (the usual case) this is that protocol's sniffer, with no classifier in
 * front of it; a connection that matches nothing gets a shared done sniffer. Behaves as createSniffer()
 * fed the same bytes.
 */
export function startSniffer(
  limits: SniffLimits,
  transport: 'tcp' | 'udp',
  fromClient: boolean,
  buf: Buffer,
  nowMs: number,
): Sniffer | undefined {
  const n = buf.length;
  // A UDP session is the client's: a datagram from the endpoint before any from the client is ignored.
  if (n === 0 || (transport === 'udp' && !fromClient)) return undefined;
  let d: Decision;
  if (transport === 'udp') d = looksLikeDnsQuery(buf, 0, n) === 'yes' ? 'dns' : 'no';
  else d = fromClient ? decideClient(buf, 0, n) : decideServer(buf, 0, n);
  if (d === 'no') return UNRECOGNIZED;
  const s = d === 'more' ? new ClassifyingSniffer(false, limits) : protocolSniffer(d, transport, limits);
  if (fromClient) s.onClientData(buf, nowMs);
  else s.onEndpointData(buf, nowMs);
  return s;
}

/**
 * A sniffer for one TCP connection or UDP session. It classifies from the first bytes (TLS, h2c,
 * HTTP/1, Redis, Postgres, DNS over TCP; MySQL when the server speaks first; DNS for UDP) and reports
 * `unknown` (and done) otherwise.
 */
export function createSniffer(options: CreateSnifferOptions): Sniffer {
  return new ClassifyingSniffer(options.protocol === 'udp', sniffLimits(options));
}
