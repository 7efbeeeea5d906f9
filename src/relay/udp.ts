// UDP data path: one service socket per service port; one session per client ip:port with its own
// connected upstream socket; replies go back out through the service socket (so REDIRECT/DNAT
// conntrack rewrites their source to ClusterIP:port). Sessions expire after --udp-timeout without
// traffic either way, and are capped per service port and in total (the idlest is evicted), and are
// closed at once when their endpoint leaves the balancer (endpointsChanged).
import dgram from 'node:dgram';
import type { Logger } from '../lib/log.ts';
import type { Balancer } from '../loadbalancer/balancer.ts';
import type { Endpoint, EndpointKey } from '../state/endpoint.ts';
import type { IPFamily } from '../state/service-port.ts';
import { clientFamily, normalizeAddress } from './address.ts';
import type { CloseReason } from './close-reason.ts';
import { nextConnectionId } from './connection-id.ts';
import { type EjectionListener, endpointFailed } from './endpoint-failure.ts';
import { FdPressure } from './fd-pressure.ts';
import type { ConnectAttempt, ConnectionInfo, ConnectionObserver } from './observer.ts';
import { noopObserver } from './observer.ts';
import { observerFailed } from './observer-failure.ts';
import { MAX_PASSES, OwnTraffic, type PassOwner } from './own-traffic.ts';
import type { ServicePortContext } from './service-context.ts';
import { countPick, countRejected } from './service-context.ts';
import type { Sweepable, Sweeper } from './sweeper.ts';
import { processSweeper } from './sweeper.ts';
import {
  type FastHandle,
  processUdpFast,
  readFd,
  receiveError,
  resumeReads,
  stopReads,
  TAP_FIELDS,
  TAP_FROM_CLIENT,
  type UdpFastCalls,
  type UdpTap,
  udpTap,
  udpTapEnabled,
} from './udp-fast.ts';
import { type UdpSessionEntry, UdpSessionTable } from './udp-session-table.ts';

export type UdpRelayOptions = {
  /** Session idle timeout (--udp-timeout), reset by traffic both ways. */
  idleTimeoutMs: number;
  /** Sessions per service port; past it the idlest session is evicted. */
  maxSessions: number;
  /** Datagrams held per session while its upstream socket connects. */
  maxQueued: number;
  /** SO_RCVBUF/SO_SNDBUF of the service socket (capped by net.core.rmem_max/wmem_max). */
  socketBufferBytes: number;
  /**
   * SO_REUSEPORT on the service socket, so the worker processes (--workers) listen on the same port and
   * the kernel spreads clients over them by address and port (one client's datagrams stay on one).
   */
  reusePort?: boolean;
};

export const DEFAULT_UDP_OPTIONS: UdpRelayOptions = {
  idleTimeoutMs: 250,
  maxSessions: 4096,
  maxQueued: 64,
  socketBufferBytes: 4 << 20,
};

export type UdpRelayDeps = {
  log: Logger;
  /** Expires idle sessions (default: the process's sweeper). */
  sweeper?: Sweeper;
  now?: () => number;
  /** The cap across every UDP service port of the process; none when absent. */
  budget?: UdpSessionBudget;
  /** Shared by every listener of the process: descriptors run out for all of them at once. */
  fdPressure?: FdPressure;
  /** Shared by every listener of the process: datagrams that come back from our own sockets. */
  ownTraffic?: OwnTraffic;
  /** Each ejection this process decides (endpoint-failure.ts). */
  onEjection?: EjectionListener;
  /** Relays established sessions natively (udp-fast.ts); default: the process's addon; null: never. */
  udpFast?: UdpFastCalls | null;
  /**
   * Sessions whose observer still wants their datagrams are relayed natively too, their datagrams handed
   * to it through the addon's tap (udp-fast.ts); default: unless KUP_UDP_TAP=off.
   */
  udpTap?: boolean;
};

/** How often a listener may log that it dropped a looping datagram. */
const LOOP_LOG_INTERVAL_MS = 10_000;

function expireIdle(session: UdpSession): void {
  session.close('idle-timeout');
}

/** How many of the oldest sessions an eviction compares. */
const EVICTION_LOOK = 64;

