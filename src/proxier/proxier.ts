// The proxier: makes the running service ports match the desired snapshot. Opens and closes each
// service port's listeners (service-port-runtime.ts, ports from the binder), hands endpoints and
// affinity to their balancers in place, holds NodePorts (node-port-claims.ts), and has the portal
// programmer write the rules (portal-tracker.ts). One sync at a time; the sync loop decides when.

import type { ProxyProtocolMode } from '../config/config.ts';
import type { Clock } from '../lib/clock.ts';
import { realClock } from '../lib/clock.ts';
import { isProxyError, ProxyError } from '../lib/errors.ts';
import type { Logger } from '../lib/log.ts';
import { Yielder } from '../lib/yielder.ts';
import type { OutlierOptions } from '../loadbalancer/outlier.ts';
import type { EjectionListener } from '../relay/endpoint-failure.ts';
import { FD_PROBE_MS, FdPressure } from '../relay/fd-pressure.ts';
import { KeepAliveSweeper } from '../relay/keepalive.ts';
import type { ConnectionObserver } from '../relay/observer.ts';
import { noopObserver } from '../relay/observer.ts';
import { OwnTraffic } from '../relay/own-traffic.ts';
import type { ServicePortStats } from '../relay/service-context.ts';
import { processSweeper, Sweeper } from '../relay/sweeper.ts';
import type { Connector, TcpRelayOptions } from '../relay/tcp.ts';
import type { UdpRelayOptions } from '../relay/udp.ts';
import { UdpSessionBudget } from '../relay/udp.ts';
import type { ServicePortEndpoints } from '../state/endpoint.ts';
import type { TimeSlices } from '../state/proxy-state.ts';
import {
  parseServicePortKey,
  type ServicePort,
  type ServicePortKey,
  samePortals,
} from '../state/service-port.ts';
import type { Snapshot } from '../state/snapshot.ts';
import { isDualStack } from './family-balancers.ts';
import { readLocalAddresses } from './local-addresses.ts';
import { type Concerns, LoopGuard, type OwnPortsOptions } from './loop-guard.ts';
import { NodePortClaims, nodePortHostsFor } from './node-port-claims.ts';
import type { PortAllocator } from './port-allocator.ts';
import { PortBinder } from './port-binder.ts';
import { noPortals, type PortalProgrammer, type PortalSpec } from './portal-programmer.ts';
import { PortalTracker } from './portal-tracker.ts';
import { type ListenerFactory, relayListeners } from './service-port-listener.ts';
import {
  type ListenerPort,
  needsLocalListener,
  type RuntimeDeps,
  ServicePortRuntime,
  type ServicePortStatus,
} from './service-port-runtime.ts';

// What server/debug.ts reads; declared beside the runtime that builds it.
export type { ServicePortStatus } from './service-port-runtime.ts';

/** From this many new service ports in one sync, their rules are written while they bind. */
export const OVERLAP_MIN_SERVICE_PORTS = 64;

const NO_LISTENER_PORTS: readonly ListenerPort[] = Object.freeze([]);

/** A snapshot's change sets once told (Proxier.releaseChanges). */
const NO_CHANGES: Pick<Snapshot, 'changedServicePorts' | 'changedEndpoints' | 'triggerTimes'> = Object.freeze(
  {
    changedServicePorts: new Set<ServicePortKey>(),
    changedEndpoints: new Set<ServicePortKey>(),
    triggerTimes: Object.freeze([]),
  },
);

/** Something that hands out the desired state: the state module's checkout(). */
export interface SnapshotSource {
  checkout(): Snapshot;
  /** checkout() in time slices; it must take the pending changes before its first await. */
  checkoutAsync?(slices: TimeSlices): Promise<Snapshot>;
  readonly isInitialized: boolean;
  /** True when only endpoint changes are pending (see Proxier.applyEndpointChanges). */
  readonly onlyEndpointsPending?: boolean;
}

export type ProxierOptions = {
  /** Address the listeners bind: `::` (dual-stack, all addresses), `0.0.0.0`, or one IP. */
  listenHost: string;
  tcp: TcpRelayOptions;
  udp: UdpRelayOptions;
  /** Periodic full sync interval (--iptables-sync-period). */
  syncPeriodMs: number;
  /** How many ports to try when a bind fails because someone else holds the port. */
  bindAttempts?: number;
  /** Passive outlier ejection of endpoints that fail connects; undefined = off. */
  outlier?: OutlierOptions;
  /** Hold each NodePort with a listener of our own (iptables mode). */
  claimNodePorts?: boolean;
  /**
   * The addresses NodePorts are held on, read every sync (--nodeport-addresses: only those the rules
   * match); undefined = every address, one listener on `listenHost`.
   */
  nodePortHosts?: () => readonly string[] | undefined;
  /** UDP sessions across all service ports (the idlest is evicted past it); undefined or 0 = no cap. */
  udpMaxTotalSessions?: number;
  /** --proxy-protocol: the header of TCP service ports without the annotation; default off. */
  proxyProtocol?: ProxyProtocolMode;
  /**
   * Rules send traffic to the listeners although this proxier writes none: a worker process's, whose
   * main process writes them (listeners per external destination, ClusterIP as a destination).
   */
  portalsElsewhere?: boolean;
  /** ClientIP affinity by rendezvous hashing (several processes serve one port: --workers). */
  affinityByHash?: boolean;
};

