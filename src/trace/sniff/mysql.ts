// MySQL sniffer: the server speaks first (greeting: protocol 10, server version), then the client's
// HandshakeResponse (user, database, SSL request; never the auth response) and the server's verdict, or the
// TLS hellos after an SSLRequest. Pure: no I/O; never throws; bounded memory.
import { ByteCollector, indexOfNul, latin1 } from './bytes.ts';
import { TlsSniffer } from './tls.ts';
import type { MysqlInfo, Sniffer } from './types.ts';

/** Bytes of a packet's payload we keep: names and flags sit in the first few hundred. */
const KEEP = 1024;
const MAX_VALUE = 255;
const CLIENT_CONNECT_WITH_DB = 0x8;
const CLIENT_PROTOCOL_41 = 0x200;
const CLIENT_SSL = 0x800;
const CLIENT_SECURE_CONNECTION = 0x8000;
const CLIENT_PLUGIN_AUTH = 0x80000;
const CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA = 0x200000;

/** Does buf[off, end) start a MySQL v10 server greeting? 'more' until its 5 bytes are there. */
export function looksLikeMysqlGreeting(buf: Buffer, off: number, end: number): 'yes' | 'no' | 'more' {
  if (end - off < 5) {
    if (end - off >= 4 && buf[off + 3] !== 0) return 'no';
    return 'more';
  }
  const len = buf[off]! | (buf[off + 1]! << 8) | (buf[off + 2]! << 16);
  return len >= 20 && len <= 1024 && buf[off + 3] === 0 && buf[off + 4] === 0x0a ? 'yes' : 'no';
}

/** Splits one direction into packets, keeping at most KEEP bytes of each payload. */
class PacketReader {
  readonly #head = new ByteCollector();
  readonly #body = new ByteCollector();
  #inBody = false;
  #skip = 0;
  #after = 0;
  /** Set by next() when a packet completed; the caller takes it (a view: use it before returning). */
  packet: Buffer | undefined = undefined;

  constructor() {
    this.#head.reset(4);
  }

