// The byte relay of an established TCP connection in native code, on Node's own event loop. Once the
// observer wants no more of a connection's bytes (its sniffer is done, or tracing is off), JavaScript has
// nothing to do with them but move them; through Node's streams that is ~8.5 µs of CPU a keep-alive
// request (onStreamRead, push, 'data', write, writeGeneric, afterWrite) and two net.Sockets with their
// stream states, ~2.5 KiB a connection (issue 14; docs/performance-findings.md). native/tcp_relay.c
// takes the pair over: it dup()s both descriptors, the sockets are destroyed (a close() of one of two
// descriptors sends nothing), and it relays with read/write on uv_poll, with backpressure, half-close,
// the FIN with the last bytes, and the idle, half-close and stall timeouts; JavaScript hears of the
// connection once, when it ends. Without the addon (or with KUP_TCP_OFFLOAD=off) the relay stays in
// JavaScript, as before.
//
// A connection that will be handed over at connect anyway (no PROXY protocol header; a sniffer is fed by
// the tap, below) is also dialled by the addon (dial(), TcpDialCalls): socket, connect and its outcome in
// C, the relay (and the tap) from the first byte, instead of a net.Socket and its libuv handle built only
// to be thrown away at connect.
// JavaScript still picks every endpoint and decides every retry: it hears of each attempt once.
// KUP_TCP_DIAL=off dials with net.connect (then hands over, as before).
//
// A traced connection (its sniffer wants the first requests) is dialled (or handed over at connect) with
// the tap on: the relay writes each chunk on and then hands it to the owner's relayTapped() as a view of
// its buffer, until the sniffer is done; the chunks of an epoll batch, and the connects and ends of the
// relays dialled with the tap, in one call (onTap). Two sockets and their streams cost an idle traced keep-alive
// connection ~4 KiB, and Node's streams ~10 % of a short traced connection's CPU (issue 14). With
// KUP_TCP_TAP=off a sniffed connection stays in JavaScript until its sniffer is done, as before.
import { getSystemErrorName } from 'node:util';
import { type AddonSupport, loadAddon } from '../lib/native-addon.ts';
import type { CloseReason } from './close-reason.ts';

/**
 * native/tcp_relay.c. Slots are small integers, reused once a relay has ended (not before the epoll
 * batch it ended in is over); the callbacks name a relay by its slot, whose owner TcpOffload keeps.
 */
export interface TcpRelayCalls {
  /** The function every relay that ends by itself calls: (slot, reason code, bytes from / to the client). */
  setup(onEnd: (slot: number, reason: number, fromClient: number, toClient: number) => void): number;
  /** Takes a connection over (dups both descriptors); its slot, or -errno. Calls nothing back before it returns. */
  start(
    clientFd: number,
    upstreamFd: number,
    idleMs: number,
    halfCloseMs: number,
    stallMs: number,
    stallCheckMs: number,
  ): number;
  /** out[0]: bytes read from the client, out[1]: written to it, since the start; 0 or -ENOENT. */
  counts(slot: number, out: Float64Array): number;
  /** Closes both sides now (with RST when reset is 1), without calling back; 0 or -ENOENT. */
  abort(slot: number, reset: number): number;
  /** TCP keep-alive on both sides (as libuv's); 0 or -errno. */
  keepAlive(slot: number, delaySeconds: number): number;
  /** 1: the client is held back (its bytes wait for the endpoint), 2: the endpoint is, 3: both; or -ENOENT. */
  held(slot: number): number;
  /** Relays running. */
  active(): number;
  /**
   * The callback of the tap's queue, once a batch: `count` entries, each described by TAP_FIELDS numbers
   * of `info` from i × TAP_FIELDS, the last its relay's slot (see onTap). Returns the Buffer a chunk's
   * offset points into (valid during the call only), or -errno.
   */
  setupTap(onTap: (count: number) => void, info: Float64Array): Buffer | number;
  /** Taps on: 1 the client's bytes, 2 the endpoint's, 0 none; 0 or -ENOENT. */
  tap(slot: number, mask: number): number;
}

/** native/tcp_relay.c's dialling; absent from a build that predates it. */
export interface TcpDialCalls {
  /** The function every attempt's end calls: (slot, status: 0 connected, -errno, CONNECT_TIMEOUT). */
  setupDial(onConnect: (slot: number, status: number) => void): number;
  /**
   * Takes the client over (dups its descriptor) and connects to ip:port; the relay's slot (it relays
   * once connected), or -errno when nothing was started (no socket or no dup could be had). Calls
   * nothing back before it returns.
   */
  dial(
    clientFd: number,
    ip: string,
    port: number,
    connectTimeoutMs: number,
    idleMs: number,
    halfCloseMs: number,
    stallMs: number,
    stallCheckMs: number,
    /** 1: the descriptor is the relay's as it is (the native listener's), no dup. */
    take?: number,
    /** As tap()'s mask (setupTap first): tapped from the first byte, its connect and end told with its chunks. */
    tap?: number,
  ): number;
  /** The next attempt of a slot whose last one failed; 0, -ENOENT or -EINVAL. */
  redial(slot: number, ip: string, port: number, connectTimeoutMs: number): number;
  /** The local address and port of the slot's upstream socket (bound once connect() is issued). */
  localName(slot: number): [string, number] | undefined;
}

