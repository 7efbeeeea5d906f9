// TCP data path: accept on a service port's proxy port, pick an endpoint, connect with per-attempt
// timeouts (never holding up other accepts), then relay both ways with backpressure and half-close.
// Handlers are shared functions bound through a symbol on the socket: no closures per connection.
import net, { isIP } from 'node:net';
import { constants } from 'node:os';
import type { Logger } from '../lib/log.ts';
import type { Balancer } from '../loadbalancer/balancer.ts';
import type { Endpoint } from '../state/endpoint.ts';
import { ActiveList, type Listed } from './active-list.ts';
import { clientFamily, normalizeAddress } from './address.ts';
import type { CloseReason } from './close-reason.ts';
import { nextConnectionId } from './connection-id.ts';
import { type EjectionListener, endpointFailed } from './endpoint-failure.ts';
import { FdPressure, isFdExhausted } from './fd-pressure.ts';
import {
  defaultKeepAliveSweeper,
  type KeepAliveCandidate,
  type KeepAliveSource,
  type KeepAliveSweeper,
} from './keepalive.ts';
import type { ConnectAttempt, ConnectionInfo, ConnectionObserver } from './observer.ts';
import { noopObserver } from './observer.ts';
import { observerFailed } from './observer-failure.ts';
import {
  LISTENER_DESTINATION,
  type OriginalDestination,
  originalDestination,
} from './original-destination.ts';
import { MAX_PASSES, OwnTraffic, type PassOwner } from './own-traffic.ts';
import { proxyProtocolHeader } from './proxy-protocol.ts';
import type { ProxyProtocolSettings, ServicePortContext } from './service-context.ts';
import { countPick, countRejected, liveStats } from './service-context.ts';
import { processSweeper, type Sweepable, type Sweeper } from './sweeper.ts';
import { type AcceptOwner, processTcpAccept, systemError, type TcpAccept } from './tcp-accept.ts';
import { endFollows, finNow, processTcpFin, socketFd, type TcpFinCalls, writeWithFin } from './tcp-fin.ts';
import {
  adoptRelay,
  connectError,
  type OffloadOwner,
  processTcpRelay,
  TAP_BOTH,
  type TcpDialCalls,
  type TcpOffload,
} from './tcp-offload.ts';

/** Creates the socket to an endpoint; injected so tests can make an endpoint hang or refuse. */
export type Connector = (options: net.TcpNetConnectOpts) => net.Socket;

export type TcpRelayOptions = {
  /** Timeout of each connect attempt; the number of entries is the number of attempts. */
  connectTimeoutsMs: readonly number[];
  /** Closes a connection after this long without traffic on a socket; 0 = never (kube-proxy). */
  idleTimeoutMs: number;
  /** How long one direction may stay open after the other has sent FIN, without traffic. */
  halfCloseTimeoutMs: number;
  /** listen() backlog. */
  backlog: number;
  /**
   * TCP keep-alive idle delay on both sockets. Keep-alive is turned on for connections that have been
   * open for a while (KeepAliveSweeper), not at accept: short connections never need it.
   */
  keepAliveDelayMs: number;
  /** Concurrent connections per service port; past it new ones are closed at once. 0 = no cap. */
  maxConnections: number;
  /**
   * Closes (with RST on both sides) a connection whose client is paused because the endpoint takes none
   * of its bytes, when nothing has moved either way for this long: a paused socket is not read, so a
   * client that left with FIN is never seen (nginx's proxy_send_timeout, HAProxy's `timeout server`).
   * A client that left with RST is seen within a sweep (a quarter of this, at most 5 s). 0 = never.
   */
  stallTimeoutMs: number;
  /**
   * Listen with SO_REUSEPORT, so that other processes may listen on the same port and the kernel
   * spreads new connections over them (docs/multi-worker.md; bench/workers.bench.ts). Off by default.
   */
  reusePort?: boolean;
};

export const DEFAULT_TCP_OPTIONS: TcpRelayOptions = {
  connectTimeoutsMs: [250, 500, 1000, 2000],
  idleTimeoutMs: 0,
  halfCloseTimeoutMs: 60_000,
  backlog: 4096,
  keepAliveDelayMs: 60_000,
  maxConnections: 0,
  stallTimeoutMs: 300_000,
};

export type TcpRelayDeps = {
  connect?: Connector;
  log: Logger;
  now?: () => number;
  /** Shared by every listener of the process: descriptors run out for all of them at once. */
  fdPressure?: FdPressure;
  /** Turns keep-alive on for connections that live (default: the process's sweeper). */
  keepAlive?: KeepAliveSweeper;
  /** Checks for stalled connections (default: the process's sweeper). */
  sweeper?: Sweeper;
  /** Shared by every listener of the process: connections that come back from our own sockets. */
  ownTraffic?: OwnTraffic;
  /** Each ejection this process decides (endpoint-failure.ts). */
  onEjection?: EjectionListener;
  /**
   * The calls that send the endpoint's FIN with its last bytes (tcp-fin.ts); default: the process's
   * addon when it is built. null: without (FIN when Node reads the EOF, a loop turn or two later).
   */
  tcpFin?: TcpFinCalls | null;
  /**
   * The native relay that takes an established connection over once its bytes need no JavaScript
   * (tcp-offload.ts); default: the process's when the addon is built. null: the relay stays in JavaScript.
   */
  tcpOffload?: TcpOffload | null;
  /**
   * Dials in the native relay (tcp-offload.ts's dial) the connections it would take over at connect
   * anyway; default: when the offload has it and no `connect` is injected. false: net.connect always.
   */
  tcpDial?: boolean;
  /**
   * The native listening socket (tcp-accept.ts); default: the process's when the addon is built. null: a
   * net.Server, as before.
   */
  tcpAccept?: TcpAccept | null;
};

/** How often a listener may log that its connection cap (or a loop) turned connections away. */
const LIMIT_LOG_INTERVAL_MS = 10_000;
/**
 * The longest a Node timer (a socket's setTimeout) waits: a longer one is cut to it, with a
 * TimeoutOverflowWarning on stderr. The JavaScript relay cuts it itself (~24.8 days; the native relay
 * keeps any length).
 */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** Written to a paused socket to learn whether its peer reset: a paused socket is not polled. */
const EMPTY = Buffer.alloc(0);

const { ECONNRESET } = constants.errno;

/** The stall sweep's period: a quarter of the timeout, between 25 ms and 5 s. */
function stallSweepMs(timeoutMs: number): number {
  return Math.min(5000, Math.max(25, Math.floor(timeoutMs / 4)));
}

const kConn = Symbol('kup.connection');
type ConnSocket = net.Socket & { [kConn]?: TcpConnection };

const OPEN_CONNECTING = 0;
const OPEN = 1;
const CLOSED = 2;