  next(buf: Buffer, i: number, n: number): number {
    while (i < n) {
      if (this.#skip > 0) {
        const take = Math.min(this.#skip, n - i);
        this.#skip -= take;
        i += take;
        continue;
      }
      if (!this.#inBody) {
        i = this.#head.push(buf, i, n);
        if (!this.#head.full) return i;
        const h = this.#head.take();
        this.#head.reset(4);
        const len = h[0]! | (h[1]! << 8) | (h[2]! << 16);
        const keep = Math.min(len, KEEP);
        this.#after = len - keep;
        this.#body.reset(keep);
        this.#inBody = true;
        if (keep > 0) continue;
      }
      i = this.#body.push(buf, i, n);
      if (!this.#body.full) return i;
      this.packet = this.#body.take();
      this.#inBody = false;
      this.#skip = this.#after;
      return i;
    }
    return i;
  }

  partial(): Buffer {
    return this.#inBody ? this.#body.partial() : Buffer.alloc(0);
  }
}

type Greeting = { serverVersion?: string; connectionId?: number; authPlugin?: string };
type Login = { user?: string; database?: string; ssl: boolean };

/** Parses a v10 greeting payload; tolerant of truncation. */
function parseGreeting(b: Buffer, out: Greeting): void {
  const n = b.length;
  if (n < 2 || b[0] !== 0x0a) return;
  const ve = indexOfNul(b, 1, n);
  if (ve === -1) return;
  out.serverVersion = latin1(b, 1, ve, 64);
  let p = ve + 1;
  if (p + 4 > n) return;
  out.connectionId = b.readUInt32LE(p);
  p += 4 + 8 + 1; // connection id, auth-plugin-data part 1, filler
  if (p + 2 > n) return;
  let caps = b.readUInt16LE(p);
  p += 2 + 1 + 2; // capabilities (low), charset, status
  if (p + 3 > n) return;
  caps |= b.readUInt16LE(p) << 16;
  const authLen = b[p + 2]!;
  p += 2 + 1 + 10; // capabilities (high), auth data length, reserved
  if ((caps & CLIENT_SECURE_CONNECTION) !== 0) p += Math.max(13, authLen - 8);
  if ((caps & CLIENT_PLUGIN_AUTH) === 0 || p >= n) return;
  const pe = indexOfNul(b, p, n);
  if (pe !== -1) out.authPlugin = latin1(b, p, pe, 64);
}

/** Parses a HandshakeResponse (4.1 or 3.20) or SSLRequest payload; tolerant of truncation. */
function parseLogin(b: Buffer, out: Login): void {
  const n = b.length;
  if (n < 4) return;
  const caps = b.readUInt32LE(0);
  if ((caps & CLIENT_PROTOCOL_41) === 0) {
    const ue = indexOfNul(b, 5, n);
    if (ue !== -1) out.user = latin1(b, 5, ue, MAX_VALUE);
    return;
  }
  if ((caps & CLIENT_SSL) !== 0 && n === 32) {
    out.ssl = true;
    return;
  }
  if ((caps & CLIENT_SSL) !== 0) out.ssl = true;
  const ue = indexOfNul(b, 32, n);
  if (ue === -1) return;
  out.user = latin1(b, 32, ue, MAX_VALUE);
  let p = ue + 1;
  if (p >= n) return;
  // Skip the auth response without reading it.
  if ((caps & CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA) !== 0) {
    const first = b[p]!;
    if (first < 0xfb) p += 1 + first;
    else if (first === 0xfc && p + 3 <= n) p += 3 + b.readUInt16LE(p + 1);
    else if (first === 0xfd && p + 4 <= n) p += 4 + b.readUIntLE(p + 1, 3);
    else return;
  } else if ((caps & CLIENT_SECURE_CONNECTION) !== 0) p += 1 + b[p]!;
  else {
    const ae = indexOfNul(b, p, n);
    if (ae === -1) return;
    p = ae + 1;
  }
  if ((caps & CLIENT_CONNECT_WITH_DB) === 0 || p >= n) return;
  const de = indexOfNul(b, p, n);
  if (de !== -1) out.database = latin1(b, p, de, MAX_VALUE);
}

const AUTH_RESULTS: Record<number, string> = {
  0: 'ok',
  255: 'error',
  254: 'auth-switch',
  1: 'auth-more-data',
};

/** Sniffs a MySQL connection until the server's verdict on the login (or the TLS hellos). */
export class MysqlSniffer implements Sniffer {
  readonly #serverReader = new PacketReader();
  readonly #clientReader = new PacketReader();
  readonly #greeting: Greeting = {};
  readonly #login: Login = { ssl: false };
  #greeted = false;
  #loggedIn = false;
  #authResult: string | undefined = undefined;
  #tls: TlsSniffer | undefined = undefined;
  #malformed = false;
  #finished = false;

  get done(): boolean {
    return this.#finished || (this.#tls?.done ?? false);
  }

  onClientData(buf: Buffer, nowMs: number): void {
    if (this.#tls !== undefined) {
      this.#tls.onClientData(buf, nowMs);
      return;
    }
    if (this.#finished || !this.#greeted || this.#loggedIn) return;
    const off = this.#clientReader.next(buf, 0, buf.length);
    const p = this.#clientReader.packet;
    if (p === undefined) return;
    this.#clientReader.packet = undefined;
    this.#loggedIn = true;
    parseLogin(p, this.#login);
    // An SSLRequest is the short form: TLS starts right after it, on both sides.
    if (this.#login.ssl && p.length === 32) {
      this.#tls = new TlsSniffer();
      if (off < buf.length) this.#tls.onClientData(buf.subarray(off), nowMs);
    }
  }

  onEndpointData(buf: Buffer, nowMs: number): void {
    if (this.#tls !== undefined) {
      this.#tls.onEndpointData(buf, nowMs);
      return;
    }
    if (this.#finished) return;
    let i = 0;
    const n = buf.length;
    while (i < n && !this.#finished) {
      i = this.#serverReader.next(buf, i, n);
      const p = this.#serverReader.packet;
      if (p === undefined) return;
      this.#serverReader.packet = undefined;
      if (!this.#greeted) {
        this.#greeted = true;
        if (p[0] !== 0x0a) {
          this.#authResult = p[0] === 0xff ? 'error' : undefined;
          this.#malformed = p[0] !== 0xff;
          this.#finished = true;
          return;
        }
        parseGreeting(p, this.#greeting);
      } else if (this.#loggedIn) {
        this.#authResult = p.length > 0 ? AUTH_RESULTS[p[0]!] : undefined;
        if (this.#authResult === undefined) this.#malformed = true;
        this.#finished = true;
      }
      // Anything else the server sends before the client's login is not in the protocol: ignore it.
    }
  }

  info(): MysqlInfo {
    const greeting: Greeting = { ...this.#greeting };
    if (!this.#greeted) parseGreeting(this.#serverReader.partial(), greeting);
    const login: Login = { ...this.#login };
    if (this.#greeted && !this.#loggedIn) parseLogin(this.#clientReader.partial(), login);
    return {
      protocol: 'mysql',
      serverVersion: greeting.serverVersion,
      connectionId: greeting.connectionId,
      authPlugin: greeting.authPlugin,
      user: login.user,
      database: login.database,
      ssl: login.ssl,
      authResult: this.#authResult,
      tls: this.#tls?.info(),
      malformed: this.#malformed,
    };
  }
}
