// TLS sniffer: SNI, ALPN and versions from the ClientHello (across records and chunks, up to 16 KiB), and
// the version/ALPN the ServerHello picked. Pure: no I/O; never throws; bounded memory.
import { ByteCollector } from './bytes.ts';
import type { Sniffer, TlsInfo } from './types.ts';

/** Envoy's tls_inspector gives up at the same size. */
const MAX_HELLO_BYTES = 16384;
const MAX_RECORD = 16384 + 2048;
const MAX_NAME = 255;
const MAX_ALPN = 16;
const HANDSHAKE = 0x16;
const ALERT = 0x15;

/** `TLS1.2`, `TLS1.3`, ... or `0x7f1c` for anything else. */
function tlsVersionName(v: number): string {
  switch (v) {
    case 0x0304:
      return 'TLS1.3';
    case 0x0303:
      return 'TLS1.2';
    case 0x0302:
      return 'TLS1.1';
    case 0x0301:
      return 'TLS1.0';
    case 0x0300:
      return 'SSL3.0';
    default:
      return '0x' + v.toString(16).padStart(4, '0');
  }
}

// Interned: decoding these from bytes on every connection is most of a hello's parse cost.
const COMMON_ALPN = [
  'h2',
  'http/1.1',
  'http/1.0',
  'h3',
  'postgresql',
  'redis',
  'mysql',
  'acme-tls/1',
  'grpc-exp',
];

function alpnString(b: Buffer, s: number, e: number): string {
  for (const a of COMMON_ALPN) {
    if (a.length !== e - s) continue;
    let i = 0;
    while (i < a.length && b[s + i] === a.charCodeAt(i)) i++;
    if (i === a.length) return a;
  }
  return b.toString('latin1', s, e);
}

function isGrease(v: number): boolean {
  return (v & 0x0f0f) === 0x0a0a && v >> 8 === (v & 0xff);
}

/** Does a chunk starting with these bytes look like a TLS handshake record? 'more' until 3 bytes are there. */
export function looksLikeTls(buf: Buffer, off: number, end: number): 'yes' | 'no' | 'more' {
  if (off >= end) return 'more';
  if (buf[off] !== HANDSHAKE) return 'no';
  if (off + 1 >= end) return 'more';
  if (buf[off + 1] !== 0x03) return 'no';
  if (off + 2 >= end) return 'more';
  return buf[off + 2]! <= 0x04 ? 'yes' : 'no';
}

const R_HEADER = 0;
const R_BODY = 1;
const R_DONE = 2;

/** Reassembles the first handshake message of one direction from TLS records. */
class HelloReader {
  phase = R_HEADER;
  tooLarge = false;
  malformed = false;
  alert: number | undefined = undefined;
  readonly #type: number;
  readonly #record = new ByteCollector();
  readonly #hsHeader = new ByteCollector();
  readonly #hsBody = new ByteCollector();
  readonly #alertBody = new ByteCollector();
  #inAlert = false;
  #recordLeft = 0;
  #bodyStarted = false;

  constructor(handshakeType: number) {
    this.#type = handshakeType;
    this.#record.reset(5);
    this.#hsHeader.reset(4);
  }

