// Established UDP sessions relayed without JavaScript. DNS through the relay cost ~35 µs of CPU a query,
// nginx ~20: 72 % kernel (a sendmsg and a recvmsg per datagram, each a wake-up of the loop), most of the
// rest dgram's JavaScript and address formatting around each one (docs/performance-findings.md).
// native/udp_fast.c (built by `npm run build` into build/native/udp_fast.node) reads a listener's and its
// sessions' sockets on Node's own loop in recvmmsg batches, and sends a known client's datagrams out of
// its session's upstream socket and the endpoint's replies back out of the listener (sendmmsg), with no
// JavaScript per datagram.
//
// JavaScript keeps every decision: a datagram from a client without a handed-over session comes back to
// the listener as dgram would have delivered it (udp.ts opens, queues and sniffs as before); a session is
// handed over once it is connected, has had its first reply (the endpoint proved alive) and its observer
// wants no more bytes (or the tap feeds them: below); its counts and last activity are read from the addon whenever they are needed
// (expiry, caps, close, /debug/connections). An upstream error comes back as dgram's 'error' would.
// Without the addon everything stays in JavaScript; KUP_UDP_FAST=off turns it off.
//
// A session whose observer still wants its datagrams (a tracer's DNS sniffer, for its first queries) is
// handed over all the same, with its tap on: the addon sends each datagram on, then hands the batch's
// tapped ones to the listener in one call (UdpTap below), and udp.ts feeds them to the observer as it
// fed the datagrams it relayed itself, and turns the tap off once the observer wants no more.
// KUP_UDP_TAP=off keeps such a session in JavaScript until its observer is done, as before the tap.
import type dgram from 'node:dgram';
import { getSystemErrorName } from 'node:util';
import { type AddonSupport, loadAddon } from '../lib/native-addon.ts';

/** A listener or a session as the addon knows it (an external: opaque, not to be used once closed). */
export type FastHandle = object;

/** native/udp_fast.c; the numbers returned are 0 or -errno. */
export interface UdpFastCalls {
  /**
   * Reads the listener socket `fd` from now on; datagrams of unknown clients go to `onMiss`; a batch's
   * tapped datagrams to `onTap` (their entries in setupTap()'s array; without it nothing is tapped).
   */
  open(
    fd: number,
    onMiss: (msg: Buffer, address: string, port: number) => void,
    onError: (id: number, errno: number) => void,
    onTap?: (count: number) => void,
  ): FastHandle | number;
  /** Relays client address:port's datagrams through the connected socket `fd` from now on. */
  add(listener: FastHandle, id: number, address: string, port: number, fd: number): FastHandle | number;
  /** out = [ms since its last datagram, bytes from client, bytes to client, datagrams from, datagrams to]. */
  stats(session: FastHandle, out: Float64Array): number;
  remove(session: FastHandle): number;
  /** Datagrams the addon relayed for the listener, both ways. */
  bypassed(listener: FastHandle): number;
  close(listener: FastHandle): number;
  /**
   * Where each batch's tapped datagrams are described from now on (TAP_FIELDS numbers each: session id,
   * side, offset, length); returns the Buffer the offsets point into (the batch memory: valid during the
   * onTap call only), or -errno.
   */
  setupTap(info: Float64Array): Buffer | number;
  /** The session's datagrams go to its listener's onTap too (true) or no more; 0 or -errno. */
  tap(session: FastHandle, on: boolean): number;
}

export type UdpFastSupport = AddonSupport<UdpFastCalls>;

const CALLS = ['open', 'add', 'stats', 'remove', 'bypassed', 'close', 'setupTap', 'tap'] as const;

/** Loads the addon once per process; the error says why it is not there. */
export function loadUdpFast(env: NodeJS.ProcessEnv = process.env): UdpFastSupport {
  return loadAddon<UdpFastCalls>('udp_fast', 'KUP_UDP_FAST', CALLS, env);
}

let processSupport: UdpFastSupport | undefined;
/** The process's addon (loaded on first use). */
export function processUdpFast(): UdpFastSupport {
  processSupport ??= loadUdpFast();
  return processSupport;
}

/** Numbers per tapped datagram in UdpTap.info: session id, side, offset, length. */
export const TAP_FIELDS = 4;
/** A batch's datagrams at most (native/udp_fast.c's BATCH). */
const TAP_BATCH = 32;
/** UdpTap.info's side of a datagram from the client; 1 is one to it. */
export const TAP_FROM_CLIENT = 0;

/** The addon's tapped datagrams: `count` entries of `info` at a time, their bytes in `buffer`. */
export type UdpTap = { readonly info: Float64Array; readonly buffer: Buffer };

/** Whether sniffed sessions are handed over with the tap: not with KUP_UDP_TAP=off. */
export function udpTapEnabled(env: NodeJS.ProcessEnv = process.env): boolean {
  return env.KUP_UDP_TAP !== 'off';
}

/** The process's tap: undefined until set up, null when it could not be. */
let processTap: UdpTap | null | undefined;

/**
 * The addon's tap, set up on first use; undefined when it cannot be. The addon has one per process (one
 * entries array, one batch buffer: a second setupTap() would take every listener's entries to a new
 * array), so every calls object, a wrapper of the addon's included, gets the one set up first.
 */
export function udpTap(calls: UdpFastCalls): UdpTap | undefined {
  if (processTap === undefined) {
    const info = new Float64Array(TAP_FIELDS * TAP_BATCH);
    const buffer = calls.setupTap(info);
    processTap = typeof buffer === 'number' ? null : { info, buffer };
  }
  return processTap ?? undefined;
}

/** What dgram's socket holds of its libuv handle (Node keeps it under a symbol; `_handle` is deprecated). */
type UdpHandle = { fd?: number; recvStop?: () => number; recvStart?: () => number };

let stateSymbol: symbol | undefined;

function udpHandle(socket: dgram.Socket): UdpHandle | undefined {
  stateSymbol ??= Object.getOwnPropertySymbols(socket).find((s) => s.description === 'state symbol');
  if (stateSymbol === undefined) return undefined;
  const state = (socket as unknown as Record<symbol, { handle?: UdpHandle | null } | undefined>)[stateSymbol];
  return state?.handle ?? undefined;
}

/** The socket's descriptor, or -1 (not bound, closed, or no handle where Node keeps it). */
export function readFd(socket: dgram.Socket): number {
  const fd = udpHandle(socket)?.fd;
  return typeof fd === 'number' && fd >= 0 ? fd : -1;
}

/** dgram reads the socket no more: the addon does (dgram would take the datagrams it should relay). */
export function stopReads(socket: dgram.Socket): void {
  udpHandle(socket)?.recvStop?.();
}

/** dgram reads the socket again (the addon did not take it). */
export function resumeReads(socket: dgram.Socket): void {
  udpHandle(socket)?.recvStart?.();
}

/** A system error as dgram reports a failed receive (code, errno, syscall); errno is negative. */
export function receiveError(errno: number): NodeJS.ErrnoException {
  let code: string;
  try {
    code = getSystemErrorName(errno);
  } catch {
    code = `E${-errno}`;
  }
  const err: NodeJS.ErrnoException = new Error(`recvmsg ${code}`);
  err.code = code;
  err.errno = errno;
  err.syscall = 'recvmsg';
  return err;
}