/** After the addon could not read a listener's service socket, how long until it is asked again. */
export const FAST_RETRY_MS = 1000;

/** What the addon's stats() writes; read at once by the one caller (one thread). */
const FAST_STATS = new Float64Array(5);

const kSession = Symbol('kup.session');
type SessionSocket = dgram.Socket & { [kSession]?: UdpSession };

/** One client ip:port and its connected upstream socket. */
class UdpSession implements ConnectionInfo, PassOwner, UdpSessionEntry {
  readonly id = nextConnectionId();
  readonly listener: UdpListener;
  readonly context: ServicePortContext;
  /** Becomes noopObserver when its `opened` threw. */
  observer: ConnectionObserver;
  /** The observer wants the datagrams (false from the start without tracing, or once it threw). */
  sniffing: boolean;
  readonly clientAddress: string;
  /** The address as the service socket saw it (`::ffff:` form on a dual-stack socket): replies go there. */
  readonly replyAddress: string;
  readonly clientPort: number;
  /** The client's family, which picks the balancer (the original destination's family). */
  readonly family: IPFamily;
  /** The balancer the endpoint came from: failures and successes are reported to it. */
  readonly balancer: Balancer;
  readonly endpoint: Endpoint;
  readonly upstream: SessionSocket;
  readonly startMs: number;
  endMs = 0;
  #lastActivityMs: number;
  #bytesFromClient = 0;
  #bytesToClient = 0;
  /** Its handle in the addon while the addon relays it (udp-fast.ts); what it relayed is read from there. */
  fast: FastHandle | undefined = undefined;
  #fastFromClient = 0;
  #fastToClient = 0;
  failedAttempts: ConnectAttempt[] = [];
  closeReason: CloseReason | undefined = undefined;
  /** Datagrams waiting for the upstream connect; null once connected. */
  queue: Buffer[] | null = [];
  closed = false;
  observerData: unknown = undefined;
  /** Times this session's datagrams already passed through us (own-traffic.ts); local clients only. */
  passes = 0;
  /** The client is on this host: the upstream socket is registered once connected. */
  tracked = false;
  /** The upstream socket's registration in OwnTraffic; '' when none. */
  ownKey = '';
  /** Its slot in the listener's expiry wheel (udp-session-table.ts). */
  expirySlot = -1;

  constructor(
    listener: UdpListener,
    address: string,
    clientAddress: string,
    port: number,
    family: IPFamily,
    balancer: Balancer,
    endpoint: Endpoint,
    now: number,
  ) {
    this.listener = listener;
    this.context = listener.context;
    // Fixed for the session's life: a tracing change of the service port applies to new sessions.
    this.observer = listener.context.observer;
    this.sniffing = this.observer.wantsData;
    this.clientAddress = clientAddress;
    this.replyAddress = address;
    this.clientPort = port;
    this.family = family;
    this.balancer = balancer;
    this.endpoint = endpoint;
    this.startMs = now;
    this.#lastActivityMs = now;
    const upstream = dgram.createSocket(endpoint.family === 'IPv6' ? 'udp6' : 'udp4') as SessionSocket;
    upstream[kSession] = this;
    this.upstream = upstream;
    upstream.on('message', onUpstreamMessage);
    upstream.on('error', onUpstreamError);
    // No connect() callback: dgram calls it with the error, unbound; without one a failure is an 'error'.
    upstream.once('connect', onUpstreamConnect);
    upstream.connect(endpoint.port, endpoint.ip);
  }

  get lastActivityMs(): number {
    if (this.fast !== undefined) this.#pullFast();
    return this.#lastActivityMs;
  }
  set lastActivityMs(ms: number) {
    this.#lastActivityMs = ms;
  }
  get bytesFromClient(): number {
    if (this.fast !== undefined) this.#pullFast();
    return this.#bytesFromClient + this.#fastFromClient;
  }
  get bytesToClient(): number {
    if (this.fast !== undefined) this.#pullFast();
    return this.#bytesToClient + this.#fastToClient;
  }