/** One proxied TCP connection: a client socket and, once connected, an upstream socket. */
class TcpConnection implements ConnectionInfo, KeepAliveCandidate, PassOwner, OffloadOwner, Listed {
  readonly id = nextConnectionId();
  readonly listener: TcpListener;
  readonly context: ServicePortContext;
  /** Becomes noopObserver when its `opened` threw. */
  observer: ConnectionObserver;
  /** The balancer of the client's family, for everything about this connection. */
  readonly balancer: Balancer;
  /** undefined once the native relay took the connection over (its sockets are destroyed then). */
  clientSocket: ConnSocket | undefined;
  /** The client's descriptor from the native listener, until a relay or a net.Socket has it; -1 then. */
  clientFd: number;
  readonly clientAddress: string;
  readonly clientPort: number;
  readonly startMs: number;
  upstream: ConnSocket | undefined = undefined;
  endpoint: Endpoint | undefined = undefined;
  attempt = 0;
  state = OPEN_CONNECTING;
  endMs = 0;
  /** Set by the first abort (error, reset, timeout); wins over `finBy`. */
  closeReason: CloseReason | undefined = undefined;
  /** Which side sent the first FIN. */
  finBy: CloseReason | undefined = undefined;
  failedAttempts: ConnectAttempt[] = [];
  clientEnded = false;
  upstreamEnded = false;
  clientClosed = false;
  upstreamClosed = true;
  /** The observer still wants the bytes (a sniffer that is not done yet). */
  sniffing = false;
  keepAliveOn = false;
  observerData: unknown = undefined;
  /** Times this connection already passed through us (own-traffic.ts); counted for local clients only. */
  passes = 0;
  /** The client is on this host: its upstream sockets are registered, to see it come back. */
  tracked = false;
  /** The upstream socket's registration in OwnTraffic; '' when none. */
  ownKey = '';
  /** The PROXY protocol header's settings, as they were at accept (a change applies to new connections). */
  readonly proxyProtocol: ProxyProtocolSettings | undefined;
  /** When the stall sweep first saw the client paused with no byte moving; 0 = not stalled. */
  stallSinceMs = 0;
  /** Bytes read from both sides at that sweep. */
  stallMark = 0;
  /** Our FIN to the client went out with the endpoint's last bytes. */
  clientFinSent = false;
  /** The native relay's slot while it moves the bytes (tcp-offload.ts); -1 when it does not. */
  relay = -1;
  /** Its place in its listener's open connections (ActiveList); -1 once it left them. */
  listIndex = -1;
  /** Bytes from and to the client before the hand-over; all of them once the native relay ended. */
  baseFromClient = 0;
  baseToClient = 0;
  /** Dialled by the native relay: it would be handed over at connect anyway (no PROXY protocol header;
   * a sniffer gets its bytes through the tap). */
  nativeDial: boolean;

  /** The client is a net.Socket (a net.Server's) or a descriptor (the native listener's). */
  constructor(
    listener: TcpListener,
    client: net.Socket | undefined,
    clientFd: number,
    clientAddress: string,
    clientPort: number,
    now: number,
  ) {
    this.listener = listener;
    this.context = listener.context;
    // Fixed for the connection's life: a tracing change of the service port applies to new connections.
    this.observer = listener.context.observer;
    this.clientSocket = client;
    this.clientFd = clientFd;
    this.clientAddress = clientAddress;
    this.balancer = listener.context.balancers[clientFamily(clientAddress)];
    this.clientPort = clientPort;
    this.startMs = now;
    this.proxyProtocol = listener.context.proxyProtocol;
    this.nativeDial =
      listener.dial !== undefined &&
      this.proxyProtocol === undefined &&
      (!this.observer.wantsData || listener.offload!.tap);
  }

  get service() {
    return this.context.name;
  }
  get protocol() {
    return 'TCP' as const;
  }
  /** The client's socket, for the JavaScript relay (never after the hand-over, which drops it). */
  get client(): ConnSocket {
    return this.clientSocket!;
  }

  turnKeepAliveOn(delayMs: number): boolean {
    if (this.state !== OPEN) return false;
    if (this.relay >= 0) {
      // As Node's setKeepAlive: whole seconds, at least one.
      this.listener.offload!.calls.keepAlive(this.relay, Math.max(1, Math.floor(delayMs / 1000)));
      return true;
    }
    const upstream = this.upstream;
    if (upstream === undefined) return false;
    for (const s of [this.client, upstream]) if (!s.destroyed) s.setKeepAlive(true, delayMs);
    return true;
  }

  get bytesFromClient(): number {
    if (this.relay >= 0) return this.baseFromClient + this.listener.offload!.fromClient(this.relay);
    return this.clientSocket?.bytesRead ?? this.baseFromClient;
  }
  get bytesToClient(): number {
    if (this.relay >= 0) return this.baseToClient + this.listener.offload!.toClient(this.relay);
    return this.clientSocket?.bytesWritten ?? this.baseToClient;
  }

