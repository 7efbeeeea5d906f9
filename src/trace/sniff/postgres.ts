// PostgreSQL sniffer: SSLRequest/GSSENCRequest/CancelRequest and the StartupMessage (user, database,
// application_name; passwords never travel there), the server's first auth answer, and the TLS hello after
// an accepted SSLRequest. Pure: no I/O; never throws; bounded memory.
import { ByteCollector, indexOfNul, latin1 } from './bytes.ts';
import { TlsSniffer } from './tls.ts';
import type { PostgresInfo, Sniffer } from './types.ts';

/** The server refuses longer startup packets (MAX_STARTUP_PACKET_LENGTH). */
const MAX_STARTUP = 10000;
const MAX_VALUE = 255;
const CODE_CANCEL = 80877102;
const CODE_SSL = 80877103;
const CODE_GSSENC = 80877104;

/** Is `code` a request code a client may open with? (protocol 3.x, SSL, GSSENC, cancel) */
function isStartupCode(code: number, len: number): boolean {
  if (code >>> 16 === 3) return (code & 0xffff) < 16 && len > 8;
  if (code === CODE_SSL || code === CODE_GSSENC) return len === 8;
  return code === CODE_CANCEL && len === 16;
}

/** Does buf[off, end) start a Postgres startup-phase packet? 'more' until its 8 bytes are there. */
export function looksLikePostgres(buf: Buffer, off: number, end: number): 'yes' | 'no' | 'more' {
  for (let p = off; p < end && p < off + 2; p++) if (buf[p] !== 0) return 'no'; // length < 65536
  if (end - off < 8) return 'more';
  const len = buf.readUInt32BE(off);
  return len >= 8 && len <= MAX_STARTUP && isStartupCode(buf.readUInt32BE(off + 4), len) ? 'yes' : 'no';
}

const AUTH_NAMES: Record<number, string> = {
  0: 'ok',
  2: 'kerberos5',
  3: 'cleartext',
  5: 'md5',
  7: 'gss',
  9: 'sspi',
  10: 'sasl',
};

const C_MESSAGE = 0;
const C_WAIT = 1;
const C_TLS = 2;
const C_DONE = 3;

const V_NONE = 0;
const V_ENC_ANSWER = 1;
const V_AUTH = 2;
const V_TLS = 3;
const V_DONE = 4;

type Fields = { user?: string; database?: string; applicationName?: string; version?: string };

/** Parses a StartupMessage body (after length and code): key/value C strings until an empty key. */
function parseParams(b: Buffer, out: Fields): void {
  let p = 0;
  const n = b.length;
  while (p < n && b[p] !== 0) {
    const ke = indexOfNul(b, p, n);
    if (ke === -1) return;
    const vEnd = indexOfNul(b, ke + 1, n);
    if (vEnd === -1) return; // a value cut short would be a wrong value
    const klen = ke - p;
    if (klen === 4 && b.toString('latin1', p, ke) === 'user') out.user = latin1(b, ke + 1, vEnd, MAX_VALUE);
    else if (klen === 8 && b.toString('latin1', p, ke) === 'database')
      out.database = latin1(b, ke + 1, vEnd, MAX_VALUE);
    else if (klen === 16 && b.toString('latin1', p, ke) === 'application_name')
      out.applicationName = latin1(b, ke + 1, vEnd, MAX_VALUE);
    p = vEnd + 1;
  }
}

/** Sniffs a PostgreSQL connection until the server's first auth answer (or the TLS hellos). */
export class PostgresSniffer implements Sniffer {
  readonly #len = new ByteCollector();
  readonly #body = new ByteCollector();
  readonly #server = new ByteCollector();
  #client = C_MESSAGE;
  #serverPhase = V_NONE;
  #fields: Fields = {};
  #startupSeen = false;
  #ssl = false;
  #gss = false;
  #cancel = false;
  #encAnswer: 'S' | 'G' | 'N' | undefined = undefined;
  #auth: string | undefined = undefined;
  #tls: TlsSniffer | undefined = undefined;
  #malformed = false;

  constructor() {
    this.#len.reset(4);
  }

