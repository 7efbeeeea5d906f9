// Redis sniffer: names of the first commands a client sends, as RESP arrays of bulk strings or inline
// lines; arguments (keys, values, AUTH passwords) are skipped, never copied. Pure: no I/O; never throws.
import type { RedisInfo, Sniffer, SniffLimits } from './types.ts';

const MAX_NAME = 32;
const MAX_DIGITS = 10;

// Commands that may start an inline (telnet-style) session; used to tell inline Redis from other text.
// Not HELLO: clients send it as a RESP array, and "hello" is what anyone types to test a port.
const INLINE_COMMANDS = new Set([
  'PING',
  'AUTH',
  'INFO',
  'SELECT',
  'GET',
  'SET',
  'DEL',
  'EXISTS',
  'KEYS',
  'SCAN',
  'QUIT',
  'ECHO',
  'CLIENT',
  'CONFIG',
  'MONITOR',
  'SUBSCRIBE',
  'PSUBSCRIBE',
  'PUBLISH',
  'INCR',
  'DECR',
  'EXPIRE',
  'TTL',
  'TYPE',
  'HGET',
  'HSET',
  'HGETALL',
  'LPUSH',
  'RPUSH',
  'LRANGE',
  'SADD',
  'SMEMBERS',
  'ZADD',
  'ZRANGE',
  'MGET',
  'MSET',
  'FLUSHALL',
  'FLUSHDB',
  'DBSIZE',
  'COMMAND',
  'MULTI',
  'EXEC',
]);

/**
 * Does buf[off, end) start a Redis command: a RESP array `*<n>\r\n$` or a known inline command word
 * followed by a space or CRLF? 'more' while it could still be.
 */
export function looksLikeRedis(buf: Buffer, off: number, end: number): 'yes' | 'no' | 'more' {
  if (off >= end) return 'more';
  if (buf[off] === 0x2a /* * */) {
    let p = off + 1;
    for (; p < end && p - off <= 7; p++) {
      const c = buf[p]!;
      if (c < 0x30 || c > 0x39) break;
    }
    if (p >= end) return 'more';
    if (p === off + 1 || buf[p] !== 0x0d) return 'no';
    if (p + 1 >= end) return 'more';
    if (buf[p + 1] !== 0x0a) return 'no';
    if (p + 2 >= end) return 'more';
    return buf[p + 2] === 0x24 /* $ */ ? 'yes' : 'no';
  }
  let word = '';
  for (let p = off; p < end; p++) {
    const c = buf[p]!;
    if (c === 0x20 || c === 0x0d || c === 0x0a) return INLINE_COMMANDS.has(word) ? 'yes' : 'no';
    const u = c >= 0x61 && c <= 0x7a ? c - 0x20 : c;
    if (u < 0x41 || u > 0x5a || word.length >= 10) return 'no';
    word += String.fromCharCode(u);
  }
  return 'more';
}

const R_START = 0;
const R_ARRAY_LEN = 1;
const R_BULK_START = 2;
const R_BULK_LEN = 3;
const R_BULK_DATA = 4;
const R_BULK_CR = 5;
const R_BULK_LF = 6;
const R_LEN_LF = 7;
const R_INLINE_WORD = 8;
const R_INLINE_REST = 9;
const R_STOP = 10;

/** HELLO's argument that carries credentials (`HELLO [protover [AUTH username password] ...]`). */
const AUTH = 'AUTH';

/** Sniffs a Redis connection's client side: done after maxRequests command names. */
export class RedisSniffer implements Sniffer {
  readonly #limits: SniffLimits;
  readonly #commands: string[] = [];
  #count = 0;
  #auth = false;
  #inline = false;
  #malformed = false;
  #state = R_START;
  /** Digits of the length being read. */
  #num = 0;
  #digits = 0;
  /** State to enter after the LF that ends a length line. */
  #afterLen = R_BULK_START;
  #elements = 0;
  #element = 0;
  #remaining = 0;
  #name = '';
  /** The command being read is HELLO: its arguments are looked at for AUTH (never kept). */
  #hello = false;
  /** In a HELLO argument: how much of "AUTH" it matched so far; -1 once it is something else. */
  #match = -1;

  constructor(limits: SniffLimits) {
    this.#limits = limits;
  }

  get done(): boolean {
    return this.#state === R_STOP || (!this.#limits.keepCounting && this.#count >= this.#limits.maxRequests);
  }