  /** Picks an endpoint and starts a connect attempt; closes the client when none is left. */
  dial(): void {
    const balancer = this.balancer;
    const stats = this.context.stats;
    const now = this.listener.now();
    let endpoint = balancer.pick(this.clientAddress, now, this.attempt > 0);
    // A retry goes to an endpoint this connection has not failed on yet, while there is one.
    for (
      let i = balancer.endpoints.length;
      i > 0 && endpoint !== undefined && this.hasFailedOn(endpoint);
      i--
    ) {
      endpoint = balancer.pick(this.clientAddress, now, true);
    }
    if (endpoint === undefined) {
      if (this.attempt === 0) {
        stats.noEndpoints++;
        const log = this.listener.log;
        if (log.isLevelEnabled('debug'))
          log.debug(
            { service: this.context.name, client: this.clientAddress },
            'No endpoints, connection reset',
          );
        this.finish('no-endpoints');
        // The nearest a listener gets to kube-proxy's REJECT (connection refused): an RST, so the
        // client sees ECONNRESET at once instead of a clean, empty response.
        if (this.clientFd >= 0) {
          this.listener.accept!.calls.closeFd(this.clientFd, 1);
          this.clientFd = -1;
        } else this.client.resetAndDestroy();
      } else {
        stats.connectFailed++;
        this.finish('connect-failed');
        this.#dropClient();
      }
      return;
    }
    countPick(stats, endpoint.key);
    this.endpoint = endpoint;
    if (this.nativeDial && this.#dialNatively(endpoint)) return;
    const options = this.listener.options;
    const upstream = this.listener.connect({
      host: endpoint.ip,
      port: endpoint.port,
      allowHalfOpen: true,
      noDelay: true,
    }) as ConnSocket;
    upstream[kConn] = this;
    this.upstream = upstream;
    this.upstreamClosed = false;
    upstream.setTimeout(options.connectTimeoutsMs[this.attempt] ?? 1000);
    upstream.once('connect', onUpstreamConnect);
    upstream.on('timeout', onUpstreamTimeout);
    upstream.on('error', onUpstreamError);
    upstream.on('close', onUpstreamClose);
    // After net.connect's own tick, which issues connect(2): the local port is bound by then, before the
    // loop polls again and could accept this socket back.
    if (this.tracked) process.nextTick(registerUpstream, this, upstream);
  }

  /**
   * Has the native relay connect to `endpoint` (tcp-offload.ts): the client's descriptor goes to it at
   * the first attempt (its socket is destroyed), later attempts reuse the slot. False when the addon
   * could start nothing (no descriptor for a dup or a socket): net.connect then, as before.
   */
  #dialNatively(endpoint: Endpoint): boolean {
    const listener = this.listener;
    const dial = listener.dial!;
    const options = listener.options;
    const timeoutMs = options.connectTimeoutsMs[this.attempt] ?? 1000;
    if (this.relay >= 0) {
      const err = dial.redial(this.relay, endpoint.ip, endpoint.port, timeoutMs);
      // Only a bad address fails here (a socket that cannot be made is told as the attempt's end).
      if (err < 0) {
        this.attemptEnded(err);
        return true;
      }
    } else {
      const client = this.clientSocket;
      // The native listener's descriptor goes to the relay as it is; a socket's is dup()ed.
      const take = client === undefined;
      const fd = take ? this.clientFd : socketFd(client);
      // A sniffer's bytes come through the tap from the first one (nativeDial: the tap is there).
      const tap = this.observer.wantsData ? TAP_BOTH : 0;
      const slot =
        fd < 0
          ? -1
          : adoptRelay(
              dial.dial(
                fd,
                endpoint.ip,
                endpoint.port,
                timeoutMs,
                options.idleTimeoutMs,
                options.halfCloseTimeoutMs,
                options.stallTimeoutMs,
                stallSweepMs(options.stallTimeoutMs),
                take ? 1 : 0,
                tap,
              ),
              this,
            );
      if (slot < 0) {
        this.nativeDial = false;
        if (take) this.wrapClient();
        return false;
      }
      const offload = listener.offload!;
      offload.started++;
      offload.dialled++;
      if (tap !== 0) offload.tapped++;
      this.relay = slot;
      if (take) this.clientFd = -1;
      else {
        (client as ConnSocket)[kConn] = undefined;
        client.destroy();
        this.clientSocket = undefined;
      }
    }
    this.upstreamClosed = false;
    // connect() is issued: the local port is bound before the loop polls again and could accept it back.
    if (this.tracked) {
      const name = dial.localName(this.relay);
      if (name !== undefined)
        this.ownKey = listener.ownTraffic.tcpOpenedAt(this, name[0], name[1], endpoint.ip, endpoint.port);
    }
    return true;
  }

  /** The native relay's attempt ended: 0 connected (it relays from now on), or how it failed. */
  attemptEnded(status: number): void {
    if (this.state !== OPEN_CONNECTING) return;
    const endpoint = this.endpoint!;
    if (status !== 0) {
      this.connectFailed(connectError(status, endpoint.ip, endpoint.port));
      return;
    }
    // Its tap, if any, is on since the dial: its chunks follow this call.
    this.#opened();
  }

  /**
   * The native listener's descriptor as a net.Socket, paused (as a net.Server's with pauseOnConnect),
   * for the JavaScript relay.
   */
  wrapClient(): ConnSocket {
    const socket = new net.Socket({
      fd: this.clientFd,
      readable: true,
      writable: true,
      allowHalfOpen: true,
      pauseOnCreate: true,
    } as net.SocketConstructorOpts) as ConnSocket;
    this.clientFd = -1;
    socket[kConn] = this;
    socket.on('error', onClientError);
    socket.on('close', onClientClose);
    this.clientSocket = socket;
    return socket;
  }