  get done(): boolean {
    return (this.#client === C_DONE && this.#serverPhase === V_DONE) || (this.#tls?.done ?? false);
  }

  onClientData(buf: Buffer, nowMs: number): void {
    if (this.#client === C_TLS) {
      this.#tls!.onClientData(buf, nowMs);
      return;
    }
    let i = 0;
    const n = buf.length;
    while (i < n && this.#client === C_MESSAGE) {
      if (!this.#len.full) {
        i = this.#len.push(buf, i, n);
        if (!this.#len.full) return;
        const len = this.#len.take().readUInt32BE(0);
        this.#len.reset(0);
        if (len < 8 || len > MAX_STARTUP) {
          this.#fail();
          return;
        }
        this.#body.reset(len - 4);
      }
      i = this.#body.push(buf, i, n);
      if (!this.#body.full) return;
      const body = this.#body.take();
      this.#len.reset(4);
      this.#message(body);
    }
  }

  onEndpointData(buf: Buffer, nowMs: number): void {
    if (this.#serverPhase === V_TLS) {
      this.#tls!.onEndpointData(buf, nowMs);
      return;
    }
    if (buf.length === 0) return;
    if (this.#serverPhase === V_ENC_ANSWER) {
      const c = buf[0]!;
      if (c === 0x53 /* S */ || c === 0x47 /* G */) {
        this.#encAnswer = c === 0x53 ? 'S' : 'G';
        if (c === 0x47) {
          this.#finish();
          return;
        }
        this.#tls = new TlsSniffer();
        this.#client = C_TLS;
        this.#serverPhase = V_TLS;
        if (buf.length > 1) this.#tls.onEndpointData(buf.subarray(1), nowMs);
        return;
      }
      if (c === 0x4e /* N */) {
        this.#encAnswer = 'N';
        this.#client = C_MESSAGE;
        this.#serverPhase = V_NONE;
        return;
      }
      this.#auth = c === 0x45 /* E */ ? 'error' : undefined;
      this.#finish();
      return;
    }
    if (this.#serverPhase !== V_AUTH) return;
    this.#server.push(buf, 0, buf.length);
    if (!this.#server.full) return;
    const m = this.#server.take();
    const type = m[0];
    if (type === 0x52 /* R */) {
      const code = m.readUInt32BE(5);
      this.#auth = AUTH_NAMES[code] ?? 'auth' + code;
    } else if (type === 0x45 /* E */) this.#auth = 'error';
    else if (type === 0x76 /* v */) this.#auth = 'negotiate-version';
    else this.#malformed = true;
    this.#finish();
  }

  info(): PostgresInfo {
    const f: Fields = { ...this.#fields };
    const part = this.#startupSeen ? undefined : this.#body.partial();
    if (part !== undefined && part.length >= 4 && part.readUInt32BE(0) >>> 16 === 3) {
      f.version = `3.${part.readUInt32BE(0) & 0xffff}`;
      parseParams(part.subarray(4), f);
    }
    return {
      protocol: 'postgres',
      protocolVersion: f.version,
      user: f.user,
      database: f.database,
      applicationName: f.applicationName,
      sslRequested: this.#ssl,
      gssEncRequested: this.#gss,
      encryptionResponse: this.#encAnswer,
      cancelRequest: this.#cancel,
      auth: this.#auth,
      tls: this.#tls?.info(),
      malformed: this.#malformed,
    };
  }

  /** One complete client message (without its length). */
  #message(body: Buffer): void {
    const code = body.readUInt32BE(0);
    if (code === CODE_SSL || code === CODE_GSSENC) {
      if (code === CODE_SSL) this.#ssl = true;
      else this.#gss = true;
      this.#client = C_WAIT;
      this.#serverPhase = V_ENC_ANSWER;
    } else if (code === CODE_CANCEL) {
      this.#cancel = true;
      this.#finish();
    } else if (code >>> 16 === 3) {
      this.#fields.version = `3.${code & 0xffff}`;
      parseParams(body.subarray(4), this.#fields);
      this.#startupSeen = true;
      this.#client = C_DONE;
      this.#server.reset(9);
      this.#serverPhase = V_AUTH;
    } else this.#fail();
  }

  #fail(): void {
    this.#malformed = true;
    this.#finish();
  }

  #finish(): void {
    this.#client = C_DONE;
    this.#serverPhase = V_DONE;
  }
}