export type ProxierDeps = {
  source: SnapshotSource;
  allocator: PortAllocator;
  portals?: PortalProgrammer;
  log: Logger;
  clock?: Clock;
  connect?: Connector;
  /**
   * Makes the listeners of service ports and NodePort claims; default: the real TCP and UDP relays
   * (with `connect`, fdPressure and udpBudget). Tests inject one without sockets.
   */
  listeners?: ListenerFactory;
  /** The observer for a service port (tracing); noop by default. */
  observerFor?: (servicePort: ServicePort) => ConnectionObserver;
  /** Proxy ports to reuse when free (`ns/name:port/PROTO` → port), e.g. read back from a previous
   * process's rules, so those rules stay valid across a restart. */
  preferredPorts?: ReadonlyMap<string, number>;
  /**
   * Called after a sync whose listeners moved, with the proxy ports that changed since the last call
   * (`ns/name:port/PROTO[...]` → port; undefined: gone), e.g. to tell the workers or to keep them all
   * (proxyPorts()) in a state file. Not called when nothing moved.
   */
  onProxyPortsChanged?: (changes: ReadonlyMap<string, number | undefined>) => void;
  /** This host's addresses, read at each sync (default: the interfaces' addresses). */
  localAddresses?: () => readonly string[];
  /** Bind exactly the ports of `preferredPorts` (a worker process: see PortBinder). */
  exactPorts?: boolean;
  /** Makes the guard that leaves out endpoints leading back to us (tests count what it is asked). */
  loopGuard?: (options: OwnPortsOptions) => LoopGuard;
  /** Each ejection this proxier's relays decide (--workers: the other processes are told). */
  onEjection?: EjectionListener;
  /**
   * The endpoints of `snapshot` went to the balancers (the fast path, or a sync before it writes the
   * rules): --workers tells the other processes at once rather than after the rules.
   */
  onEndpointsApplied?: (snapshot: Snapshot) => void;
};

/** Another process's counters added to a service port's own (Proxier.setStatsOverlay). */
export type StatsOverlay = (key: ServicePortKey, own: ServicePortStats) => ServicePortStats;

export type SyncResult = {
  full: boolean;
  durationMs: number;
  opened: number;
  closed: number;
  failed: number;
};

export class Proxier {
  #listenHost: string;
  readonly #options: ProxierOptions;
  readonly #source: SnapshotSource;
  readonly #log: Logger;
  readonly #clock: Clock;
  readonly #binder: PortBinder;
  readonly #claims: NodePortClaims;
  readonly #portals: PortalTracker;
  readonly #runtimeDeps: RuntimeDeps;
  readonly #onProxyPortsChanged: ((changes: ReadonlyMap<string, number | undefined>) => void) | undefined;
  readonly #services = new Map<ServicePortKey, ServicePortRuntime>();
  /** Service ports that should run but could not be opened; retried every sync. */
  readonly #failed = new Map<ServicePortKey, ProxyError>();
  /** Closed listeners whose connections may still run (shutdown). */
  readonly #draining = new Set<ServicePortRuntime>();
  #snapshot: Snapshot | undefined;
  #lastFullSyncMs = Number.NEGATIVE_INFINITY;
  #needFullSync = true;
  #closed = false;
  #syncing = false;
  /**
   * The listeners' proxy ports of each touched service port as they were before a sync first touched it
   * (what was last noted), until #noteTouched compares them with what runs: kept only meanwhile.
   */
  readonly #portsBefore = new Map<ServicePortKey, readonly ListenerPort[]>();
  /**
   * The service ports stopped since the sync last noted what changed, as the loop guard's picture has
   * them: taken out (or replaced by a successor) only then, as if they had run until then.
   */
  readonly #placedBeforeStop = new Map<ServicePortKey, ServicePort>();
  /** Proxy ports that changed since onProxyPortsChanged was last called (undefined: gone). */
  readonly #portChanges = new Map<string, number | undefined>();
  #statsOverlay: StatsOverlay | undefined;
  readonly #onEndpointsApplied: ((snapshot: Snapshot) => void) | undefined;
  /** Descriptor exhaustion, shared by every listener (metrics read its counts). */
  readonly fdPressure: FdPressure;
  /** Connections and datagrams that come back from our own sockets, shared by every listener. */
  readonly ownTraffic = new OwnTraffic();
  /** Leaves out endpoints that lead back to us; told of each service port a sync touched. */
  readonly #loopGuard: LoopGuard;
  /** Running service ports with ClientIP affinity: the only ones whose entries expire. */
  readonly #withAffinity = new Map<ServicePortKey, ServicePortRuntime>();
  /** The addresses NodePorts were held on at the last sync, joined (when they change, all are looked at). */
  #claimHostsKey: string | undefined;
  /**
   * Service ports checked out whose listeners, settings or NodePort claims a sync has not finished
   * looking at (kept when a sync fails half-way), and whether every one's endpoints must be filtered
   * again (the host's addresses changed).
   */
  readonly #touched = new Set<ServicePortKey>();
  #refilterAll = false;
  readonly #readLocalAddresses: () => readonly string[];
  /** The host's addresses at the last sync, and the same joined (to see a change). */
  #localAddresses: ReadonlySet<string> = new Set();
  #localAddressesKey = '';
  /** The timer the listeners and the descriptor probe are swept on. */
  readonly #sweeper: Sweeper;
  /** The cap on UDP sessions across service ports; undefined = none. */
  readonly udpBudget: UdpSessionBudget | undefined;
  /** Timestamps for health and metrics (epoch ms; 0 = never). */
  lastSyncMs = 0;
  lastSyncResult: SyncResult | undefined;