/** onConnect's status for an attempt that timed out (native/tcp_relay.c's CONNECT_TIMEOUT). */
export const CONNECT_TIMEOUT = 1;

/** The error a failed native attempt stands for: the one net.connect would have given. */
export function connectError(status: number, ip: string, port: number): NodeJS.ErrnoException {
  if (status === CONNECT_TIMEOUT) {
    const err: NodeJS.ErrnoException = new Error('connect timeout');
    err.code = 'KUP_CONNECT_TIMEOUT';
    return err;
  }
  const code = getSystemErrorName(status);
  const err: NodeJS.ErrnoException = new Error(`connect ${code} ${ip}:${port}`);
  err.code = code;
  err.errno = status;
  err.syscall = 'connect';
  return err;
}

export type TcpOffloadSupport = AddonSupport<TcpRelayCalls>;

/** The native reason codes, in order (native/tcp_relay.c's R_*). */
const REASONS: readonly CloseReason[] = [
  'client-fin',
  'client-fin',
  'endpoint-fin',
  'client-reset',
  'endpoint-reset',
  'error',
  'idle-timeout',
  'half-close-timeout',
  'stalled',
];

/** The close reason a native code stands for. */
export function closeReasonOf(code: number): CloseReason {
  return REASONS[code] ?? 'error';
}

/** Loads the addon once per process; the error says why it is not there. */
export function loadTcpOffload(env: NodeJS.ProcessEnv = process.env): TcpOffloadSupport {
  return loadAddon<TcpRelayCalls>(
    'tcp_relay',
    'KUP_TCP_OFFLOAD',
    ['setup', 'start', 'counts', 'abort', 'keepAlive', 'held', 'active', 'setupTap', 'tap'],
    env,
  );
}

let processSupport: TcpOffloadSupport | undefined;
/** The process's addon (loaded on first use). */
export function processTcpOffload(): TcpOffloadSupport {
  processSupport ??= loadTcpOffload();
  return processSupport;
}

/** What a relay tells its owner: a tapped chunk, its end when it ends by itself, and (dialled by the addon)
 * each attempt's end. */
export interface OffloadOwner {
  relayEnded(reason: CloseReason, fromClient: number, toClient: number): void;
  attemptEnded(status: number): void;
  /** A chunk read from the client (side 0) or the endpoint (1), already written on; valid during the call. */
  relayTapped(side: number, chunk: Buffer): boolean;
}

/**
 * The owner of each running relay, by slot: one table for the process, as the addon is one. A slot's
 * entry is set when start() or dial() returns it (adoptRelay) and cleared by its end (told, or
 * TcpOffload.abort()); neither calls back before it returns. The addon
 * held a Node-API reference a relay instead: a global handle and a heap allocation made and freed a
 * connection, and one lookup a callback.
 */
const owners: (OffloadOwner | undefined)[] = [];

function onEnd(slot: number, code: number, fromClient: number, toClient: number): void {
  const owner = owners[slot];
  owners[slot] = undefined;
  owner?.relayEnded(closeReasonOf(code), fromClient, toClient);
}

function onConnect(slot: number, status: number): void {
  owners[slot]?.attemptEnded(status);
}

/** Keeps `owner` for the relay start() or dial() just returned: its slot, or -errno (nothing kept). */
export function adoptRelay(slot: number, owner: OffloadOwner): number {
  if (slot >= 0) owners[slot] = owner;
  return slot;
}

/** Relays running, by their owners' count (a test checks that every end let go of its owner). */
export function ownedRelays(): number {
  let n = 0;
  for (const o of owners) if (o !== undefined) n++;
  return n;
}

/** The addon's dialling, when it has it and KUP_TCP_DIAL is not off. */
function dialCalls(calls: TcpRelayCalls, env: NodeJS.ProcessEnv): TcpDialCalls | undefined {
  if (env.KUP_TCP_DIAL === 'off') return undefined;
  const dial = calls as TcpRelayCalls & Partial<TcpDialCalls>;
  for (const name of ['setupDial', 'dial', 'redial', 'localName'] as const)
    if (typeof dial[name] !== 'function') return undefined;
  return dial as TcpDialCalls;
}

/** Numbers an entry of the tap's queue takes (native/tcp_relay.c's TAP_FIELDS), and its entries at most. */
export const TAP_FIELDS = 6;
const TAP_ENTRIES = 64;
/** An entry's kind (its first number): a chunk (side, offset, length; the fifth is written back: 1 while
 * the connection wants more), a connect (a relay dialled with the tap), an end (reason, bytes from and to
 * the client); the sixth is the relay's slot. */
const Q_TAP = 0;
const Q_CONNECTED = 1;

/** The addon's Buffer the tapped chunks are in, and where its queue's entries are; one per process. */
let tapBuffer: Buffer = Buffer.alloc(0);
const tapInfo = new Float64Array(TAP_FIELDS * TAP_ENTRIES);