  /** Closes the client of a connection that reached no endpoint. */
  #dropClient(): void {
    if (this.relay >= 0) {
      this.listener.offload!.abort(this.relay, 0);
      this.#relayDone(0, 0);
    } else if (this.clientFd >= 0) {
      this.listener.accept!.calls.closeFd(this.clientFd, 0);
      this.clientFd = -1;
    } else this.client.destroy();
  }

  /** Drops the upstream socket's registration, if any. */
  forgetUpstream(): void {
    if (this.ownKey === '') return;
    this.listener.ownTraffic.tcpClosed(this, this.ownKey);
    this.ownKey = '';
  }

  hasFailedOn(endpoint: Endpoint): boolean {
    for (const a of this.failedAttempts) if (a.endpoint === endpoint.key) return true;
    return false;
  }

  /** A connect attempt failed: remember why, reset the client's affinity and try the next endpoint. */
  connectFailed(err: NodeJS.ErrnoException): void {
    const endpoint = this.endpoint!;
    const reason = endpointFailed(this, endpoint, err, this.listener, 'connect', this.listener.now());
    this.forgetUpstream();
    // None when the native relay dialled (its failed socket goes with the next attempt or the client).
    const upstream = this.upstream;
    if (upstream !== undefined) {
      upstream[kConn] = undefined;
      upstream.destroy();
      this.upstream = undefined;
    }
    this.upstreamClosed = true;
    this.endpoint = undefined;
    if (reason === 'fd-exhausted') {
      // No other endpoint would do better; closing the client gives its descriptor back at once.
      this.context.stats.connectFailed++;
      this.finish('connect-failed');
      this.#dropClient();
      return;
    }
    const log = this.listener.log;
    if (log.isLevelEnabled('debug')) {
      log.debug(
        { service: this.context.name, endpoint: endpoint.key, attempt: this.attempt + 1, reason },
        'Connect failed',
      );
    }
    this.attempt++;
    if (this.attempt < this.listener.options.connectTimeoutsMs.length && this.state === OPEN_CONNECTING) {
      this.dial();
    } else {
      this.context.stats.connectFailed++;
      this.listener.log.warn(
        { service: this.context.name, client: this.clientAddress, attempts: this.failedAttempts },
        'Failed to connect to an endpoint',
      );
      this.finish('connect-failed');
      this.#dropClient();
    }
  }

  connected(): void {
    const upstream = this.upstream!;
    const client = this.client;
    // Before any byte of the client's (it is still paused): who it was and where it connected to. Corked
    // for one turn of the loop, so that the request a client sent at once (already waiting in its
    // socket) leaves in the same segment instead of a second one, and uncorked then whatever came: a
    // server-first protocol's endpoint gets the header alone, one loop turn later.
    const pp = this.proxyProtocol;
    if (pp !== undefined) {
      upstream.cork();
      upstream.write(this.#proxyHeader(pp));
      setImmediate(uncorkNextTurn, upstream);
    }
    this.#opened();
    // No header waiting: the native relay moves the bytes from the start (feeding the sniffer through
    // its tap while it wants them).
    if (pp === undefined && mayHandOver(this)) {
      upstream.setTimeout(0);
      if (this.offload()) return;
    }
    const idle = Math.min(this.listener.options.idleTimeoutMs, MAX_TIMER_MS);
    upstream.setTimeout(idle);
    client.setTimeout(idle);
    if (idle > 0) client.on('timeout', onIdleTimeout);
    // A relay of our own rather than pipe(): one shared listener per event (pipe adds seven closures
    // per direction), and the sniffer is fed from the same 'data' call while it wants bytes.
    client.on('end', onClientEnd);
    upstream.on('end', onUpstreamEnd);
    client.on('data', onClientData);
    upstream.on('data', onUpstreamData);
    client.on('drain', onClientDrain);
    upstream.on('drain', onUpstreamDrain);
    // Accepted paused (pauseOnConnect): the client's bytes flow from now on.
    client.resume();
  }

  /** Connected, by net.connect or the native relay: counted as the endpoint's success, told to the observer. */
  #opened(): void {
    this.state = OPEN;
    this.balancer.reportSuccess(this.endpoint!);
    this.listener.fdPressure.relieved();
    const observer = this.observer;
    try {
      observer.opened(this);
      this.sniffing = observer.wantsData;
    } catch (err) {
      // It saw no complete opening: it is not told of the close either.
      this.observer = noopObserver;
      observerFailed(this.context, observer, this.listener.log, err, 'opened');
    }
  }

  #proxyHeader(pp: ProxyProtocolSettings): Buffer {
    const client = this.client;
    const family = clientFamily(this.clientAddress);
    const dst = originalDestination(
      this.listener.destination,
      pp,
      family,
      normalizeAddress(client.localAddress),
      client.localPort ?? 0,
    );
    return proxyProtocolHeader(pp.version, this.clientAddress, this.clientPort, dst.address, dst.port);
  }

  /**
   * Hands the connection to the native relay (tcp-offload.ts) when JavaScript has nothing left to do with
   * its bytes but watch them: the observer wants none (or the tap feeds it), nothing waits in Node or
   * libuv either way, neither side ended. The sockets are destroyed (their descriptors' dups keep the
   * connections). Returns whether it did.
   */
  offload(): boolean {
    const offload = this.listener.offload;
    const client = this.clientSocket;
    const upstream = this.upstream;
    if (
      offload === undefined ||
      this.relay >= 0 ||
      (this.sniffing && !offload.tap) ||
      this.state !== OPEN ||
      this.clientEnded ||
      this.upstreamEnded ||
      this.clientFinSent ||
      client === undefined ||
      upstream === undefined ||
      !drained(client) ||
      !drained(upstream)
    )
      return false;
    const clientFd = socketFd(client);
    const upstreamFd = socketFd(upstream);
    if (clientFd < 0 || upstreamFd < 0) return false;
    const o = this.listener.options;
    const slot = adoptRelay(
      offload.calls.start(
        clientFd,
        upstreamFd,
        o.idleTimeoutMs,
        o.halfCloseTimeoutMs,
        o.stallTimeoutMs,
        stallSweepMs(o.stallTimeoutMs),
      ),
      this,
    );
    // dup() failed (descriptors ran out): the JavaScript relay goes on.
    if (slot < 0) return false;
    offload.started++;
    if (this.sniffing) {
      // Before the loop polls the new relay: no chunk goes by untapped.
      offload.calls.tap(slot, TAP_BOTH);
      offload.tapped++;
    }
    this.relay = slot;
    this.baseFromClient = client.bytesRead;
    this.baseToClient = client.bytesWritten;
    client[kConn] = undefined;
    upstream[kConn] = undefined;
    client.destroy();
    upstream.destroy();
    this.clientSocket = undefined;
    this.upstream = undefined;
    return true;
  }

  /** The client is held back: what it sent waits for the endpoint to take it (backpressure). */
  clientHeld(): boolean {
    if (this.relay >= 0) return (this.listener.offload!.calls.held(this.relay) & 1) !== 0;
    return this.clientSocket?.isPaused() === true && (this.upstream?.writableLength ?? 0) > 0;
  }

  /** The endpoint is held back: what it sent waits for the client to take it. */
  endpointHeld(): boolean {
    if (this.relay >= 0) return (this.listener.offload!.calls.held(this.relay) & 2) !== 0;
    return this.upstream?.isPaused() === true;
  }

  /** Both sockets are closed (or were handed over and the native relay closed them). */
  socketsClosed(): boolean {
    return this.relay < 0 && (this.clientSocket?.destroyed ?? true) && (this.upstream?.destroyed ?? true);
  }

  /** A chunk the native relay read and wrote on: the sniffer's, as onClientData/onUpstreamData feed it. */
  relayTapped(side: number, chunk: Buffer): boolean {
    if (!this.sniffing) return false;
    this.sniffing = side === 0 ? this.sniffClient(chunk) : this.sniffEndpoint(chunk);
    return this.sniffing;
  }

  /** The native relay ended by itself: both sockets are closed. */
  relayEnded(reason: CloseReason, fromClient: number, toClient: number): void {
    this.#relayDone(fromClient, toClient);
    this.closeReason ??= reason;
    this.finish(reason);
  }

  #relayDone(fromClient: number, toClient: number): void {
    this.relay = -1;
    this.baseFromClient += fromClient;
    this.baseToClient += toClient;
    this.clientClosed = true;
    this.upstreamClosed = true;
  }

  /** One side sent FIN (already passed on); bound how long the other side may stay open. */
  halfClosed(reason: CloseReason): void {
    this.finBy ??= reason;
    const t = Math.min(this.listener.options.halfCloseTimeoutMs, MAX_TIMER_MS);
    if (t > 0 && !(this.clientEnded && this.upstreamEnded)) {
      // The half-close timer replaces the idle one on the client socket; its reason must win too.
      this.client.off('timeout', onIdleTimeout);
      this.client.setTimeout(t);
      this.upstream?.setTimeout(t);
      this.client.on('timeout', onHalfCloseTimeout);
      this.upstream?.on('timeout', onHalfCloseTimeout);
    }
  }

  /** Tears both sockets down now (an error, a reset or a timeout on either side). */
  abort(reason: CloseReason): void {
    this.closeReason ??= reason;
    const relay = this.relay;
    if (relay >= 0) {
      const offload = this.listener.offload!;
      const fromClient = offload.fromClient(relay);
      const toClient = offload.toClient(relay);
      offload.abort(relay, reason === 'stalled' ? 1 : 0);
      this.#relayDone(fromClient, toClient);
      this.finish(reason);
      return;
    }
    if (reason === 'stalled') {
      // With RST: what the kernel still holds for the endpoint that does not read is dropped at once.
      this.client.resetAndDestroy();
      this.upstream?.resetAndDestroy();
      return;
    }
    this.client.destroy();
    this.upstream?.destroy();
  }

  /**
   * The stall sweep (every open connection, every stallSweepMs). A client paused because the endpoint
   * takes none of its bytes is closed after `timeoutMs` with nothing moving: no byte read from either
   * side and none of ours taken by the endpoint's kernel (a slow reader is progress). Without an idle
   * timeout (whose timer any write would restart) the paused side's peer is probed with an empty write,
   * so a reset surfaces as an error within a sweep. A paused upstream (the client does not read) is
   * probed only: a client that leaves is seen on our pending writes to it, one that stays holds its own
   * socket.
   */
  checkStall(nowMs: number, timeoutMs: number): void {
    const upstream = this.upstream;
    // Also after the hand-over (no upstream socket then): the native relay checks its own.
    if (this.state !== OPEN || upstream === undefined || this.clientEnded || this.upstreamEnded) return;
    const client = this.client;
    const probe = this.listener.options.idleTimeoutMs === 0;
    if (probe && upstream.isPaused() && !upstream.writableEnded) upstream.write(EMPTY);
    if (!client.isPaused()) {
      this.stallSinceMs = 0;
      return;
    }
    const moved = client.bytesRead + upstream.bytesRead + bytesTaken(upstream);
    if (this.stallSinceMs === 0 || moved !== this.stallMark) {
      this.stallSinceMs = nowMs;
      this.stallMark = moved;
    } else if (nowMs - this.stallSinceMs >= timeoutMs) {
      this.abort('stalled');
      return;
    }
    // Not after our FIN went with the endpoint's last bytes (tcp-fin.ts): Node does not know of it.
    if (probe && !client.writableEnded && !this.clientFinSent) client.write(EMPTY);
  }

  /** Both sockets are gone: account once. */
  maybeFinish(): void {
    if (this.clientClosed && this.upstreamClosed) this.finish(this.finBy ?? 'client-fin');
  }

  finish(reason: CloseReason): void {
    if (this.state === CLOSED) return;
    const wasOpen = this.state === OPEN;
    this.state = CLOSED;
    this.closeReason ??= this.finBy ?? reason;
    this.endMs = this.listener.now();
    const stats = this.context.stats;
    stats.active--;
    this.forgetUpstream();
    this.listener.connections.delete(this);
    if (this.listener.connections.size === 0) this.listener.lastConnectionEnded();
    if (wasOpen) {
      stats.bytesFromClients += this.bytesFromClient;
      stats.bytesToClients += this.bytesToClient;
    }
    try {
      this.observer.closed(this);
    } catch (err) {
      observerFailed(this.context, this.observer, this.listener.log, err, 'closed');
    }
  }

  /** Feeds the observer a chunk from the client; returns whether it wants more (false once it threw). */
  sniffClient(chunk: Buffer): boolean {
    try {
      return this.observer.clientData?.(this, chunk) ?? false;
    } catch (err) {
      observerFailed(this.context, this.observer, this.listener.log, err, 'clientData');
      return false;
    }
  }

  /** As sniffClient, for a chunk from the endpoint. */
  sniffEndpoint(chunk: Buffer): boolean {
    try {
      return this.observer.endpointData?.(this, chunk) ?? false;
    } catch (err) {
      observerFailed(this.context, this.observer, this.listener.log, err, 'endpointData');
      return false;
    }
  }
}