  constructor(options: ProxierOptions, deps: ProxierDeps) {
    this.#options = options;
    this.#listenHost = options.listenHost;
    this.#source = deps.source;
    this.#log = deps.log;
    this.#clock = deps.clock ?? realClock;
    this.#onProxyPortsChanged = deps.onProxyPortsChanged;
    this.#onEndpointsApplied = deps.onEndpointsApplied;
    this.fdPressure = new FdPressure(deps.log);
    this.#readLocalAddresses = deps.localAddresses ?? readLocalAddresses;
    const total = options.udpMaxTotalSessions ?? 0;
    this.udpBudget = total > 0 ? new UdpSessionBudget(total) : undefined;
    const sweepers = sweepersFor(this.#clock);
    this.#sweeper = sweepers.sweeper ?? processSweeper;
    // libuv sheds accepts without a descriptor silently: a probe a second sees it (fd-pressure.ts).
    this.#sweeper.add(this.fdPressure, FD_PROBE_MS);
    const listeners =
      deps.listeners ??
      relayListeners(options, {
        log: deps.log,
        connect: deps.connect,
        now: () => this.#clock.now(),
        fdPressure: this.fdPressure,
        budget: this.udpBudget,
        ownTraffic: this.ownTraffic,
        onEjection: deps.onEjection,
        ...sweepers,
      });
    this.#binder = new PortBinder({
      allocator: deps.allocator,
      listeners,
      preferredPorts: deps.preferredPorts ?? new Map(),
      log: deps.log,
      host: () => this.#listenHost,
      bindAttempts: options.bindAttempts,
      isFailing: (key) => this.#failed.has(key),
      exact: deps.exactPorts,
    });
    this.#claims = new NodePortClaims({ listeners, log: deps.log });
    this.#portals = new PortalTracker(deps.portals ?? noPortals, options.claimNodePorts === true);
    const ownPorts: OwnPortsOptions = {
      nodePorts: options.claimNodePorts === true,
      portals: this.#portals.enabled || options.portalsElsewhere === true,
    };
    this.#loopGuard = (deps.loopGuard ?? ((o) => new LoopGuard(deps.log, o)))(ownPorts);
    this.#runtimeDeps = {
      binder: this.#binder,
      outlier: options.outlier,
      observerFor: deps.observerFor ?? (() => noopObserver),
      log: deps.log,
      loopGuard: this.#loopGuard,
      portals: ownPorts.portals,
      proxyProtocolDefault: options.proxyProtocol ?? 'off',
      affinityByHash: options.affinityByHash === true,
    };
  }

  /** Every running service port's proxy port, keyed `ns/name:port/PROTO` (the preferredPorts format). */
  proxyPorts(): Map<string, number> {
    const out = new Map<string, number>();
    for (const rt of this.#services.values())
      for (const [key, port] of rt.proxyPortsByKey()) out.set(key, port);
    return out;
  }

  /** How many service ports run. */
  get size(): number {
    return this.#services.size;
  }

  /** True when endpoint changes applied without a sync (0 <-> N) changed what the rules must say. */
  get portalsPending(): boolean {
    return this.#portals.pending;
  }

  /** Service ports that are running, with their proxy ports and current endpoints. */
  status(): ServicePortStatus[] {
    const out: ServicePortStatus[] = [];
    for (const rt of this.#services.values()) out.push(this.#withOverlay(rt.status()));
    return out;
  }

  /**
   * Another process of this proxy ejected `endpoint` of service port `key` until `untilMs` (--workers):
   * every balancer here that holds it skips it too. True when one did.
   */
  applyEjection(key: ServicePortKey, endpoint: string, untilMs: number, ejections: number): boolean {
    const rt = this.#services.get(key);
    if (rt === undefined) return false;
    const now = this.#clock.now();
    let applied = false;
    for (const balancer of rt.balancers()) {
      if (!balancer.endpoints.some((e) => e.key === endpoint)) continue;
      if (balancer.ejectedElsewhere(endpoint, untilMs, ejections, now)) applied = true;
    }
    return applied;
  }

  /**
   * Adds other processes' counters to what status() reports of each service port (--workers: the main
   * process sets the workers'); undefined: this process's own.
   */
  setStatsOverlay(overlay: StatsOverlay | undefined): void {
    this.#statsOverlay = overlay;
  }

  #withOverlay(status: ServicePortStatus): ServicePortStatus {
    const overlay = this.#statsOverlay;
    if (overlay === undefined) return status;
    const stats = overlay(status.servicePort.key, status.context.stats);
    return stats === status.context.stats ? status : { ...status, context: { ...status.context, stats } };
  }

  /** Service ports that should run but have no listener, with why. */
  failures(): ReadonlyMap<ServicePortKey, ProxyError> {
    return this.#failed;
  }

  get(key: ServicePortKey): ServicePortStatus | undefined {
    const rt = this.#services.get(key);
    return rt === undefined ? undefined : this.#withOverlay(rt.status());
  }

  /** NodePort claims that failed, by running service port (for /debug/services). */
  nodePortErrors(): Map<ServicePortKey, ProxyError> {
    const out = new Map<ServicePortKey, ProxyError>();
    for (const key of this.#services.keys()) {
      const err = this.#claims.error(key);
      if (err !== undefined) out.set(key, err);
    }
    return out;
  }

  /** The running service ports and their proxy ports, for the portal programmer. */
  portals(): PortalSpec[] {
    const out: PortalSpec[] = [];
    for (const rt of this.#services.values()) out.push(this.#portalOf(rt));
    return out;
  }

  /** Forces the next sync to be a full one (e.g. rules were found missing). */
  requestFullSync(): void {
    this.#needFullSync = true;
  }

  /** True while sync() runs: from its checkout until the portals are programmed. */
  get syncing(): boolean {
    return this.#syncing;
  }

  /**
   * Hands pending endpoint changes to the balancers now, without a sync: neither listeners nor rules
   * depend on endpoints (the legacy proxier also passed endpoint updates straight to its load
   * balancer), so a scale-out or a dead pod takes effect in microseconds, not after
   * --iptables-min-sync-period. Only when the source has nothing but endpoint changes pending, no sync
   * is running (its checkout would be applied after this one) and a first sync has run. Returns the
   * snapshot applied, or undefined when the caller must queue a sync instead.
   */
  applyEndpointChanges(): Snapshot | undefined {
    if (this.#closed || this.#syncing || this.lastSyncMs === 0) return undefined;
    if (!this.#source.isInitialized || this.#source.onlyEndpointsPending !== true) return undefined;
    const snapshot = this.#source.checkout();
    this.#snapshot = snapshot;
    this.#applyEndpoints(snapshot);
    this.#onEndpointsApplied?.(snapshot);
    return snapshot;
  }

  /**
   * One sync: applies what changed since the last checkout, retries failed service ports, cleans
   * expired affinity, then programs the portals. Does nothing until the source is initialized.
   */
  async sync(): Promise<SyncResult | undefined> {
    if (this.#closed || !this.#source.isInitialized || this.#syncing) return undefined;
    this.#syncing = true;
    try {
      return await this.#sync();
    } finally {
      this.#syncing = false;
    }
  }

  async #sync(): Promise<SyncResult | undefined> {
    const started = this.#clock.now();
    const full = this.#needFullSync || started - this.#lastFullSyncMs >= this.#options.syncPeriodMs;
    // Thousands of service ports at once would hold the event loop (the checkout, then binds that are
    // synchronous, with awaits between them that never reach I/O): connections get a turn every few ms.
    const yielder = new Yielder();
    // The changes are taken synchronously, in this call (health counts on it); only the work is sliced.
    const snapshot =
      this.#source.checkoutAsync !== undefined
        ? await this.#source.checkoutAsync(yielder)
        : this.#source.checkout();
    if (this.#closed) return undefined;
    this.#snapshot = snapshot;
    let opened = 0;
    let closed = 0;
    const initial = this.lastSyncMs === 0;
    // Before any listener opens, so that the endpoints it is given are filtered with them: only those
    // running already were filtered with other addresses (none at the first sync).
    if (this.#refreshLocalAddresses() && this.#services.size > 0) this.#refilterAll = true;
    // Every service port whose listeners or settings this sync may change: nothing else is looked at.
    for (const key of snapshot.changedServicePorts) this.#touch(key);
    for (const key of this.#failed.keys()) this.#touch(key);

    // Removed service ports: close their listeners (established TCP connections keep running).
    for (const key of snapshot.changedServicePorts) {
      if (snapshot.servicePorts.has(key)) continue;
      this.#failed.delete(key);
      const rt = this.#services.get(key);
      if (rt === undefined) continue;
      await this.#stop(rt);
      closed++;
      if (yielder.due) await yielder.turn();
      if (this.#closed) return undefined;
    }

    // Added or changed service ports, and earlier failures.
    const toEnsure = new Set<ServicePortKey>();
    for (const key of snapshot.changedServicePorts) if (snapshot.servicePorts.has(key)) toEnsure.add(key);
    for (const key of this.#failed.keys()) toEnsure.add(key);
    const toStart: ServicePort[] = [];
    for (const key of toEnsure) {
      const servicePort = snapshot.servicePorts.get(key);
      if (servicePort === undefined) {
        this.#failed.delete(key);
        continue;
      }
      const rt = this.#services.get(key);
      if (rt === undefined) toStart.push(servicePort);
      else if (isDualStack(rt.servicePort) !== isDualStack(servicePort)) {
        // Its balancers are per family: a service port that gains or loses a family starts anew.
        await this.#stop(rt);
        toStart.push(servicePort);
      } else {
        this.#update(rt, servicePort, snapshot.endpoints.get(key));
        if (needsLocalListener(servicePort) !== rt.hasLocal)
          await this.#reconcileLocal(rt, snapshot.endpoints.get(key));
        if (this.#services.get(key) === rt) await this.#reconcilePortals(rt);
      }
      if (this.#closed) return undefined;
    }
    // In key order, not arrival order: two service ports whose hashed proxy ports collide get the same
    // ports whatever order the manifest or the API lists them in (port-allocator.ts).
    toStart.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
    const { planned, early } = this.#restoreEarly(toStart, snapshot, full, initial);
    for (const [i, servicePort] of toStart.entries()) {
      if (
        await this.#start(servicePort, snapshot.endpoints.get(servicePort.key), planned.get(servicePort.key))
      )
        opened++;
      if (yielder.due) await yielder.turn();
      if (this.#closed) {
        for (const sp of toStart.slice(i + 1)) {
          const port = planned.get(sp.key);
          if (port !== undefined) this.#binder.release(port);
        }
        await early;
        return undefined;
      }
    }

    // What answers as us may have changed (ports opened or closed, portals, the host's addresses).
    this.#noteTouched();
    await this.#refilterLoops(yielder);
    if (this.#closed) return undefined;
    this.#applyEndpoints(snapshot);
    this.#onEndpointsApplied?.(snapshot);

    const now = this.#clock.now();
    for (const rt of this.#withAffinity.values()) {
      rt.cleanupAffinity(now);
      if (yielder.due) await yielder.turn();
      if (this.#closed) return undefined;
    }
    // The rules depend on service ports, their proxy ports and NodePort claims only (the tracker's
    // touched keys): a sync that changed none of them (an affinity change) does not touch iptables.
    if (this.#options.claimNodePorts) {
      await this.#ensureNodePorts(yielder);
      if (this.#closed) return undefined;
    }
    this.#touched.clear();

    if (early !== undefined) {
      const err = await early;
      if (err !== undefined) throw err;
      // What changed since the early restore (a listener on another port, a failure, NodePort claims):
      // a delta, usually empty.
      await this.#programPortals(false, initial);
    } else if (full || this.#portals.pending) {
      await this.#programPortals(full, initial);
    }
    // Closed while the rules were written (a shutdown does not wait for a sync stuck on the xtables
    // lock): its listeners are gone, and an empty port map must not reach the state file.
    if (this.#closed) return undefined;
    if (full) this.#lastFullSyncMs = started;
    this.#needFullSync = false;
    // After the rules: what a restart reads back should be what the rules in place point at.
    if (this.#portChanges.size > 0) {
      const changes = new Map(this.#portChanges);
      this.#portChanges.clear();
      this.#onProxyPortsChanged?.(changes);
    }
    const result: SyncResult = {
      full,
      durationMs: this.#clock.now() - started,
      opened,
      closed,
      failed: this.#failed.size,
    };
    this.lastSyncMs = this.#clock.now();
    this.lastSyncResult = result;
    return result;
  }

  /**
   * Many new service ports (a cold start): their ports are allocated first and the rules written while
   * the listeners bind (a restore of 10,000 service ports takes ~0.8 s of kernel time, binding them
   * ~0.5 s). A listener that ends up on another port is put right by a delta afterwards. `early`
   * resolves to the restore's error, if any; undefined when there is no early restore.
   */
  #restoreEarly(
    toStart: readonly ServicePort[],
    snapshot: Snapshot,
    full: boolean,
    initial: boolean,
  ): { planned: Map<ServicePortKey, number>; early: Promise<unknown> | undefined } {
    const planned = new Map<ServicePortKey, number>();
    if (toStart.length < OVERLAP_MIN_SERVICE_PORTS || !this.#portals.enabled)
      return { planned, early: undefined };
    const plannedPortals = this.portals();
    for (const sp of toStart) {
      // A second listener is not planned: such service ports get their rules from the delta.
      if (needsLocalListener(sp)) continue;
      const port = this.#binder.plan(sp.key);
      if (port === undefined) continue;
      planned.set(sp.key, port);
      // Its NodePort is not held yet: no NodePort rules until it is (see portals()).
      plannedPortals.push(this.#portals.plannedPortal(sp, port, snapshot.endpoints.get(sp.key)));
    }
    const early = this.#portals.syncAll(plannedPortals, full, initial).then(
      () => undefined,
      (err: unknown) => err ?? new Error('portal sync failed'),
    );
    return { planned, early };
  }

  /**
   * Reads this host's addresses; true when they (or where the listeners bind) changed since the last
   * sync: every running service port's endpoints are then filtered again (#refilterLoops).
   */
  #refreshLocalAddresses(): boolean {
    const addresses = this.#readLocalAddresses();
    const key = addresses.join(' ');
    if (key !== this.#localAddressesKey) {
      this.#localAddressesKey = key;
      this.#localAddresses = new Set(addresses);
      this.ownTraffic.setLocalAddresses(this.#localAddresses);
    }
    return this.#loopGuard.setHost(this.#listenHost, this.#localAddresses);
  }

  /**
   * `key`'s listeners or settings may change in this sync: it is looked at when the sync notes what
   * changed. Its listeners' ports now are those last noted (kept until then).
   */
  #touch(key: ServicePortKey): void {
    this.#touched.add(key);
    if (!this.#portsBefore.has(key))
      this.#portsBefore.set(key, this.#services.get(key)?.proxyPortsByKey() ?? NO_LISTENER_PORTS);
  }

  /**
   * Notes the proxy ports that moved, tells the loop guard what each touched service port now adds to
   * the picture (its listeners' ports, NodePort and portals; nothing once stopped), and keeps the set of
   * those with ClientIP affinity.
   */
  #noteTouched(): void {
    for (const key of this.#touched) {
      const rt = this.#services.get(key);
      this.#notePorts(key, rt);
      const placed = rt?.placed ?? this.#placedBeforeStop.get(key);
      this.#placedBeforeStop.delete(key);
      if (rt === undefined) {
        if (placed !== undefined) this.#loopGuard.remove(placed);
        this.#withAffinity.delete(key);
        continue;
      }
      this.#loopGuard.place(rt.servicePort, placed);
      rt.placed = rt.servicePort;
      if (rt.servicePort.sessionAffinity === 'ClientIP') this.#withAffinity.set(key, rt);
      else this.#withAffinity.delete(key);
    }
  }

  /**
   * Notes which of `key`'s listeners' proxy ports changed since they were last noted (none once stopped),
   * and moves them in the loop guard's picture.
   */
  #notePorts(key: ServicePortKey, rt: ServicePortRuntime | undefined): void {
    const before = this.#portsBefore.get(key) ?? NO_LISTENER_PORTS;
    this.#portsBefore.delete(key);
    const now = rt?.proxyPortsByKey() ?? NO_LISTENER_PORTS;
    const { protocol } = parseServicePortKey(key);
    const portOf = (ports: readonly ListenerPort[], k: string) => ports.find(([p]) => p === k)?.[1];
    const moved = (k: string, from: number | undefined, to: number | undefined) => {
      this.#portChanges.set(k, to);
      this.#loopGuard.moveProxyPort(protocol, from, to);
    };
    for (const [k, port] of before) if (portOf(now, k) === undefined) moved(k, port, undefined);
    for (const [k, port] of now) {
      const was = portOf(before, k);
      if (was !== port) moved(k, was, port);
    }
  }

  /**
   * Filters again the endpoints of the service ports the loop guard's last changes may concern (those
   * listing an endpoint on a port or portal that came or went), or of every one after the host's
   * addresses changed.
   */
  async #refilterLoops(yielder: Yielder): Promise<void> {
    const concerns = this.#loopGuard.takeChanges();
    // No service port starts or stops meanwhile: only this sync does that.
    const keys = this.#refilterAll ? [...this.#services.keys()] : this.#listing(concerns);
    for (const key of keys) {
      const rt = this.#services.get(key);
      if (rt?.refilter()) this.#claims.endpointsChanged(key);
      if (yielder.due) await yielder.turn();
      if (this.#closed) return;
    }
    this.#refilterAll = false;
  }

  /** The running service ports that list an endpoint `concerns` holds true of (none without a test). */
  #listing(concerns: Concerns | undefined): ServicePortKey[] {
    const out: ServicePortKey[] = [];
    if (concerns === undefined) return out;
    for (const [key, rt] of this.#services) if (rt.listedEndpoints?.some(concerns)) out.push(key);
    return out;
  }

  /**
   * Holds the NodePorts of the touched service ports and retries those that could not be held; all of
   * them when the addresses they are held on changed. A claim that changed is touched for the rules.
   */
  async #ensureNodePorts(yielder: Yielder): Promise<void> {
    const hosts = this.#options.nodePortHosts?.() ?? [this.#listenHost];
    const hostsKey = hosts.join(' ');
    const keys =
      hostsKey === this.#claimHostsKey
        ? new Set([...this.#touched, ...this.#claims.failedKeys()])
        : [...this.#services.keys()];
    for (const key of keys) {
      const rt = this.#services.get(key);
      if (rt === undefined || rt.servicePort.nodePort === 0) continue;
      const sp = rt.servicePort;
      if (await this.#claims.ensure(sp, rt.externalContext, nodePortHostsFor(sp, hosts)))
        this.#portals.touch(key);
      if (yielder.due) await yielder.turn();
      if (this.#closed) return;
    }
    this.#claimHostsKey = hostsKey;
  }

  /** Endpoint changes go to the running service ports' balancers, in place. */
  #applyEndpoints(snapshot: Snapshot): void {
    for (const key of snapshot.changedEndpoints) {
      const rt = this.#services.get(key);
      if (rt !== undefined) this.#applyEndpointsTo(rt, snapshot.endpoints.get(key));
    }
  }

  /** A list that becomes empty or stops being empty changes the rules (REJECT / DROP instead of NAT). */
  #applyEndpointsTo(rt: ServicePortRuntime, eps: ServicePortEndpoints | undefined): void {
    const before = rt.listedEndpoints;
    const flipped = rt.setEndpoints(eps);
    this.#loopGuard.watch(before, rt.listedEndpoints);
    // NodePort claims share a context with one of the listeners: their UDP sessions follow it.
    this.#claims.endpointsChanged(rt.servicePort.key);
    if (flipped) this.#portals.invalidate(rt);
  }

  #programPortals(full: boolean, initial: boolean): Promise<void> {
    return this.#portals.program(
      full,
      initial,
      () => this.portals(),
      (key) => {
        const rt = this.#services.get(key);
        return rt === undefined ? undefined : this.#portalOf(rt);
      },
    );
  }

  #portalOf(rt: ServicePortRuntime): PortalSpec {
    return this.#portals.portalOf(rt, this.#claims.heldPort(rt.servicePort.key));
  }

  async #start(
    servicePort: ServicePort,
    endpoints: ServicePortEndpoints | undefined,
    planned?: number,
  ): Promise<boolean> {
    let rt: ServicePortRuntime;
    try {
      rt = await ServicePortRuntime.open(servicePort, endpoints, this.#runtimeDeps, planned);
    } catch (err) {
      this.#recordFailure(servicePort, err);
      return false;
    }
    if (this.#closed) {
      // Closed while this one was binding: it is not ours to keep.
      rt.destroy();
      rt.releasePorts();
      return false;
    }
    this.#portals.invalidate(rt);
    this.#services.set(servicePort.key, rt);
    this.#loopGuard.watch(undefined, rt.listedEndpoints);
    if (this.#failed.delete(servicePort.key))
      this.#log.info({ service: servicePort.key, proxyPort: rt.proxyPort }, 'Service port recovered');
    this.#log.info(rt.logFields(), 'Opened service port');
    return true;
  }

  #recordFailure(servicePort: ServicePort, err: unknown): void {
    const error = isProxyError(err)
      ? err
      : new ProxyError(
          'KUP_ERR_LISTEN',
          `cannot open a listener for ${servicePort.key}: ${(err as Error).message}`,
          { cause: err },
        );
    const known = this.#failed.get(servicePort.key);
    if (known?.message !== error.message) {
      this.#log.error({ service: servicePort.key, err: error }, 'Failed to open service port');
    }
    this.#failed.set(servicePort.key, error);
  }

  /**
   * Opens or closes the local list's listener after a traffic policy changed. A failure to open it
   * stops the whole service port (its external traffic must not be spread over the cluster instead),
   * which is retried at the next sync.
   */
  async #reconcileLocal(rt: ServicePortRuntime, endpoints: ServicePortEndpoints | undefined): Promise<void> {
    const sp = rt.servicePort;
    // NodePort claims serve with the external context, which changes with the local listener.
    await this.#claims.release(sp.key);
    this.#portals.invalidate(rt);
    if (rt.hasLocal) {
      await rt.closeLocal();
      return;
    }
    try {
      await rt.openLocal(endpoints);
      if (this.#closed) {
        rt.discardLocal();
        return;
      }
      this.#log.info({ service: sp.key, localProxyPort: rt.localProxyPort }, 'Opened local service port');
    } catch (err) {
      await this.#stop(rt);
      this.#recordFailure(sp, err);
    }
  }

  /**
   * Opens or closes the listeners of external destinations after the PROXY protocol, the Service's
   * IPs, its NodePort or a traffic policy changed. A failure stops the whole service port (its
   * headers would name the wrong destination), which is retried at the next sync.
   */
  async #reconcilePortals(rt: ServicePortRuntime): Promise<void> {
    const sp = rt.servicePort;
    try {
      if (!(await rt.reconcilePortals())) return;
    } catch (err) {
      await this.#stop(rt);
      this.#recordFailure(sp, err);
      return;
    }
    this.#portals.invalidate(rt);
    if (this.#closed) return;
    this.#log.info(
      { service: sp.key, portalProxyPorts: Object.fromEntries(rt.portalProxyPorts()) },
      'Service port listeners of external destinations changed',
    );
  }

  #update(
    rt: ServicePortRuntime,
    servicePort: ServicePort,
    endpoints: ServicePortEndpoints | undefined,
  ): void {
    const before = rt.servicePort;
    const key = servicePort.key;
    const listed = rt.listedEndpoints;
    rt.update(servicePort, endpoints);
    this.#loopGuard.watch(listed, rt.listedEndpoints);
    this.#claims.endpointsChanged(key);
    this.#portals.invalidate(rt);
    // A claim serves with the external context, which follows externalTrafficPolicy: re-claimed later.
    if (
      (before.nodePort !== servicePort.nodePort ||
        before.externalPolicyLocal !== servicePort.externalPolicyLocal) &&
      this.#claims.heldPort(key) !== undefined
    )
      void this.#claims.release(key);
    if (!samePortals(before, servicePort)) this.#log.info({ service: key }, 'Service port changed');
  }

  async #stop(rt: ServicePortRuntime): Promise<void> {
    const key = rt.servicePort.key;
    this.#services.delete(key);
    this.#loopGuard.watch(rt.listedEndpoints, undefined);
    if (rt.placed !== undefined) this.#placedBeforeStop.set(key, rt.placed);
    this.#portals.invalidate(rt);
    await rt.close();
    await this.#claims.release(key);
    this.#log.info({ service: key, proxyPort: rt.proxyPort }, 'Closed service port');
  }

  /** Stops accepting everywhere; established TCP connections may finish (see destroy()). */
  async close(): Promise<void> {
    this.#closed = true;
    this.#sweeper.delete(this.fdPressure);
    const all = [...this.#services.values()];
    this.#services.clear();
    for (const rt of all) this.#draining.add(rt);
    await Promise.all([this.#claims.close(), ...all.map((rt) => rt.close())]);
  }

  /**
   * After close(): resolves once no connection is left on the closed listeners (the signal a shutdown
   * waits for, bounded by its grace period).
   */
  async drained(): Promise<void> {
    await Promise.all([this.#claims.drained(), ...[...this.#draining].map((rt) => rt.drained())]);
  }

  /** Stops accepting and tears down every connection now. */
  destroy(): void {
    this.#closed = true;
    this.#sweeper.delete(this.fdPressure);
    for (const rt of this.#services.values()) {
      this.#draining.add(rt);
      rt.releasePorts();
    }
    this.#services.clear();
    for (const rt of this.#draining) rt.destroy();
    this.#claims.destroy();
    this.#draining.clear();
  }

  /** Where listeners bind; only before the first sync (e.g. `0.0.0.0` when IPv6 is unavailable). */
  /** Where the listeners bind. */
  get listenHost(): string {
    return this.#listenHost;
  }

  setListenHost(host: string): void {
    this.#listenHost = host;
  }

  /** Active TCP connections and UDP sessions across all service ports. */
  activeConnections(): number {
    let n = 0;
    for (const rt of this.#services.values()) n += rt.context.stats.active;
    for (const rt of this.#draining) n += rt.context.stats.active;
    return n;
  }

  /** The last snapshot applied, if any (its change sets empty once releaseChanges() was called). */
  get snapshot(): Snapshot | undefined {
    return this.#snapshot;
  }

  /**
   * Forgets what the last snapshot changed, once everybody told of it has read it (the sync loop, after
   * its callbacks): the cold start's sets named every service port (~55 bytes a port) and stayed until
   * the next change. Its service ports and endpoints stay (a worker that starts is sent them).
   */
  releaseChanges(): void {
    const snapshot = this.#snapshot;
    if (snapshot === undefined) return;
    if (snapshot.changedServicePorts.size === 0 && snapshot.changedEndpoints.size === 0) return;
    this.#snapshot = { ...snapshot, ...NO_CHANGES };
  }
}

/**
 * The sweepers of the listeners: the process's one timer with the real clock; with an injected clock
 * (tests), one of their own that the clock drives.
 */
function sweepersFor(clock: Clock): { sweeper?: Sweeper; keepAlive?: KeepAliveSweeper } {
  if (clock === realClock) return {};
  const sweeper = new Sweeper(undefined, clock);
  return { sweeper, keepAlive: new KeepAliveSweeper(undefined, sweeper) };
}
