// DNS sniffer: header and first question of each message, responses matched to queries by ID, over UDP
// (one message per datagram) and TCP (2-byte length prefix). Pure: no I/O; never throws; bounded memory.
import { ByteCollector } from './bytes.ts';
import type { DnsExchange, DnsInfo, Sniffer, SniffLimits } from './types.ts';

/** The header and first question of one DNS message. */
export type DnsMessage = {
  readonly id: number;
  /** QR bit: a response. */
  readonly response: boolean;
  readonly opcode: number;
  readonly rcode: number;
  /** TC bit. */
  readonly truncated: boolean;
  readonly qdcount: number;
  readonly ancount: number;
  readonly nscount: number;
  readonly arcount: number;
  /** First question's name (see DnsExchange.qname); undefined when there is none or it is malformed. */
  readonly qname: string | undefined;
  readonly qtype: number | undefined;
};

const TYPE_NAMES: Record<number, string> = {
  1: 'A',
  2: 'NS',
  5: 'CNAME',
  6: 'SOA',
  12: 'PTR',
  13: 'HINFO',
  15: 'MX',
  16: 'TXT',
  28: 'AAAA',
  33: 'SRV',
  35: 'NAPTR',
  39: 'DNAME',
  41: 'OPT',
  43: 'DS',
  46: 'RRSIG',
  47: 'NSEC',
  48: 'DNSKEY',
  50: 'NSEC3',
  52: 'TLSA',
  64: 'SVCB',
  65: 'HTTPS',
  99: 'SPF',
  251: 'IXFR',
  252: 'AXFR',
  255: 'ANY',
  257: 'CAA',
};

const RCODE_NAMES = [
  'NOERROR',
  'FORMERR',
  'SERVFAIL',
  'NXDOMAIN',
  'NOTIMP',
  'REFUSED',
  'YXDOMAIN',
  'YXRRSET',
  'NXRRSET',
  'NOTAUTH',
  'NOTZONE',
];

/** `A`, `AAAA`, ... or `TYPE<n>` (RFC 3597). */
export function dnsTypeName(t: number): string {
  return TYPE_NAMES[t] ?? 'TYPE' + t;
}

/** `NOERROR`, `NXDOMAIN`, ... or `RCODE<n>`. */
export function dnsRcodeName(r: number): string {
  return RCODE_NAMES[r] ?? 'RCODE' + r;
}

const MAX_POINTERS = 16;
// The presentation form is built here, then decoded once: one native call instead of a string per byte.
// 255 wire bytes escape to at most 4 characters each.
const scratch = Buffer.allocUnsafe(1024);
let nameNext = 0;

/** Reads a (possibly compressed) name at p; sets nameNext to the byte after it in the message. */
function readName(b: Buffer, p: number, base: number, end: number): string | undefined {
  let n = 0;
  let total = 0;
  let jumps = 0;
  let after = -1;
  for (;;) {
    if (p >= end) return undefined;
    const len = b[p]!;
    if (len === 0) {
      if (after === -1) after = p + 1;
      break;
    }
    if ((len & 0xc0) === 0xc0) {
      if (p + 1 >= end) return undefined;
      const target = base + (((len & 0x3f) << 8) | b[p + 1]!);
      if (after === -1) after = p + 2;
      // Only strictly backwards, and a few times: no pointer loop can run.
      if (target >= p || ++jumps > MAX_POINTERS) return undefined;
      p = target;
      continue;
    }
    if (len > 63) return undefined;
    const s = p + 1;
    const e = s + len;
    total += len + 1;
    if (e > end || total > 255) return undefined;
    if (n > 0) scratch[n++] = 0x2e;
    for (let q = s; q < e; q++) {
      const c = b[q]!;
      if (c > 0x20 && c < 0x7f && c !== 0x2e && c !== 0x5c) scratch[n++] = c;
      else {
        scratch[n++] = 0x5c;
        scratch[n++] = 0x30 + Math.floor(c / 100);
        scratch[n++] = 0x30 + (Math.floor(c / 10) % 10);
        scratch[n++] = 0x30 + (c % 10);
      }
    }
    p = e;
  }
  nameNext = after;
  return n === 0 ? '.' : scratch.toString('latin1', 0, n);
}