  /** What the addon relayed for it: its counts, and its last datagram's age on this listener's clock. */
  #pullFast(): void {
    this.listener.udpFast!.stats(this.fast!, FAST_STATS);
    const age = FAST_STATS[0]!;
    if (age !== Number.POSITIVE_INFINITY) {
      const at = this.listener.now() - age;
      if (at > this.#lastActivityMs) this.#lastActivityMs = at;
    }
    this.#fastFromClient = FAST_STATS[1]!;
    this.#fastToClient = FAST_STATS[2]!;
  }

  /** The addon relays it no more: what it relayed stays in the counts. */
  leaveFast(): void {
    const fast = this.fast;
    if (fast === undefined) return;
    this.#pullFast();
    this.fast = undefined;
    this.#bytesFromClient += this.#fastFromClient;
    this.#bytesToClient += this.#fastToClient;
    this.#fastFromClient = 0;
    this.#fastToClient = 0;
    this.listener.udpFast!.remove(fast);
    this.listener.fastSessions?.delete(this.id);
  }

  /** A reply relayed by JavaScript. */
  countReply(length: number): void {
    this.#bytesToClient += length;
  }

  get service() {
    return this.context.name;
  }
  get protocol() {
    return 'UDP' as const;
  }

  send(msg: Buffer): void {
    this.#bytesFromClient += msg.length;
    if (this.queue !== null) {
      // Past maxQueued the datagram is dropped, as a full socket buffer would.
      if (this.queue.length < this.listener.options.maxQueued) this.queue.push(msg);
      return;
    }
    this.upstream.send(msg);
  }

  close(reason: CloseReason): void {
    if (this.closed) return;
    this.closed = true;
    this.closeReason = reason;
    this.endMs = this.listener.now();
    this.queue = null;
    // Before its socket closes: the addon holds a duplicate of the descriptor.
    this.leaveFast();
    this.upstream.close();
    if (this.ownKey !== '') this.listener.ownTraffic.udpClosed(this, this.ownKey);
    this.listener.sessions.delete(this);
    this.listener.budget?.delete(this);
    const stats = this.context.stats;
    stats.active--;
    stats.bytesFromClients += this.bytesFromClient;
    stats.bytesToClients += this.bytesToClient;
    try {
      this.observer.closed(this);
    } catch (err) {
      observerFailed(this.context, this.observer, this.listener.log, err, 'closed');
    }
  }

  /** Feeds the observer a datagram; once it wants no more (or threw), `sniffing` is false. */
  sniff(msg: Buffer, fromClient: boolean): void {
    try {
      const more = fromClient
        ? this.observer.clientData?.(this, msg)
        : this.observer.endpointData?.(this, msg);
      if (more !== true) this.sniffing = false;
    } catch (err) {
      this.sniffing = false;
      observerFailed(
        this.context,
        this.observer,
        this.listener.log,
        err,
        fromClient ? 'clientData' : 'endpointData',
      );
    }
  }
}

function onUpstreamConnect(this: SessionSocket): void {
  const session = this[kSession];
  if (session === undefined || session.closed) return;
  // Before the first datagram leaves: if it comes back to us, its source port is known.
  if (session.tracked) registerUpstream(session, this);
  const queued = session.queue!;
  session.queue = null;
  for (const msg of queued) this.send(msg);
}

function registerUpstream(session: UdpSession, socket: dgram.Socket): void {
  try {
    const { address, port } = socket.address();
    const endpoint = session.endpoint;
    session.ownKey = session.listener.ownTraffic.udpOpened(
      session,
      address,
      port,
      endpoint.ip,
      endpoint.port,
    );
  } catch {
    // Not bound after all: nothing to register.
  }
}

function onUpstreamMessage(this: SessionSocket, msg: Buffer): void {
  const session = this[kSession];
  if (session === undefined || session.closed) return;
  const listener = session.listener;
  session.lastActivityMs = listener.now();
  // The first reply proves the endpoint alive (UDP has no connect to succeed).
  if (session.bytesToClient === 0) session.balancer.reportSuccess(session.endpoint);
  session.countReply(msg.length);
  listener.socket.send(msg, session.clientPort, session.replyAddress);
  // After the send, as the TCP relay does: tracing never delays a reply.
  if (session.sniffing) session.sniff(msg, false);
  if (listener.mayHandOver(session)) listener.handOver(session);
}