/** Nothing of the socket's waits in Node or libuv either way, and it is open both ways. */
function drained(socket: net.Socket): boolean {
  const handle = (socket as net.Socket & { _handle?: { writeQueueSize?: number } | null })._handle;
  return (
    socket.writableLength === 0 &&
    socket.readableLength === 0 &&
    (handle?.writeQueueSize ?? 1) === 0 &&
    !socket.writableEnded &&
    !socket.readableEnded
  );
}

/** Bytes of ours the socket's kernel has taken: written, minus what still waits in Node and in libuv. */
function bytesTaken(socket: net.Socket): number {
  const handle = (socket as net.Socket & { _handle?: { writeQueueSize?: number } | null })._handle;
  return socket.bytesWritten - socket.writableLength - (handle?.writeQueueSize ?? 0);
}

function registerUpstream(conn: TcpConnection, upstream: net.Socket): void {
  if (conn.upstream !== upstream || upstream.destroyed || conn.state === CLOSED) return;
  const endpoint = conn.endpoint!;
  conn.ownKey = conn.listener.ownTraffic.tcpOpened(conn, upstream, endpoint.ip, endpoint.port);
}

function connOf(socket: net.Socket): TcpConnection | undefined {
  return (socket as ConnSocket)[kConn];
}

function onUpstreamConnect(this: net.Socket): void {
  const conn = connOf(this);
  if (conn === undefined || conn.upstream !== this) return;
  if (conn.state !== OPEN_CONNECTING || conn.client.destroyed) {
    this.destroy();
    return;
  }
  conn.connected();
}

function onUpstreamTimeout(this: net.Socket): void {
  const conn = connOf(this);
  if (conn === undefined || conn.upstream !== this) return;
  if (conn.state === OPEN_CONNECTING) {
    const err: NodeJS.ErrnoException = new Error('connect timeout');
    err.code = 'KUP_CONNECT_TIMEOUT';
    conn.connectFailed(err);
  }
}

function onUpstreamError(this: net.Socket, err: NodeJS.ErrnoException): void {
  const conn = connOf(this);
  if (conn === undefined || conn.upstream !== this) return;
  if (conn.state === OPEN_CONNECTING) conn.connectFailed(err);
  else conn.abort(err.code === 'ECONNRESET' ? 'endpoint-reset' : 'error');
}

function onUpstreamClose(this: net.Socket): void {
  const conn = connOf(this);
  if (conn === undefined || conn.upstream !== this) return;
  conn.upstreamClosed = true;
  if (conn.state === OPEN) {
    // The endpoint is gone; the client may still be flushing what we already sent it.
    if (!conn.client.destroyed) {
      if (conn.upstreamEnded && conn.clientEnded) conn.client.end();
      else if (!conn.upstreamEnded) conn.abort('endpoint-reset');
    }
  }
  conn.maybeFinish();
}

function onClientError(this: net.Socket, err: NodeJS.ErrnoException): void {
  const conn = connOf(this);
  if (conn === undefined) return;
  conn.abort(err.code === 'ECONNRESET' || err.code === 'EPIPE' ? 'client-reset' : 'error');
}

function onClientClose(this: net.Socket): void {
  const conn = connOf(this);
  if (conn === undefined) return;
  conn.clientClosed = true;
  if (conn.state === OPEN_CONNECTING) {
    // The client left while we were still dialling.
    conn.closeReason ??= 'client-reset';
    conn.upstream?.destroy();
    conn.upstreamClosed = true;
    conn.finish(conn.closeReason);
    return;
  }
  const upstream = conn.upstream;
  if (upstream !== undefined && !upstream.destroyed && !conn.clientEnded) conn.abort('client-reset');
  conn.maybeFinish();
}