/**
 * Parses the header and first question of one DNS message in buf[off, end) (a UDP datagram, or a TCP
 * message after its length prefix). Undefined when shorter than the 12-byte header. `withQuestion` false
 * skips the question (qname/qtype undefined) when only the header is wanted. Cheap: no allocation besides
 * the result and the name string; never reads out of bounds; never throws.
 */
export function parseDnsMessage(
  buf: Buffer,
  off = 0,
  end: number = buf.length,
  withQuestion = true,
): DnsMessage | undefined {
  if (end > buf.length) end = buf.length;
  if (off < 0 || end - off < 12) return undefined;
  const flags = (buf[off + 2]! << 8) | buf[off + 3]!;
  const qdcount = (buf[off + 4]! << 8) | buf[off + 5]!;
  let qname: string | undefined;
  let qtype: number | undefined;
  if (qdcount > 0 && withQuestion) {
    qname = readName(buf, off + 12, off, end);
    if (qname !== undefined && nameNext + 2 <= end) qtype = (buf[nameNext]! << 8) | buf[nameNext + 1]!;
    else qname = undefined;
  }
  return {
    id: (buf[off]! << 8) | buf[off + 1]!,
    response: (flags & 0x8000) !== 0,
    opcode: (flags >> 11) & 0x0f,
    rcode: flags & 0x0f,
    truncated: (flags & 0x0200) !== 0,
    qdcount,
    ancount: (buf[off + 6]! << 8) | buf[off + 7]!,
    nscount: (buf[off + 8]! << 8) | buf[off + 9]!,
    arcount: (buf[off + 10]! << 8) | buf[off + 11]!,
    qname,
    qtype,
  };
}

// Bytes 2..12 of a plain query: flags, counts, first label length.
const QUERY_CHECKS: readonly ((c: number) => boolean)[] = [
  (c) => (c & 0xfc) === 0, // QR=0, opcode QUERY, AA=0 (TC and RD free)
  (c) => (c & 0x4f) === 0, // Z=0, rcode 0
  (c) => c === 0,
  (c) => c === 1, // qdcount 1
  (c) => c === 0,
  (c) => c === 0, // ancount 0
  (c) => c === 0,
  (c) => c === 0, // nscount 0
  (c) => c === 0,
  (c) => c <= 2, // arcount: EDNS OPT, maybe a TSIG
  (c) => c <= 63, // first label length (0: the root)
];

/**
 * Does buf[off, end) look like a standard DNS query (QR=0, opcode QUERY, one question, no answers, a sane
 * first label)? 'more' until the 13 bytes needed to tell are there.
 */
export function looksLikeDnsQuery(buf: Buffer, off: number, end: number): 'yes' | 'no' | 'more' {
  for (let i = 0; i < QUERY_CHECKS.length; i++) {
    const p = off + 2 + i;
    if (p >= end) return 'more';
    if (!QUERY_CHECKS[i]!(buf[p]!)) return 'no';
  }
  return 'yes';
}

/** A TCP message keeps at most this much: the header and first question always fit. */
const TCP_KEEP = 512;
const MAX_PENDING = 64;

type MutableExchange = { -readonly [K in keyof DnsExchange]: DnsExchange[K] };

/** One direction of DNS over TCP: a length prefix, then the message. */
class TcpFraming {
  readonly prefix = new ByteCollector();
  readonly body = new ByteCollector();
  inBody = false;
  /** Bytes to drop now: the tail of a message longer than TCP_KEEP. */
  skip = 0;
  after = 0;
  constructor() {
    this.prefix.reset(2);
  }
}

/** Sniffs a DNS session (UDP) or connection (TCP). */
export class DnsSniffer implements Sniffer {
  readonly #transport: 'udp' | 'tcp';
  readonly #limits: SniffLimits;
  readonly #exchanges: MutableExchange[] = [];
  readonly #pending = new Map<number, MutableExchange>();
  readonly #client: TcpFraming | undefined;
  readonly #server: TcpFraming | undefined;
  #queries = 0;
  #responses = 0;
  #unmatched = 0;
  #malformed = 0;

  constructor(transport: 'udp' | 'tcp', limits: SniffLimits) {
    this.#transport = transport;
    this.#limits = limits;
    if (transport === 'tcp') {
      this.#client = new TcpFraming();
      this.#server = new TcpFraming();
    }
  }