  /** Feeds bytes; returns the complete handshake body once (then phase is R_DONE), else undefined. */
  feed(buf: Buffer): Buffer | undefined {
    let i = 0;
    const n = buf.length;
    while (i < n && this.phase !== R_DONE) {
      if (this.phase === R_HEADER) {
        i = this.#record.push(buf, i, n);
        if (!this.#record.full) return undefined;
        const h = this.#record.take();
        this.#record.reset(5);
        const len = h.readUInt16BE(3);
        if (
          h[0] === ALERT &&
          this.#hsHeader.have === 0 &&
          !this.#bodyStarted &&
          len >= 2 &&
          len <= MAX_RECORD
        ) {
          this.#inAlert = true;
          this.#alertBody.reset(2);
        } else if (h[0] !== HANDSHAKE || h[1] !== 0x03 || len === 0 || len > MAX_RECORD) {
          return this.#fail();
        }
        this.#recordLeft = len;
        this.phase = R_BODY;
        continue;
      }
      const end = n - i > this.#recordLeft ? i + this.#recordLeft : n;
      const start = i;
      if (this.#inAlert) {
        // An alert instead of a hello: level, then description.
        i = this.#alertBody.push(buf, i, end);
        if (this.#alertBody.full) {
          this.alert = this.#alertBody.take()[1];
          this.phase = R_DONE;
          return undefined;
        }
      } else {
        if (!this.#bodyStarted) {
          i = this.#hsHeader.push(buf, i, end);
          if (this.#hsHeader.full) {
            const hh = this.#hsHeader.take();
            const bodyLen = hh.readUIntBE(1, 3);
            if (hh[0] !== this.#type) return this.#fail();
            if (bodyLen + 4 > MAX_HELLO_BYTES) {
              this.tooLarge = true;
              this.phase = R_DONE;
              return undefined;
            }
            this.#hsBody.reset(bodyLen);
            this.#bodyStarted = true;
          }
        }
        if (this.#bodyStarted) {
          i = this.#hsBody.push(buf, i, end);
          if (this.#hsBody.full) {
            this.phase = R_DONE;
            return this.#hsBody.take();
          }
        }
      }
      this.#recordLeft -= i - start;
      if (this.#recordLeft === 0) this.phase = R_HEADER;
    }
    return undefined;
  }

  /** The part of an unfinished handshake body that has arrived (copied), for best-effort parsing. */
  partial(): Buffer | undefined {
    if (this.phase === R_DONE || !this.#bodyStarted) return undefined;
    return this.#hsBody.partial();
  }

  #fail(): undefined {
    this.malformed = true;
    this.phase = R_DONE;
    return undefined;
  }
}

type ClientHelloFields = {
  sni: string | undefined;
  alpn: string[];
  legacyVersion: string | undefined;
  supportedVersions: string[];
};

/**
 * Parses a ClientHello body (after the 4-byte handshake header). Tolerates truncation: fields before the
 * cut are returned; `ok` is true only when the structure runs exactly to the end of `b`.
 */
export function parseClientHello(b: Buffer): ClientHelloFields & { ok: boolean } {
  const out: ClientHelloFields & { ok: boolean } = {
    sni: undefined,
    alpn: [],
    legacyVersion: undefined,
    supportedVersions: [],
    ok: false,
  };
  const n = b.length;
  if (n < 2) return out;
  out.legacyVersion = tlsVersionName(b.readUInt16BE(0));
  let p = 34; // version + random
  if (p >= n) return out;
  p += 1 + b[p]!; // session id
  if (p + 2 > n) return out;
  p += 2 + b.readUInt16BE(p); // cipher suites
  if (p >= n) return out;
  p += 1 + b[p]!; // compression methods
  if (p === n) {
    out.ok = true; // no extensions at all (TLS 1.2 and older may do that)
    return out;
  }
  if (p + 2 > n) return out;
  const extEnd = p + 2 + b.readUInt16BE(p);
  const end = Math.min(n, extEnd);
  p += 2;
  while (p + 4 <= end) {
    const type = b.readUInt16BE(p);
    const len = b.readUInt16BE(p + 2);
    const s = p + 4;
    const e = s + len;
    if (e > end) return out;
    if (type === 0x0000) readServerName(b, s, e, out);
    else if (type === 0x0010) readAlpn(b, s, e, out.alpn);
    else if (type === 0x002b && len >= 1) {
      const vEnd = Math.min(e, s + 1 + b[s]!);
      for (let q = s + 1; q + 2 <= vEnd; q += 2) {
        const v = b.readUInt16BE(q);
        if (!isGrease(v)) out.supportedVersions.push(tlsVersionName(v));
      }
    }
    p = e;
  }
  out.ok = p === extEnd && extEnd === n;
  return out;
}

function readServerName(b: Buffer, s: number, e: number, out: ClientHelloFields): void {
  if (s + 2 > e) return;
  const listEnd = Math.min(e, s + 2 + b.readUInt16BE(s));
  for (let q = s + 2; q + 3 <= listEnd; ) {
    const nameType = b[q]!;
    const len = b.readUInt16BE(q + 1);
    const ns = q + 3;
    if (ns + len > listEnd) return;
    if (nameType === 0 && out.sni === undefined)
      out.sni = b.toString('latin1', ns, ns + Math.min(len, MAX_NAME));
    q = ns + len;
  }
}

function readAlpn(b: Buffer, s: number, e: number, into: string[]): void {
  if (s + 2 > e) return;
  const listEnd = Math.min(e, s + 2 + b.readUInt16BE(s));
  for (let q = s + 2; q < listEnd && into.length < MAX_ALPN; ) {
    const len = b[q]!;
    if (len === 0 || q + 1 + len > listEnd) return;
    into.push(alpnString(b, q + 1, q + 1 + len));
    q += 1 + len;
  }
}

/** Parses a ServerHello body: the selected version and, for TLS 1.2, ALPN. */
function parseServerHello(b: Buffer): { version: string | undefined; alpn: string | undefined } {
  const n = b.length;
  const out = { version: undefined as string | undefined, alpn: undefined as string | undefined };
  if (n < 2) return out;
  out.version = tlsVersionName(b.readUInt16BE(0));
  let p = 34;
  if (p >= n) return out;
  p += 1 + b[p]! + 3; // session id, cipher suite, compression method
  if (p + 2 > n) return out;
  const extEnd = Math.min(n, p + 2 + b.readUInt16BE(p));
  p += 2;
  while (p + 4 <= extEnd) {
    const type = b.readUInt16BE(p);
    const len = b.readUInt16BE(p + 2);
    const s = p + 4;
    if (s + len > extEnd) break;
    if (type === 0x002b && len === 2) out.version = tlsVersionName(b.readUInt16BE(s));
    else if (type === 0x0010) {
      const list: string[] = [];
      readAlpn(b, s, s + len, list);
      out.alpn = list[0];
    }
    p = s + len;
  }
  return out;
}

/** What info() reads of a reader once it is done: its flags (its collectors and their buffers are let go). */
type ReaderResult = {
  readonly phase: number;
  readonly tooLarge: boolean;
  readonly malformed: boolean;
  readonly alert: number | undefined;
  partial(): Buffer | undefined;
};

const noPartial = (): undefined => undefined;
/** The usual end of a reader, a hello read whole: one object for every connection. */
const READ_WHOLE: ReaderResult = Object.freeze({
  phase: R_DONE,
  tooLarge: false,
  malformed: false,
  alert: undefined,
  partial: noPartial,
});

function finished(r: HelloReader): ReaderResult {
  if (!r.tooLarge && !r.malformed && r.alert === undefined) return READ_WHOLE;
  return { phase: R_DONE, tooLarge: r.tooLarge, malformed: r.malformed, alert: r.alert, partial: noPartial };
}

/**
 * Sniffs one TLS connection: done once both hellos were read (or given up on). A direction's reader is
 * replaced by its result once done: a connection whose handshake was seen keeps the hello's fields only.
 */
export class TlsSniffer implements Sniffer {
  #client: HelloReader | ReaderResult = new HelloReader(1);
  #server: HelloReader | ReaderResult = new HelloReader(2);
  #hello: (ClientHelloFields & { ok: boolean }) | undefined = undefined;
  #complete = false;
  #selectedVersion: string | undefined = undefined;
  #selectedAlpn: string | undefined = undefined;

  get done(): boolean {
    return this.#client.phase === R_DONE && this.#server.phase === R_DONE;
  }

  onClientData(buf: Buffer, _nowMs: number): void {
    const r = this.#client;
    if (!(r instanceof HelloReader)) return;
    const body = r.feed(buf);
    if (r.phase === R_DONE) this.#client = finished(r);
    if (body === undefined) return;
    this.#hello = parseClientHello(body);
    this.#complete = this.#hello.ok;
  }

  onEndpointData(buf: Buffer, _nowMs: number): void {
    const r = this.#server;
    if (!(r instanceof HelloReader)) return;
    const body = r.feed(buf);
    if (r.phase === R_DONE) this.#server = finished(r);
    if (body === undefined) return;
    const sh = parseServerHello(body);
    this.#selectedVersion = sh.version;
    this.#selectedAlpn = sh.alpn;
  }

  info(): TlsInfo {
    let hello = this.#hello;
    if (hello === undefined) {
      const part = this.#client.partial();
      if (part !== undefined && part.length > 0) hello = parseClientHello(part);
    }
    return {
      protocol: 'tls',
      sni: hello?.sni,
      alpn: hello ? [...hello.alpn] : [],
      legacyVersion: hello?.legacyVersion,
      supportedVersions: hello ? [...hello.supportedVersions] : [],
      complete: this.#complete,
      tooLarge: this.#client.tooLarge,
      malformed:
        this.#client.malformed || (this.#hello !== undefined && !this.#hello.ok) || this.#server.malformed,
      selectedVersion: this.#selectedVersion,
      selectedAlpn: this.#selectedAlpn,
      alert: this.#server.alert,
    };
  }
}