function onClientEnd(this: net.Socket): void {
  const conn = connOf(this);
  if (conn === undefined) return;
  conn.clientEnded = true;
  const upstream = conn.upstream;
  if (upstream !== undefined) passFin(upstream, conn.upstreamEnded);
  conn.halfClosed('client-fin');
}

function onUpstreamEnd(this: net.Socket): void {
  const conn = connOf(this);
  if (conn === undefined || conn.upstream !== this) return;
  conn.upstreamEnded = true;
  // The FIN now rather than after the poll batch, as libuv's shutdown would (tcp-fin.ts); a client that
  // sent its own gets close() at once from passFin.
  const fin = conn.listener.tcpFin;
  if (fin !== undefined && !conn.clientFinSent && !conn.clientEnded) finNow(fin, conn.client);
  passFin(conn.client, conn.clientEnded);
  conn.halfClosed('endpoint-fin');
}

/**
 * Sends FIN on `to`. When `to` has already sent its own FIN (we read to its end) and everything we
 * wrote to it is in the kernel, close() sends the FIN after that data just as shutdown() would, and
 * saves the shutdown request: one system call and its callbacks per connection.
 */
function passFin(to: net.Socket, toEnded: boolean): void {
  if (toEnded && to.writableLength === 0) to.destroy();
  else to.end();
}

function onIdleTimeout(this: net.Socket): void {
  connOf(this)?.abort('idle-timeout');
}

function onHalfCloseTimeout(this: net.Socket): void {
  connOf(this)?.abort('half-close-timeout');
}

// The relay. A write that returns false pauses the reading side until the writing side drains.

// The sniffer reads a chunk after it has been written on: the bytes (and the wake-up of the side that
// waits for them) never wait for tracing. Nothing changes a chunk once it is read, so it is intact.

/** The header's cork (see connected()): the check phase after the next poll, where the client's bytes come. */
function uncorkNextTurn(upstream: net.Socket): void {
  setImmediate(uncork, upstream);
}

function uncork(upstream: net.Socket): void {
  upstream.uncork();
  const conn = connOf(upstream);
  if (conn !== undefined && mayHandOver(conn)) conn.offload();
}

function onClientData(this: net.Socket, chunk: Buffer): void {
  const conn = connOf(this);
  const upstream = conn?.upstream;
  if (upstream === undefined) return;
  const flowing = upstream.write(chunk);
  if (conn!.sniffing) conn!.sniffing = conn!.sniffClient(chunk);
  if (!flowing) this.pause();
  else if (mayHandOver(conn!)) conn!.offload();
}

function onUpstreamData(this: net.Socket, chunk: Buffer): void {
  const conn = connOf(this);
  if (conn === undefined || conn.upstream !== this) return;
  const fin = conn.listener.tcpFin;
  const next = fin === undefined ? 0 : endFollows(fin, this, chunk);
  let flowing: boolean;
  if (next === 1) {
    // The endpoint's FIN is next: it leaves with these bytes, so the client is not the one to close.
    flowing = writeWithFin(fin!, conn.client, chunk);
    conn.clientFinSent = true;
  } else flowing = conn.client.write(chunk);
  if (conn.sniffing) conn.sniffing = conn.sniffEndpoint(chunk);
  if (next < 0) {
    // The endpoint reset right behind these bytes, and the peek took the error: Node's next read would
    // find an end of stream instead (the relay would pass on a FIN and wait for the client).
    conn.abort(next === -ECONNRESET ? 'endpoint-reset' : 'error');
    return;
  }
  if (!flowing) this.pause();
  else if (mayHandOver(conn)) conn.offload();
}

function onUpstreamDrain(this: net.Socket): void {
  const conn = connOf(this);
  if (conn === undefined || conn.upstream !== this) return;
  conn.client.resume();
  if (mayHandOver(conn)) conn.offload();
}

function onClientDrain(this: net.Socket): void {
  const conn = connOf(this);
  conn?.upstream?.resume();
  if (conn !== undefined && mayHandOver(conn)) conn.offload();
}

/** The native relay may take the connection: the sniffer is done, or the tap can feed it. */
function mayHandOver(conn: TcpConnection): boolean {
  const offload = conn.listener.offload;
  return offload !== undefined && (!conn.sniffing || offload.tap);
}

const SERVER_OPTIONS: net.ServerOpts = { allowHalfOpen: true, pauseOnConnect: true, noDelay: true };

/**
 * A listener's listening socket, which leads to its listener: its handlers are functions shared by
 * every listener of the process, not closures of each (a listener kept 0.6 KB of them: the connection
 * closure, and listen()'s settled promise, which its permanent error handler held through its scope).
 */
class ListenerServer extends net.Server {
  readonly listener: TcpListener;

  constructor(listener: TcpListener, onConnection: (this: ListenerServer, socket: net.Socket) => void) {
    super(SERVER_OPTIONS, onConnection);
    this.listener = listener;
  }
}

/**
 * The connections of a listener that has had none: one empty list for all of them, never added to (a
 * list of its own is ~100 bytes per idle service port, in every worker).
 */
const NO_CONNECTIONS = new ActiveList<TcpConnection>();

/**
 * What a listener takes from its deps and options, resolved once: one frozen record shared by every
 * listener made from the same deps and options (the proxier's listeners all are), not 13 fields on
 * each (~0.1 KiB a service port).
 */
type ListenerShared = {
  readonly options: TcpRelayOptions;
  readonly log: Logger;
  readonly connect: Connector;
  readonly now: () => number;
  readonly fdPressure: FdPressure;
  readonly onEjection: EjectionListener | undefined;
  readonly ownTraffic: OwnTraffic;
  readonly tcpFin: TcpFinCalls | undefined;
  readonly offload: TcpOffload | undefined;
  readonly dial: TcpDialCalls | undefined;
  readonly accept: TcpAccept | undefined;
  readonly sweeper: Sweeper;
  /** Joined with the first connection: an idle listener is not swept (its entry was ~27 bytes). */
  readonly keepAlive: KeepAliveSweeper;
};

/** The records made so far, by deps, then options. */
const sharedRecords = new WeakMap<TcpRelayDeps, WeakMap<TcpRelayOptions, ListenerShared>>();

/**
 * The record of `deps` and `options`. Deps without an FdPressure or an OwnTraffic give each listener a
 * record of its own, as before: each listener then has its own of those.
 */