  onClientData(buf: Buffer, nowMs: number): void {
    const n = buf.length;
    for (let i = 0; i < n && !this.done; i++) {
      const c = buf[i]!;
      switch (this.#state) {
        case R_START:
          if (c === 0x2a) {
            this.#startNumber(R_ARRAY_LEN);
          } else if (c !== 0x0d && c !== 0x0a) {
            this.#name = '';
            this.#state = R_INLINE_WORD;
            i--; // reread as the word's first byte
          }
          break;
        case R_ARRAY_LEN:
        case R_BULK_LEN:
          if (c >= 0x30 && c <= 0x39 && this.#digits < MAX_DIGITS) {
            this.#num = this.#num * 10 + (c - 0x30);
            this.#digits++;
          } else if (c === 0x0d && this.#digits !== 0) {
            this.#afterLen = this.#state === R_ARRAY_LEN ? R_BULK_START : R_BULK_DATA;
            this.#state = R_LEN_LF;
          } else if (c === 0x2d && this.#digits === 0 && this.#state === R_ARRAY_LEN) {
            this.#digits = -100; // *-1: a null array, no command
          } else this.#stop();
          break;
        case R_LEN_LF:
          if (c !== 0x0a || this.#digits < 0) {
            if (c === 0x0a) this.#state = R_START;
            else this.#stop();
          } else if (this.#afterLen === R_BULK_START) {
            this.#elements = this.#num;
            this.#element = 0;
            this.#state = this.#num === 0 ? R_START : R_BULK_START;
          } else {
            this.#remaining = this.#num;
            this.#name = '';
            this.#match = this.#hello && this.#element > 0 && this.#num === AUTH.length ? 0 : -1;
            this.#state = R_BULK_DATA;
            if (this.#remaining === 0) this.#state = R_BULK_CR;
          }
          break;
        case R_BULK_START:
          if (c === 0x24) this.#startNumber(R_BULK_LEN);
          else this.#stop();
          break;
        case R_BULK_DATA: {
          if (this.#element === 0 && this.#name.length < MAX_NAME) {
            this.#name += upper(c);
            this.#remaining--;
          } else if (this.#match >= 0) {
            // A 4-byte HELLO argument: compared with "AUTH" byte by byte, never copied.
            this.#match = upper(c) === AUTH[this.#match] ? this.#match + 1 : -1;
            this.#remaining--;
            if (this.#match === AUTH.length) this.#auth = true;
          } else {
            // Arguments (and the tail of an absurdly long name): jump over them in one step.
            const take = Math.min(this.#remaining, n - i);
            this.#remaining -= take;
            i += take - 1;
          }
          if (this.#remaining === 0) this.#state = R_BULK_CR;
          break;
        }
        case R_BULK_CR:
          if (c === 0x0d) this.#state = R_BULK_LF;
          else this.#stop();
          break;
        case R_BULK_LF:
          if (c !== 0x0a) {
            this.#stop();
            break;
          }
          if (this.#element === 0) this.#command(this.#name, nowMs);
          this.#element++;
          this.#state = this.#element >= this.#elements ? R_START : R_BULK_START;
          break;
        case R_INLINE_WORD:
          if (c === 0x20 || c === 0x0d || c === 0x0a) {
            if (this.#name !== '') {
              this.#inline = true;
              this.#command(this.#name, nowMs);
            }
            this.#match = 0;
            this.#state = c === 0x0a ? R_START : R_INLINE_REST;
          } else if (c < 0x21 || c > 0x7e) this.#stop();
          else if (this.#name.length < MAX_NAME) this.#name += upper(c);
          break;
        case R_INLINE_REST: {
          if (this.#hello) {
            // An inline HELLO: its words are looked at for AUTH.
            if (c === 0x20 || c === 0x09 || c === 0x0d || c === 0x0a) {
              if (this.#match === AUTH.length) this.#auth = true;
              this.#match = 0;
              if (c === 0x0a) this.#state = R_START;
            } else if (this.#match >= 0)
              this.#match =
                this.#match < AUTH.length && upper(c) === AUTH[this.#match] ? this.#match + 1 : -1;
            break;
          }
          const j = buf.indexOf(0x0a, i);
          if (j === -1) i = n;
          else {
            i = j;
            this.#state = R_START;
          }
          break;
        }
      }
    }
  }

  onEndpointData(_buf: Buffer, _nowMs: number): void {}

  info(): RedisInfo {
    return {
      protocol: 'redis',
      commands: [...this.#commands],
      commandCount: this.#count,
      auth: this.#auth,
      inline: this.#inline,
      malformed: this.#malformed,
    };
  }

  #startNumber(state: number): void {
    this.#num = 0;
    this.#digits = 0;
    this.#state = state;
  }

  #command(name: string, nowMs: number): void {
    const index = this.#count++;
    if (name === 'AUTH') this.#auth = true;
    this.#hello = name === 'HELLO';
    if (this.#commands.length < this.#limits.maxRequests) this.#commands.push(name);
    const sink = this.#limits.onEvent;
    if (sink) sink({ type: 'redis-command', index, command: name, atMs: nowMs });
  }

  #stop(): void {
    this.#malformed = true;
    this.#state = R_STOP;
  }
}

function upper(c: number): string {
  return String.fromCharCode(c >= 0x61 && c <= 0x7a ? c - 0x20 : c);
}