function onUpstreamError(this: SessionSocket, err: NodeJS.ErrnoException): void {
  const session = this[kSession];
  if (session === undefined || session.closed) return;
  upstreamFailed(session, err);
}

function upstreamFailed(session: UdpSession, err: NodeJS.ErrnoException): void {
  // ICMP port unreachable surfaces as ECONNREFUSED on a connected socket: the endpoint is gone. Drop
  // the session and the client's affinity, so its next datagram picks again (legacy kept sending).
  // Without a socket for the session (fd-exhausted) it is our shortage: the session just closes.
  const listener = session.listener;
  const reason = endpointFailed(session, session.endpoint, err, listener, 'udp-session', listener.now());
  session.close(reason === 'refused' ? 'endpoint-reset' : 'error');
}

/**
 * The cap on UDP sessions across every service port: one session is one socket, so this bounds the
 * descriptors a flood of client ports can take. Past it the idlest of the oldest sessions is evicted
 * (not the new one refused: a flood of one-datagram clients would otherwise lock real clients out
 * until the idle timeout). Sessions are kept in creation order; a bounded look keeps it O(1).
 */
export class UdpSessionBudget {
  readonly max: number;
  /** Sessions evicted to make room (metrics). */
  evicted = 0;
  readonly #sessions = new Set<UdpSession>();

  constructor(max: number) {
    this.max = max;
  }

  get size(): number {
    return this.#sessions.size;
  }

  add(session: UdpSession): void {
    this.#sessions.add(session);
  }

  delete(session: UdpSession): void {
    this.#sessions.delete(session);
  }

  /** Evicts one session when the cap is reached, so that one more fits. */
  makeRoom(): void {
    if (this.#sessions.size < this.max) return;
    let victim: UdpSession | undefined;
    let looked = 0;
    for (const s of this.#sessions) {
      if (victim === undefined || s.lastActivityMs < victim.lastActivityMs) victim = s;
      if (++looked === EVICTION_LOOK) break;
    }
    if (victim === undefined) return;
    this.evicted++;
    victim.context.stats.udpSessionsEvicted++;
    victim.close('evicted');
  }
}

function endpointKeys(balancer: Balancer): Set<EndpointKey> {
  const keys = new Set<EndpointKey>();
  for (const e of balancer.endpoints) keys.add(e.key);
  return keys;
}

const kListener = Symbol('kup.listener');

/**
 * A listener's service socket, which leads to its listener: its handlers are functions shared by every
 * listener of the process, not closures of each (bind()'s callback and error handlers kept their scope).
 * A property, not a subclass: dgram sockets are made by createSocket() only.
 */
type ListenerSocket = dgram.Socket & { [kListener]: UdpListener };

/** The service socket of one UDP service port. */
export class UdpListener implements Sweepable {
  readonly socket: dgram.Socket;
  readonly options: UdpRelayOptions;
  readonly log: Logger;
  readonly now: () => number;
  readonly sessions: UdpSessionTable<UdpSession>;
  readonly budget: UdpSessionBudget | undefined;
  readonly fdPressure: FdPressure;
  readonly onEjection: EjectionListener | undefined;
  readonly ownTraffic: OwnTraffic;
  /** The addon that relays established sessions; undefined when there is none (or it is off). */
  readonly udpFast: UdpFastCalls | undefined;
  /** The addon's tap: sessions still sniffed are handed over with it; undefined keeps them here. */
  readonly tap: UdpTap | undefined;
  /** This listener in the addon, once it reads the service socket. */
  #fast: FastHandle | undefined;
  /** When the addon may be asked to read the service socket again after it could not (no descriptor). */
  #fastRetryMs = 0;
  /** The sessions the addon relays, by id (its errors name them so). */
  fastSessions: Map<number, UdpSession> | undefined;
  readonly #sweeper: Sweeper;
  #loopLoggedMs = Number.NEGATIVE_INFINITY;
  /** Swapped by the proxier when the service port changes. */
  context: ServicePortContext;
  #port = 0;
  #closed = false;
  /** listen()'s promise while it binds; undefined once settled, so nothing keeps it. */
  #binding: PromiseWithResolvers<void> | undefined;