function listenerShared(options: TcpRelayOptions, deps: TcpRelayDeps): ListenerShared {
  const shareable = deps.fdPressure !== undefined && deps.ownTraffic !== undefined;
  let byOptions = shareable ? sharedRecords.get(deps) : undefined;
  const known = byOptions?.get(options);
  if (known !== undefined) return known;
  const offload = deps.tcpOffload === null ? undefined : (deps.tcpOffload ?? processTcpRelay() ?? undefined);
  const record: ListenerShared = Object.freeze({
    options,
    log: deps.log,
    connect: deps.connect ?? (net.connect as Connector),
    now: deps.now ?? Date.now,
    fdPressure: deps.fdPressure ?? new FdPressure(deps.log),
    onEjection: deps.onEjection,
    ownTraffic: deps.ownTraffic ?? new OwnTraffic(),
    tcpFin: deps.tcpFin === null ? undefined : (deps.tcpFin ?? processTcpFin().calls),
    offload,
    dial: deps.tcpDial === false || deps.connect !== undefined ? undefined : offload?.dial,
    accept: deps.tcpAccept === null ? undefined : (deps.tcpAccept ?? processTcpAccept() ?? undefined),
    sweeper: deps.sweeper ?? processSweeper,
    keepAlive: deps.keepAlive ?? defaultKeepAliveSweeper,
  });
  if (shareable) {
    if (byOptions === undefined) {
      byOptions = new WeakMap();
      sharedRecords.set(deps, byOptions);
    }
    byOptions.set(options, record);
  }
  return record;
}
/** A listening TCP socket for one service port. */
export class TcpListener implements KeepAliveSource, Sweepable, AcceptOwner {
  /** The net.Server, when the native listener (tcp-accept.ts) is not the one listening. */
  server: net.Server | undefined;
  /** The native listener's id while it listens; -1: none. */
  #native = -1;
  /** What it shares with every listener of the same deps and options (getters below). */
  readonly #shared: ListenerShared;
  /** Its open connections (a list of its own from the first accepted on; read only, outside). */
  connections: ActiveList<TcpConnection> = NO_CONNECTIONS;
  /** Waiters for the last connection to end (drained()); undefined while nobody waits. */
  #drained: PromiseWithResolvers<void> | undefined;
  /** Swapped by the proxier when the service port changes; read once per connection. */
  context: ServicePortContext;
  /** Which portal's traffic the rules send here: what a PROXY protocol header names as destination. */
  readonly destination: OriginalDestination;
  #port = 0;
  /** The port the last listen() asked for; 0: the kernel's choice. */
  #requestedPort = 0;
  #closed = false;
  /** listen()'s promise while it binds; undefined once settled, so nothing keeps it. */
  #binding: PromiseWithResolvers<void> | undefined;
  /** When the limit / a loop was last logged; undefined: never (not -Infinity: a double field is boxed). */
  #limitLoggedMs: number | undefined;
  #loopLoggedMs: number | undefined;

