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
import { createRequire } from 'node:module';
import path from 'node:path';
import type { CloseReason } from './close-reason.ts';

/** native/tcp_relay.c. Slots are small integers, reused once a relay has ended. */
export interface TcpRelayCalls {
  /** The function every relay that ends by itself calls: (owner, reason code, bytes from / to the client). */
  setup(
    onEnd: (this: object, owner: object, reason: number, fromClient: number, toClient: number) => void,
  ): number;
  /** Takes a connection over (dups both descriptors); its slot, or -errno. */
  start(
    clientFd: number,
    upstreamFd: number,
    owner: object,
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
}

export type TcpOffloadSupport =
  | { calls: TcpRelayCalls; error?: undefined }
  | { calls?: undefined; error: string };

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
  if (env.KUP_TCP_OFFLOAD === 'off') return { error: 'turned off (KUP_TCP_OFFLOAD=off)' };
  if (process.platform !== 'linux') return { error: `not built for ${process.platform}` };
  // src/relay/ and dist/relay/ are both two levels below the package root.
  const file = path.resolve(import.meta.dirname, '..', '..', 'build', 'native', 'tcp_relay.node');
  try {
    const calls = createRequire(import.meta.url)(file) as TcpRelayCalls;
    for (const name of ['setup', 'start', 'counts', 'abort', 'keepAlive', 'held', 'active'] as const)
      if (typeof calls[name] !== 'function') return { error: `${file} is not the tcp_relay addon` };
    return { calls };
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    return {
      error:
        code === 'MODULE_NOT_FOUND' || code === 'ERR_DLOPEN_FAILED'
          ? `${file} not built (npm run build; needs a C compiler): ${(err as Error).message.split('\n')[0]}`
          : `${file}: ${(err as Error).message}`,
    };
  }
}

let processSupport: TcpOffloadSupport | undefined;
/** The process's addon (loaded on first use). */
export function processTcpOffload(): TcpOffloadSupport {
  processSupport ??= loadTcpOffload();
  return processSupport;
}

/** What a relay tells its owner when it ends by itself. */
export interface OffloadOwner {
  relayEnded(reason: CloseReason, fromClient: number, toClient: number): void;
}

function onEnd(owner: object, code: number, fromClient: number, toClient: number): void {
  (owner as OffloadOwner).relayEnded(closeReasonOf(code), fromClient, toClient);
}

/** The addon with its one callback registered; shared by every listener of the process. */
export class TcpOffload {
  readonly calls: TcpRelayCalls;
  /** Hand-overs so far (a test and /metrics-free debugging look at it). */
  started = 0;
  readonly #counts = new Float64Array(2);

  constructor(calls: TcpRelayCalls) {
    this.calls = calls;
    calls.setup(onEnd);
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