  static readonly #receive = function (this: ListenerSocket, msg: Buffer, rinfo: dgram.RemoteInfo): void {
    this[kListener].#onMessage(msg, rinfo.address, rinfo.port);
  };

  static readonly #onListening = function (this: ListenerSocket): void {
    const listener = this[kListener];
    listener.#port = this.address().port;
    try {
      this.setRecvBufferSize(listener.options.socketBufferBytes);
      this.setSendBufferSize(listener.options.socketBufferBytes);
    } catch {
      // Capped or refused by the kernel limits; the defaults still work.
    }
    const binding = listener.#binding;
    listener.#binding = undefined;
    binding?.resolve();
  };

  static readonly #onError = function (this: ListenerSocket, err: Error): void {
    const listener = this[kListener];
    const binding = listener.#binding;
    // A failed bind is the caller's to report (it retries, and logs once).
    if (binding !== undefined) {
      listener.#binding = undefined;
      binding.reject(err);
    } else listener.log.warn({ err, service: listener.context.name }, 'UDP socket error');
  };

  constructor(
    context: ServicePortContext,
    options: UdpRelayOptions,
    deps: UdpRelayDeps,
    type: 'udp4' | 'udp6',
    /** A `::` socket that does not also receive IPv4 (the NodePort of an IPv6-only Service). */
    ipv6Only = false,
  ) {
    this.context = context;
    this.options = options;
    this.log = deps.log;
    this.now = deps.now ?? Date.now;
    this.#sweeper = deps.sweeper ?? processSweeper;
    this.sessions = new UdpSessionTable(this.#sweeper.intervalMs);
    this.budget = deps.budget;
    this.fdPressure = deps.fdPressure ?? new FdPressure(deps.log);
    this.onEjection = deps.onEjection;
    this.ownTraffic = deps.ownTraffic ?? new OwnTraffic();
    this.udpFast = deps.udpFast === null ? undefined : (deps.udpFast ?? processUdpFast().calls);
    this.tap =
      this.udpFast !== undefined && (deps.udpTap ?? udpTapEnabled()) ? udpTap(this.udpFast) : undefined;
    this.socket = dgram.createSocket({
      type,
      reuseAddr: false,
      reusePort: options.reusePort === true,
      ipv6Only,
    });
    (this.socket as ListenerSocket)[kListener] = this;
    this.socket.on('message', UdpListener.#receive);
    // Permanent: adding and removing listeners turns the socket's event table into a dictionary.
    this.socket.on('listening', UdpListener.#onListening);
    this.socket.on('error', UdpListener.#onError);
  }

  get port(): number {
    return this.#port;
  }

  listen(host: string, port: number): Promise<void> {
    const binding = Promise.withResolvers<void>();
    this.#binding = binding;
    try {
      this.socket.bind({ address: host, port, exclusive: true });
    } catch (err) {
      // Bad arguments (or a second bind) throw at once: a rejection all the same.
      this.#binding = undefined;
      binding.reject(err);
    }
    return binding.promise;
  }

  /** Datagrams the addon relayed for this listener, both ways (0 without it). */
  get fastDatagrams(): number {
    return this.#fast ? this.udpFast!.bypassed(this.#fast) : 0;
  }

  #onMessage(msg: Buffer, address: string, port: number): void {
    let session = this.sessions.get(address, port);
    const now = this.now();
    if (session === undefined) {
      session = this.#open(address, port, now);
      if (session === undefined) return;
    }
    session.lastActivityMs = now;
    session.send(msg);
    if (session.sniffing) session.sniff(msg, true);
    if (this.mayHandOver(session)) this.handOver(session);
  }

  /** The addon may relay the session: its observer wants no more datagrams, or the tap feeds them. */
  mayHandOver(session: UdpSession): boolean {
    return this.udpFast !== undefined && (!session.sniffing || this.tap !== undefined);
  }

  /**
   * Hands the session to the addon once it is connected, its endpoint has answered (the first reply
   * reports success to the balancer) and its observer wants no more bytes, or, with the tap, still
   * wants them (#tapped feeds it). From then on the addon reads the service socket: datagrams of other
   * clients come back through #onMessage.
   */
  handOver(session: UdpSession): void {
    if (session.fast !== undefined || session.queue !== null || session.closed || this.#closed) return;
    if (session.bytesToClient === 0) return;
    const calls = this.udpFast!;
    if (this.#fast === undefined) {
      // Its dup() can fail while descriptors run out: JavaScript relays meanwhile, and a later session
      // tries again (not at every datagram).
      const now = this.now();
      if (now < this.#fastRetryMs) return;
      this.#fast = this.#openFast(calls);
      if (this.#fast === undefined) {
        this.#fastRetryMs = now + FAST_RETRY_MS;
        return;
      }
    }
    const fd = readFd(session.upstream);
    if (fd < 0) return;
    // First: the addon polls the socket's own descriptor, which libuv must no longer watch.
    stopReads(session.upstream);
    const fast = calls.add(this.#fast, session.id, session.replyAddress, session.clientPort, fd);
    if (typeof fast === 'number') {
      // A send of dgram's still waiting for room, or an address it cannot hold: JavaScript keeps it.
      resumeReads(session.upstream);
      return;
    }
    // Before the loop polls it: no datagram goes by untapped.
    if (session.sniffing && calls.tap(fast, true) !== 0) {
      calls.remove(fast);
      resumeReads(session.upstream);
      return;
    }
    session.fast = fast;
    this.fastSessions ??= new Map();
    this.fastSessions.set(session.id, session);
  }

  #openFast(calls: UdpFastCalls): FastHandle | undefined {
    const fd = readFd(this.socket);
    if (fd < 0) return undefined;
    const fast = calls.open(
      fd,
      (msg, address, port) => this.#onMessage(msg, address, port),
      (id, errno) => {
        const session = this.fastSessions?.get(id);
        if (session !== undefined && !session.closed) upstreamFailed(session, receiveError(errno));
      },
      this.tap === undefined ? undefined : (count) => this.#tapped(count),
    );
    if (typeof fast === 'number') return undefined;
    stopReads(this.socket);
    return fast;
  }

  /**
   * A batch of datagrams the addon relayed for tapped sessions (`count` entries of the tap's info), each
   * fed to its session's observer as #onMessage and onUpstreamMessage feed theirs, after it was sent.
   * A session the observer is done with (or that ended meanwhile) is fed no more.
   */
  #tapped(count: number): void {
    const { info, buffer } = this.tap!;
    for (let at = 0; at < count * TAP_FIELDS; at += TAP_FIELDS) {
      const session = this.fastSessions?.get(info[at]!);
      if (session === undefined || !session.sniffing) continue;
      const offset = info[at + 2]!;
      session.sniff(buffer.subarray(offset, offset + info[at + 3]!), info[at + 1] === TAP_FROM_CLIENT);
      if (!session.sniffing && session.fast !== undefined) this.udpFast!.tap(session.fast, false);
    }
  }

  #open(address: string, port: number, now: number): UdpSession | undefined {
    const context = this.context;
    const clientAddress = normalizeAddress(address);
    // Only a client on this host can be one of our own session sockets come back (a forwarding loop).
    const tracked = this.ownTraffic.isLocal(clientAddress);
    const passes = tracked ? this.ownTraffic.udpPasses(clientAddress, port, this.#port) : 0;
    if (passes >= MAX_PASSES) {
      this.#refuseLoop(clientAddress, port, passes, now);
      return undefined;
    }
    const family = clientFamily(clientAddress);
    const balancer = context.balancers[family];
    const endpoint = balancer.pick(clientAddress, now);
    if (endpoint === undefined) {
      // Counted, never logged: a client retrying at its own pace must not flood the log. Userspace
      // cannot send the ICMP port unreachable kube-proxy's REJECT would (that needs a raw socket).
      context.stats.noEndpoints++;
      return undefined;
    }
    if (this.fdPressure.shedding(now)) {
      countRejected(context.stats, 'fd-exhausted');
      return undefined;
    }
    if (this.sessions.size >= this.options.maxSessions) this.#evictIdlest(now);
    this.budget?.makeRoom();
    countPick(context.stats, endpoint.key);
    const session = new UdpSession(this, address, clientAddress, port, family, balancer, endpoint, now);
    session.tracked = tracked;
    session.passes = passes;
    this.sessions.add(session, this.options.idleTimeoutMs);
    this.budget?.add(session);
    context.stats.accepted++;
    context.stats.active++;
    if (this.sessions.size === 1) this.#sweeper.add(this);
    const observer = session.observer;
    try {
      observer.opened(session);
    } catch (err) {
      // It saw no complete opening: it is not told of the close either.
      session.observer = noopObserver;
      session.sniffing = false;
      observerFailed(context, observer, this.log, err, 'opened');
    }
    return session;
  }

  /** A datagram that passed through us MAX_PASSES times: dropped, counted as `loop`, logged per interval. */
  #refuseLoop(address: string, port: number, passes: number, now: number): void {
    countRejected(this.context.stats, 'loop');
    if (now - this.#loopLoggedMs < LOOP_LOG_INTERVAL_MS) return;
    this.#loopLoggedMs = now;
    this.log.warn(
      { service: this.context.name, client: `${address}:${port}`, passes },
      'Forwarding loop: a datagram came back from this proxy, dropped',
    );
  }

  /** Evicts the idlest of the oldest sessions (a bounded look, so a flood stays O(1) per datagram). */
  #evictIdlest(now: number): void {
    this.sweep(now);
    if (this.sessions.size < this.options.maxSessions) return;
    let victim: UdpSession | undefined;
    let looked = 0;
    for (const s of this.sessions.values()) {
      if (victim === undefined || s.lastActivityMs < victim.lastActivityMs) victim = s;
      if (++looked === EVICTION_LOOK) break;
    }
    if (victim !== undefined) {
      this.context.stats.udpSessionsEvicted++;
      victim.close('evicted');
    }
  }

  /**
   * The proxier calls this after `setEndpoints` changed the set of a balancer of this listener's
   * context (either family), or after it swapped the context. Closes, as `endpoint-removed`, every
   * session whose endpoint is no longer in the current context's balancer for the session's family,
   * so the client's next datagram opens a new session on a live endpoint. O(sessions + endpoints);
   * nothing when there are no sessions. Returns how many sessions it closed.
   */
  endpointsChanged(): number {
    if (this.sessions.size === 0) return 0;
    const { balancers, stats } = this.context;
    const v4 = endpointKeys(balancers.IPv4);
    const v6 = balancers.IPv6 === balancers.IPv4 ? v4 : endpointKeys(balancers.IPv6);
    let closed = 0;
    // Map iteration tolerates deleting the visited entry (close() removes it).
    for (const s of this.sessions.values()) {
      if ((s.family === 'IPv4' ? v4 : v6).has(s.endpoint.key)) continue;
      // The dropped session's affinity went with the endpoint (setEndpoints forgets it).
      stats.udpSessionsEndpointRemoved++;
      s.close('endpoint-removed');
      closed++;
    }
    return closed;
  }

  sweep(nowMs: number): boolean {
    this.sessions.sweep(nowMs, this.options.idleTimeoutMs, expireIdle);
    return this.sessions.size > 0 && !this.#closed;
  }

  /** Closes the service socket; sessions are broken (as kube-proxy) and reported as service-removed. */
  /** Resolves at once: close() ends every session with the socket (UDP has nothing to finish). */
  drained(): Promise<void> {
    return Promise.resolve();
  }

  close(reason: CloseReason = 'service-removed'): Promise<void> {
    if (this.#closed) return Promise.resolve();
    this.#closed = true;
    this.#sweeper.delete(this);
    for (const s of this.sessions.values()) s.close(reason);
    if (this.#fast) this.udpFast!.close(this.#fast);
    this.#fast = undefined;
    return new Promise((resolve) => {
      try {
        this.socket.close(() => resolve());
      } catch {
        resolve();
      }
    });
  }

  destroy(): void {
    void this.close('shutdown');
  }
}