  static readonly #accept = function (this: ListenerServer, socket: net.Socket): void {
    this.listener.#onConnection(socket);
  };

  static readonly #onListening = function (this: ListenerServer): void {
    const listener = this.listener;
    // The port asked for is the port bound; only a kernel-picked one (0) is asked back (Server.address()
    // costs a getsockname and an address parse: ~4 µs, 37 ms of a cold start's 10,000 listeners).
    listener.#port = listener.#requestedPort || (this.address() as net.AddressInfo).port;
    const binding = listener.#binding;
    listener.#binding = undefined;
    binding?.resolve();
  };

  static readonly #onError = function (this: ListenerServer, err: NodeJS.ErrnoException): void {
    const listener = this.listener;
    const binding = listener.#binding;
    // A failed bind is the caller's to report, once. After it, current libuv sheds EMFILE on accept
    // itself (accepts and closes); an older one reports it here, as often as it retries.
    if (binding !== undefined) {
      listener.#binding = undefined;
      binding.reject(err);
    } else if (isFdExhausted(err)) listener.fdPressure.exhausted('accept', listener.now(), err);
    else listener.log.error({ err, service: listener.context.name }, 'Listener error');
  };

  constructor(
    context: ServicePortContext,
    options: TcpRelayOptions,
    deps: TcpRelayDeps,
    destination: OriginalDestination = LISTENER_DESTINATION,
  ) {
    this.context = context;
    this.destination = destination;
    this.#shared = listenerShared(options, deps);
  }

  get options(): TcpRelayOptions {
    return this.#shared.options;
  }

  get log(): Logger {
    return this.#shared.log;
  }

  get connect(): Connector {
    return this.#shared.connect;
  }

  get now(): () => number {
    return this.#shared.now;
  }

  get fdPressure(): FdPressure {
    return this.#shared.fdPressure;
  }

  get onEjection(): EjectionListener | undefined {
    return this.#shared.onEjection;
  }

  get ownTraffic(): OwnTraffic {
    return this.#shared.ownTraffic;
  }

  get tcpFin(): TcpFinCalls | undefined {
    return this.#shared.tcpFin;
  }

  get offload(): TcpOffload | undefined {
    return this.#shared.offload;
  }

  /** The native relay's dialling, when connections may use it (TcpRelayDeps.tcpDial). */
  get dial(): TcpDialCalls | undefined {
    return this.#shared.dial;
  }

  /** The native listening (tcp-accept.ts); undefined: a net.Server listens. */
  get accept(): TcpAccept | undefined {
    return this.#shared.accept;
  }

  /** The net.Server, made on first use. */
  #server(): net.Server {
    if (this.server !== undefined) return this.server;
    const server = new ListenerServer(this, TcpListener.#accept);
    // Permanent: adding and removing listeners turns the server's event table into a dictionary.
    server.on('listening', TcpListener.#onListening);
    server.on('error', TcpListener.#onError);
    this.server = server;
    return server;
  }

  get port(): number {
    return this.#port;
  }

  get keepAliveDelayMs(): number {
    return this.options.keepAliveDelayMs;
  }

  /** Stopped accepting (its established connections may still run). */
  get closed(): boolean {
    return this.#closed;
  }

  /**
   * Binds and listens; rejects with the socket error (EADDRINUSE, EACCES...). `ipv6Only`: a `::`
   * listener that does not also answer IPv4 (the NodePort of an IPv6-only Service).
   */
  listen(host: string, port: number, ipv6Only = false): Promise<void> {
    this.#requestedPort = port;
    // What the native listener cannot take (a host name, a bad port) goes to net.Server, which says why.
    if (this.accept !== undefined && isIP(host) !== 0 && Number.isInteger(port) && port >= 0 && port <= 65535)
      return this.#listenNatively(this.accept, host, port, ipv6Only);
    const binding = Promise.withResolvers<void>();
    this.#binding = binding;
    try {
      this.#server().listen({
        host,
        port,
        backlog: this.options.backlog,
        exclusive: true,
        ipv6Only,
        reusePort: this.options.reusePort === true,
      });
    } catch (err) {
      // Bad arguments throw at once (a bad port, a host that is no IP): a rejection all the same.
      this.#binding = undefined;
      binding.reject(err);
    }
    return binding.promise;
  }

  #listenNatively(accept: TcpAccept, host: string, port: number, ipv6Only: boolean): Promise<void> {
    const o = this.options;
    const id = accept.listen(this, host, port, o.backlog, ipv6Only, o.reusePort === true);
    if (id < 0) return Promise.reject(systemError(id, 'listen', host, port));
    this.#native = id;
    this.#port = port !== 0 ? port : accept.port(id);
    return Promise.resolve();
  }

  /** The native listener's connection (AcceptOwner): as #onConnection, with the descriptor. */
  accepted(fd: number, address: string, port: number): void {
    if (this.#closed) {
      this.accept!.calls.closeFd(fd, 0);
      return;
    }
    liveStats(this.context);
    const now = this.now();
    if (this.#turnedAway(fd, now)) return;
    const conn = new TcpConnection(this, undefined, fd, normalizeAddress(address), port, now);
    if (this.ownTraffic.isLocal(conn.clientAddress)) {
      const local = this.accept!.calls.localName(fd);
      if (this.#looped(conn, normalizeAddress(local?.[0]), local?.[1] ?? 0)) {
        this.#refuseLoop(fd, conn, now);
        return;
      }
    }
    // The JavaScript relay's connections get their net.Socket now.
    if (!conn.nativeDial) conn.wrapClient();
    this.#admit(conn);
  }

  /** accept() failed in the native listener (AcceptOwner): as a net.Server's error after listening. */
  acceptFailed(err: NodeJS.ErrnoException): void {
    if (isFdExhausted(err)) this.fdPressure.exhausted('accept', this.now(), err);
    else this.log.error({ err, service: this.context.name }, 'Listener error');
  }

  /** A local client: whether it is one of our own upstream sockets come back MAX_PASSES times. */
  #looped(conn: TcpConnection, localAddress: string, localPort: number): boolean {
    conn.tracked = true;
    conn.passes = this.ownTraffic.tcpPasses(conn.clientAddress, conn.clientPort, localAddress, localPort);
    return conn.passes >= MAX_PASSES;
  }

  #onConnection(socket: net.Socket): void {
    if (this.#closed) {
      socket.destroy();
      return;
    }
    // The service port's first connection gives it counters of its own (every count below is on them).
    liveStats(this.context);
    const now = this.now();
    if (this.#turnedAway(socket, now)) return;
    const conn = new TcpConnection(
      this,
      socket,
      -1,
      normalizeAddress(socket.remoteAddress),
      socket.remotePort ?? 0,
      now,
    );
    // Only a client on this host can be one of our own upstream sockets come back (a forwarding loop).
    if (
      this.ownTraffic.isLocal(conn.clientAddress) &&
      this.#looped(conn, normalizeAddress(socket.localAddress), socket.localPort ?? 0)
    ) {
      this.#refuseLoop(socket, conn, now);
      return;
    }
    (socket as ConnSocket)[kConn] = conn;
    socket.on('error', onClientError);
    socket.on('close', onClientClose);
    this.#admit(conn);
  }

  /** Counts a connection in and dials. */
  #admit(conn: TcpConnection): void {
    if (this.connections === NO_CONNECTIONS) {
      this.connections = new ActiveList();
      this.#shared.keepAlive.add(this);
    }
    this.connections.add(conn);
    conn.context.stats.accepted++;
    conn.context.stats.active++;
    if (this.connections.size === 1 && this.options.stallTimeoutMs > 0)
      this.#shared.sweeper.add(this, stallSweepMs(this.options.stallTimeoutMs));
    conn.dial();
  }

  /** The connection cap is reached or descriptors are short: the client is closed at once (#reject). */
  #turnedAway(client: net.Socket | number, now: number): boolean {
    const max = this.options.maxConnections;
    if (max > 0 && this.context.stats.active >= max) this.#reject(client, 'limit', now);
    else if (this.fdPressure.shedding(now)) this.#reject(client, 'fd-exhausted', now);
    else return false;
    return true;
  }

  /** Closes a connection at once without dialling; counted, and logged at most once per interval. */
  #reject(socket: net.Socket | number, reason: 'limit' | 'fd-exhausted', now: number): void {
    if (typeof socket === 'number') this.accept!.calls.closeFd(socket, 0);
    else {
      socket.on('error', () => {});
      socket.destroy();
    }
    countRejected(this.context.stats, reason);
    if (
      reason === 'limit' &&
      now - (this.#limitLoggedMs ?? Number.NEGATIVE_INFINITY) >= LIMIT_LOG_INTERVAL_MS
    ) {
      this.#limitLoggedMs = now;
      this.log.warn(
        { service: this.context.name, limit: this.options.maxConnections },
        'Connection limit reached, closing new connections',
      );
    }
  }

  /**
   * A connection that passed through us MAX_PASSES times already: reset (the RST runs back along the
   * loop and tears down every pass), counted as `loop`, logged at most once per interval.
   */
  #refuseLoop(socket: net.Socket | number, conn: TcpConnection, now: number): void {
    if (typeof socket === 'number') this.accept!.calls.closeFd(socket, 1);
    else {
      socket.on('error', () => {});
      socket.resetAndDestroy();
    }
    countRejected(this.context.stats, 'loop');
    if (now - (this.#loopLoggedMs ?? Number.NEGATIVE_INFINITY) >= LIMIT_LOG_INTERVAL_MS) {
      this.#loopLoggedMs = now;
      this.log.warn(
        {
          service: this.context.name,
          client: `${conn.clientAddress}:${conn.clientPort}`,
          passes: conn.passes,
        },
        'Forwarding loop: a connection came back from this proxy, refused',
      );
    }
  }

  /** The stall sweep of every connection; false (leaves the sweeper) once none is left. */
  sweep(nowMs: number): boolean {
    const timeout = this.options.stallTimeoutMs;
    for (const conn of this.connections) conn.checkStall(nowMs, timeout);
    return this.connections.size > 0;
  }

  /**
   * The UDP listener's hook, for a caller that treats listeners alike: TCP connections to an endpoint
   * that left keep running (as kube-proxy), so this closes nothing and returns 0.
   */
  endpointsChanged(): number {
    return 0;
  }

  /** Stops accepting. Established connections keep running until they end (as kube-proxy). */
  close(): Promise<void> {
    if (this.#closed) return Promise.resolve();
    this.#closed = true;
    // The listening socket closes now; server.close()'s callback would also wait for every connection.
    this.#stopListening();
    return Promise.resolve();
  }

  #stopListening(): void {
    if (this.#native >= 0) {
      this.accept!.close(this.#native);
      this.#native = -1;
    }
    this.server?.close();
  }

  /** Resolves once no connection is left (after close(): when the last established one has ended). */
  drained(): Promise<void> {
    if (this.connections.size === 0) return Promise.resolve();
    this.#drained ??= Promise.withResolvers<void>();
    return this.#drained.promise;
  }

  /** Called by a connection that leaves an empty set behind. */
  lastConnectionEnded(): void {
    const drained = this.#drained;
    this.#drained = undefined;
    drained?.resolve();
  }

  /** Stops accepting and tears down every connection now. */
  destroy(reason: CloseReason = 'shutdown'): void {
    this.#closed = true;
    this.#stopListening();
    for (const conn of this.connections) conn.abort(reason);
  }
}