/** Calls of onTap and the chunks they carried, in this process (a test looks at them). */
export const tapCalls = { calls: 0, chunks: 0 };

/** The last bytes of tapBuffer, JavaScript's own (native/tcp_relay.c's TAP_COPY_MAX): a small chunk's place. */
const TAP_STAGE = 4096;
/** Views of the stage kept for reuse, by length: TAP_VIEWS slots, one length each. */
const TAP_VIEWS = 64;
let tapViews: (Buffer | undefined)[] = new Array(TAP_VIEWS);

/**
 * The chunk at tapBuffer[offset, offset + length). A small one is moved to the stage and read through a
 * view of the stage kept for its length: a chunk is valid during its call only, the requests and answers
 * of a Service repeat their lengths, and a new view (a typed array, ~100 bytes) per chunk would be garbage
 * at once.
 */
function tapChunk(offset: number, length: number): Buffer {
  if (length > TAP_STAGE) return tapBuffer.subarray(offset, offset + length);
  const stage = tapBuffer.length - TAP_STAGE;
  tapBuffer.copyWithin(stage, offset, offset + length);
  const slot = length & (TAP_VIEWS - 1);
  let view = tapViews[slot];
  if (view === undefined || view.length !== length) {
    view = tapBuffer.subarray(stage, stage + length);
    tapViews[slot] = view;
  }
  return view;
}

/**
 * The tap's queue of a batch, in order: each relay's chunks, its connect, its end, as they happened. An
 * entry whose relay was aborted earlier in the call has no owner any more: skipped (its slot is not
 * reused before the batch is over).
 */
function onTap(count: number): void {
  const info = tapInfo;
  tapCalls.calls++;
  for (let i = 0, f = 0; i < count; i++, f += TAP_FIELDS) {
    const slot = info[f + 5]!;
    const owner = owners[slot];
    if (owner === undefined) continue;
    const kind = info[f];
    if (kind === Q_TAP) {
      info[f + 4] = owner.relayTapped(info[f + 1]!, tapChunk(info[f + 2]!, info[f + 3]!)) ? 1 : 0;
      tapCalls.chunks++;
    } else if (kind === Q_CONNECTED) owner.attemptEnded(0);
    else {
      owners[slot] = undefined;
      owner.relayEnded(closeReasonOf(info[f + 1]!), info[f + 2]!, info[f + 3]!);
    }
  }
}

/** The tap on both sides: the observer's wantsData covers both directions of a connection. */
export const TAP_BOTH = 3;

/** Whether sniffed connections are handed over with the tap: not with KUP_TCP_TAP=off. */
export function tapEnabled(env: NodeJS.ProcessEnv = process.env): boolean {
  return env.KUP_TCP_TAP !== 'off';
}

/** The addon with its one callback registered; shared by every listener of the process. */
export class TcpOffload {
  readonly calls: TcpRelayCalls;
  /** Dialling in the addon; undefined without it (an older build, or KUP_TCP_DIAL=off). */
  readonly dial: TcpDialCalls | undefined;
  /** Hand-overs so far, dialled ones included (a test and /metrics-free debugging look at it). */
  started = 0;
  /** Connections dialled by the addon so far. */
  dialled = 0;
  /** Of those handed over, the ones with the tap on (the sniffer still wanted bytes). */
  tapped = 0;
  /** Sniffed connections are handed over with the tap; false: they stay in JavaScript till it is done. */
  readonly tap: boolean;
  readonly #counts = new Float64Array(2);

  constructor(calls: TcpRelayCalls, tap = tapEnabled(), env: NodeJS.ProcessEnv = process.env) {
    this.calls = calls;
    calls.setup(onEnd);
    this.dial = dialCalls(calls, env);
    this.dial?.setupDial(onConnect);
    const buffer = tap ? calls.setupTap(onTap, tapInfo) : 0;
    this.tap = typeof buffer !== 'number';
    if (typeof buffer !== 'number' && buffer !== tapBuffer) {
      tapBuffer = buffer;
      tapViews = new Array(TAP_VIEWS);
    }
  }

  /** Closes a relay's both sides now (with RST when reset is 1); its owner hears nothing. 0 or -ENOENT. */
  abort(slot: number, reset: number): number {
    owners[slot] = undefined;
    return this.calls.abort(slot, reset);
  }

  /** Bytes from the client and to it since the hand-over (both 0 once it ended). */
  fromClient(slot: number): number {
    return this.calls.counts(slot, this.#counts) === 0 ? this.#counts[0]! : 0;
  }

  toClient(slot: number): number {
    return this.calls.counts(slot, this.#counts) === 0 ? this.#counts[1]! : 0;
  }
}

let processOffload: TcpOffload | null | undefined;
/** The process's offload, or null without the addon. */
export function processTcpRelay(): TcpOffload | null {
  if (processOffload === undefined) {
    const support = processTcpOffload();
    processOffload = support.calls === undefined ? null : new TcpOffload(support.calls);
  }
  return processOffload;
}