  get done(): boolean {
    if (this.#limits.keepCounting || this.#exchanges.length < this.#limits.maxRequests) return false;
    return this.#pending.size === 0 || this.#queries >= 2 * this.#limits.maxRequests;
  }

  onClientData(buf: Buffer, nowMs: number): void {
    if (this.#client === undefined) this.#message(false, buf, 0, buf.length, nowMs);
    else this.#frames(this.#client, false, buf, nowMs);
  }

  onEndpointData(buf: Buffer, nowMs: number): void {
    if (this.#server === undefined) this.#message(true, buf, 0, buf.length, nowMs);
    else this.#frames(this.#server, true, buf, nowMs);
  }

  info(): DnsInfo {
    return {
      protocol: 'dns',
      transport: this.#transport,
      exchanges: this.#exchanges.map((x) => ({ ...x })),
      queries: this.#queries,
      responses: this.#responses,
      unmatched: this.#unmatched,
      malformed: this.#malformed,
    };
  }

  #frames(f: TcpFraming, fromServer: boolean, buf: Buffer, nowMs: number): void {
    let i = 0;
    const n = buf.length;
    while (i < n) {
      if (f.skip > 0) {
        const take = Math.min(f.skip, n - i);
        f.skip -= take;
        i += take;
        continue;
      }
      if (!f.inBody) {
        i = f.prefix.push(buf, i, n);
        if (!f.prefix.full) return;
        const len = f.prefix.take().readUInt16BE(0);
        f.prefix.reset(2);
        if (len === 0) {
          this.#malformed++;
          continue;
        }
        const keep = Math.min(len, TCP_KEEP);
        f.after = len - keep;
        f.body.reset(keep);
        f.inBody = true;
        continue;
      }
      i = f.body.push(buf, i, n);
      if (!f.body.full) return;
      const msg = f.body.take();
      f.inBody = false;
      f.skip = f.after;
      this.#message(fromServer, msg, 0, msg.length, nowMs);
    }
  }

  #message(fromServer: boolean, buf: Buffer, off: number, end: number, nowMs: number): void {
    // A matched response's question is the query's: only the header is read, unless nobody asked.
    let m = parseDnsMessage(buf, off, end, !fromServer);
    if (m !== undefined && fromServer && !this.#pending.has(m.id)) m = parseDnsMessage(buf, off, end);
    if (
      m === undefined ||
      m.response !== fromServer ||
      (m.qdcount > 0 && m.qname === undefined && !fromServer)
    ) {
      this.#malformed++;
      return;
    }
    const sink = this.#limits.onEvent;
    if (!fromServer) {
      const qtype = m.qtype === undefined ? undefined : dnsTypeName(m.qtype);
      this.#queries++;
      const x: MutableExchange = {
        id: m.id,
        qname: m.qname,
        qtype,
        startMs: nowMs,
        rcode: undefined,
        answers: undefined,
        truncated: undefined,
        latencyMs: undefined,
      };
      if (this.#exchanges.length < this.#limits.maxRequests) this.#exchanges.push(x);
      // A retransmission keeps the first send time.
      if (!this.#pending.has(m.id) && this.#pending.size < MAX_PENDING) this.#pending.set(m.id, x);
      if (sink) sink({ type: 'dns-query', id: m.id, qname: m.qname, qtype, atMs: nowMs });
      return;
    }
    this.#responses++;
    const rcode = dnsRcodeName(m.rcode);
    const x = this.#pending.get(m.id);
    let latencyMs: number | undefined;
    if (x === undefined) this.#unmatched++;
    else {
      this.#pending.delete(m.id);
      latencyMs = nowMs - x.startMs;
      x.rcode = rcode;
      x.answers = m.ancount;
      x.truncated = m.truncated;
      x.latencyMs = latencyMs;
    }
    if (sink)
      sink({
        type: 'dns-response',
        id: m.id,
        qname: x === undefined ? m.qname : x.qname,
        qtype: x === undefined ? (m.qtype === undefined ? undefined : dnsTypeName(m.qtype)) : x.qtype,
        rcode,
        answers: m.ancount,
        latencyMs,
        atMs: nowMs,
      });
  }
}
