// The proxier: makes the running listeners match the desired snapshot. Opens and closes listeners on
// ports from the allocator, hands endpoints and affinity to each service port's balancer (in place: an
// endpoint or affinity change never restarts a listener), and asks the portal programmer (iptables) to
// write the rules. Syncs run through the bounded-frequency runner; a failed open is retried next sync.
import { isProxyError, ProxyError } from '../errors.ts';
import type { OutlierOptions } from '../loadbalancer/outlier.ts';
import { RoundRobinBalancer } from '../loadbalancer/round-robin.ts';
import type { Logger } from '../log.ts';
import { FdPressure } from '../relay/fd-pressure.ts';
import type { ConnectionObserver } from '../relay/observer.ts';
import { noopObserver } from '../relay/observer.ts';
import type { ServicePortContext } from '../relay/service-context.ts';
import { newServicePortStats } from '../relay/service-context.ts';
import type { Connector, TcpRelayOptions } from '../relay/tcp.ts';
import { TcpListener } from '../relay/tcp.ts';
import type { UdpRelayOptions } from '../relay/udp.ts';
import { UdpListener, UdpSessionBudget } from '../relay/udp.ts';
import type { Endpoint, ServicePortEndpoints } from '../state/endpoint.ts';
import type { TimeSlices } from '../state/proxy-state.ts';
import type { ServicePort, ServicePortKey } from '../state/service-port.ts';
import { samePortals } from '../state/service-port.ts';
import type { Snapshot } from '../state/snapshot.ts';
import { Yielder } from '../yielder.ts';
import type { Clock } from './clock.ts';
import { realClock } from './clock.ts';
import type { PortAllocator } from './port-allocator.ts';

/** A service port and the proxy port its traffic should be sent to. */
export type PortalSpec = { readonly servicePort: ServicePort; readonly proxyPort: number };

/** Writes the rules that send service traffic to proxy ports (iptables), or nothing (--no-iptables). */
export interface PortalProgrammer {
  /** `full`: rewrite everything (start, periodic repair, after a failure); else only what changed. */
  sync(
    portals: readonly PortalSpec[],
    options: { full: boolean; removedUDP: readonly ServicePort[] },
  ): Promise<void>;
  /**
   * Only the portals of `changed` service ports (undefined: it has none any more) differ from the last
   * sync or update: apply them without looking at the others (`all()` is for a state it does not
   * know). Optional; without it the proxier calls sync().
   */
  update?(
    changed: ReadonlyMap<ServicePortKey, PortalSpec | undefined>,
    all: () => readonly PortalSpec[],
    options: { removedUDP: readonly ServicePort[] },
  ): Promise<void>;
}

export const noPortals: PortalProgrammer = { sync: async () => {} };

/** From this many new service ports in one sync, their rules are written while they bind. */
export const OVERLAP_MIN_SERVICE_PORTS = 64;

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
};

export type ProxierDeps = {
  source: SnapshotSource;
  allocator: PortAllocator;
  portals?: PortalProgrammer;
  log: Logger;
  clock?: Clock;
  connect?: Connector;
  /** The observer for a service port (tracing); noop by default. */
  observerFor?: (servicePort: ServicePort) => ConnectionObserver;
  /** Proxy ports to reuse when free (`ns/name:port/PROTO` → port), e.g. read back from a previous
   * process's rules, so those rules stay valid across a restart. */
  preferredPorts?: ReadonlyMap<string, number>;
  /**
   * Called after a sync that opened or closed a listener, with every running service port's proxy port
   * (`ns/name:port/PROTO` → port), e.g. to keep them in a state file. Not called when nothing moved.
   */
  onProxyPortsChanged?: (ports: ReadonlyMap<string, number>) => void;
};

/** What runs for one service port. */
type ServiceInfo = {
  servicePort: ServicePort;
  context: ServicePortContext;
  listener: TcpListener | UdpListener;
  proxyPort: number;
  /**
   * The NodePort held open (and served) so no other process can take a port our rules hijack;
   * `hosts` = the addresses held, space-separated (when they change, it is claimed again).
   */
  nodePortClaim: { port: number; hosts: string; listeners: (TcpListener | UdpListener)[] } | undefined;
  /** Why the NodePort could not be claimed; its rules are left out until it can. */
  nodePortError: ProxyError | undefined;
  /**
   * The last PortalSpec handed out, reused while nothing it depends on changed: the same object lets
   * the rules' delta skip an unchanged service port with one identity check (10,000 per sync).
   */
  portal: PortalSpec | undefined;
};

export type ServicePortStatus = {
  servicePort: ServicePort;
  proxyPort: number;
  endpoints: readonly Endpoint[];
  context: ServicePortContext;
};

export type SyncResult = {
  full: boolean;
  durationMs: number;
  opened: number;
  closed: number;
  failed: number;
};

export class Proxier {
  #options: ProxierOptions;
  readonly #source: SnapshotSource;
  readonly #allocator: PortAllocator;
  readonly #portals: PortalProgrammer;
  readonly #log: Logger;
  readonly #clock: Clock;
  readonly #connect: Connector | undefined;
  readonly #observerFor: (sp: ServicePort) => ConnectionObserver;
  readonly #preferredPorts: ReadonlyMap<string, number>;
  readonly #onProxyPortsChanged: ((ports: ReadonlyMap<string, number>) => void) | undefined;
  readonly #services = new Map<ServicePortKey, ServiceInfo>();
  /** Service ports that should run but could not be opened; retried every sync. */
  readonly #failed = new Map<ServicePortKey, ProxyError>();
  /** Closed listeners whose connections may still run (shutdown). */
  readonly #draining = new Set<ServiceInfo>();
  #snapshot: Snapshot | undefined;
  #lastFullSyncMs = Number.NEGATIVE_INFINITY;
  #needFullSync = true;
  #closed = false;
  #syncing = false;
  #portsChanged = false;
  /** Service ports whose portal may differ from what was last programmed (the next delta's keys). */
  readonly #portalChanges = new Set<ServicePortKey>();
  /** Descriptor exhaustion, shared by every listener (metrics read its counts). */
  readonly fdPressure: FdPressure;
  /** The cap on UDP sessions across service ports; undefined = none. */
  readonly udpBudget: UdpSessionBudget | undefined;
  /** Timestamps for health and metrics (epoch ms; 0 = never). */
  lastSyncMs = 0;
  lastSyncResult: SyncResult | undefined;

  constructor(options: ProxierOptions, deps: ProxierDeps) {
    this.#options = options;
    this.#source = deps.source;
    this.#allocator = deps.allocator;
    this.#portals = deps.portals ?? noPortals;
    this.#log = deps.log;
    this.#clock = deps.clock ?? realClock;
    this.#connect = deps.connect;
    this.#observerFor = deps.observerFor ?? (() => noopObserver);
    this.#preferredPorts = deps.preferredPorts ?? new Map();
    this.#onProxyPortsChanged = deps.onProxyPortsChanged;
    this.fdPressure = new FdPressure(deps.log);
    const total = options.udpMaxTotalSessions ?? 0;
    this.udpBudget = total > 0 ? new UdpSessionBudget(total) : undefined;
  }

  /** Every running service port's proxy port, keyed `ns/name:port/PROTO` (the preferredPorts format). */
  proxyPorts(): Map<string, number> {
    const out = new Map<string, number>();
    for (const [key, info] of this.#services) out.set(key, info.proxyPort);
    return out;
  }

  /** Service ports that are running, with their proxy ports and current endpoints. */
  status(): ServicePortStatus[] {
    const out: ServicePortStatus[] = [];
    for (const info of this.#services.values()) {
      out.push({
        servicePort: info.servicePort,
        proxyPort: info.proxyPort,
        endpoints: info.context.balancer.endpoints,
        context: info.context,
      });
    }
    return out;
  }

  /** Service ports that should run but have no listener, with why. */
  failures(): ReadonlyMap<ServicePortKey, ProxyError> {
    return this.#failed;
  }

  get(key: ServicePortKey): ServicePortStatus | undefined {
    const info = this.#services.get(key);
    if (info === undefined) return undefined;
    return {
      servicePort: info.servicePort,
      proxyPort: info.proxyPort,
      endpoints: info.context.balancer.endpoints,
      context: info.context,
    };
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
    const removedUDP: ServicePort[] = [];

    // Removed service ports: close their listeners (established TCP connections keep running).
    for (const key of snapshot.changedServicePorts) {
      if (snapshot.servicePorts.has(key)) continue;
      this.#failed.delete(key);
      const info = this.#services.get(key);
      if (info === undefined) continue;
      await this.#stop(info);
      if (info.servicePort.protocol === 'UDP') removedUDP.push(info.servicePort);
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
      const info = this.#services.get(key);
      if (info !== undefined) this.#update(info, servicePort);
      else toStart.push(servicePort);
    }
    // Many new service ports (a cold start): their ports are allocated first and the rules written
    // while the listeners bind (a restore of 10,000 service ports takes ~0.8 s of kernel time, binding
    // them ~0.5 s). A listener that ends up on another port is put right by a delta below.
    const planned = new Map<ServicePortKey, number>();
    let early: Promise<unknown> | undefined;
    if (toStart.length >= OVERLAP_MIN_SERVICE_PORTS && this.#portals !== noPortals) {
      const plannedPortals = this.portals();
      for (const sp of toStart) {
        const port = this.#planPort(sp);
        if (port === undefined) continue;
        planned.set(sp.key, port);
        // Its NodePort is not held yet: no NodePort rules until it is (see portals()).
        const unclaimed = this.#options.claimNodePorts === true && sp.nodePort !== 0;
        plannedPortals.push({ servicePort: unclaimed ? { ...sp, nodePort: 0 } : sp, proxyPort: port });
      }
      early = this.#portals.sync(plannedPortals, { full, removedUDP }).then(
        () => undefined,
        (err: unknown) => err ?? new Error('portal sync failed'),
      );
    }
    for (const [i, servicePort] of toStart.entries()) {
      if (
        await this.#start(servicePort, snapshot.endpoints.get(servicePort.key), planned.get(servicePort.key))
      )
        opened++;
      if (yielder.due) await yielder.turn();
      if (this.#closed) {
        for (const sp of toStart.slice(i + 1)) {
          const port = planned.get(sp.key);
          if (port !== undefined) this.#allocator.release(port);
        }
        await early;
        return undefined;
      }
    }

    this.#applyEndpoints(snapshot);

    const now = this.#clock.now();
    const claimHosts = this.#options.nodePortHosts?.() ?? [this.#options.listenHost];
    const claimKey = claimHosts.join(' ');
    // The rules depend on service ports, their proxy ports and NodePort claims only (#portalChanges): a
    // sync that changed none of them (an affinity change) does not touch iptables.
    for (const info of this.#services.values()) {
      info.context.balancer.cleanupStaleStickySessions(now);
      if (this.#options.claimNodePorts && info.servicePort.nodePort !== 0) {
        const before = info.nodePortClaim;
        // The node's addresses changed: hold the NodePort where the rules now match.
        if (info.nodePortClaim !== undefined && info.nodePortClaim.hosts !== claimKey)
          await this.#releaseNodePort(info);
        if (info.nodePortClaim === undefined) await this.#claimNodePort(info, claimHosts);
        if (info.nodePortClaim !== before) this.#portalChanges.add(info.servicePort.key);
      }
      if (yielder.due) await yielder.turn();
      if (this.#closed) return undefined;
    }

    if (early !== undefined) {
      const err = await early;
      if (err !== undefined) throw err;
      // What changed since the early restore (a listener on another port, a failure, NodePort claims):
      // a delta, usually empty.
      await this.#programPortals(false, []);
    } else if (full || this.#portalChanges.size > 0 || removedUDP.length > 0) {
      await this.#programPortals(full, removedUDP);
    }
    if (full) this.#lastFullSyncMs = started;
    this.#needFullSync = false;
    // After the rules: what a restart reads back should be what the rules in place point at.
    if (this.#portsChanged) {
      this.#portsChanged = false;
      this.#onProxyPortsChanged?.(this.proxyPorts());
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

  /** Endpoint changes go to the running service ports' balancers, in place. */
  #applyEndpoints(snapshot: Snapshot): void {
    for (const key of snapshot.changedEndpoints) {
      const info = this.#services.get(key);
      if (info !== undefined)
        info.context.balancer.setEndpoints(clusterEndpoints(snapshot.endpoints.get(key)));
    }
  }

  /**
   * Programs the rules: everything when `full`, else only the service ports in #portalChanges (a
   * delta that does not look at the 10,000 others). On failure the runner asks for a full sync.
   */
  async #programPortals(full: boolean, removedUDP: readonly ServicePort[]): Promise<void> {
    const update = this.#portals.update?.bind(this.#portals);
    if (full || update === undefined) {
      await this.#portals.sync(this.portals(), { full, removedUDP });
    } else {
      const changed = new Map<ServicePortKey, PortalSpec | undefined>();
      for (const key of this.#portalChanges) {
        const info = this.#services.get(key);
        changed.set(key, info === undefined ? undefined : this.#portalOf(info));
      }
      await update(changed, () => this.portals(), { removedUDP });
    }
    this.#portalChanges.clear();
  }

  /** The running service ports and their proxy ports, for the portal programmer. */
  portals(): PortalSpec[] {
    const out: PortalSpec[] = [];
    for (const info of this.#services.values()) out.push(this.#portalOf(info));
    return out;
  }

  /** One running service port's portal, the same object while nothing it depends on changed. */
  #portalOf(info: ServiceInfo): PortalSpec {
    const sp = info.servicePort;
    // A NodePort someone else holds gets no rules: we must not hijack their traffic.
    const unclaimed =
      this.#options.claimNodePorts === true && sp.nodePort !== 0 && info.nodePortClaim?.port !== sp.nodePort;
    const cached = info.portal;
    // #update drops the cache when the service port changes; what is left is the NodePort claim.
    if (
      cached !== undefined &&
      cached.proxyPort === info.proxyPort &&
      unclaimed !== (cached.servicePort === sp)
    )
      return cached;
    const portal = { servicePort: unclaimed ? { ...sp, nodePort: 0 } : sp, proxyPort: info.proxyPort };
    info.portal = portal;
    return portal;
  }

  /** NodePort claims that failed, by service port (for /debug/services). */
  nodePortErrors(): Map<ServicePortKey, ProxyError> {
    const out = new Map<ServicePortKey, ProxyError>();
    for (const [key, info] of this.#services)
      if (info.nodePortError !== undefined) out.set(key, info.nodePortError);
    return out;
  }

  async #claimNodePort(info: ServiceInfo, hosts: readonly string[]): Promise<void> {
    const port = info.servicePort.nodePort;
    const listeners: (TcpListener | UdpListener)[] = [];
    try {
      for (const host of hosts) {
        const listener = this.#createListener(info.context, host);
        listeners.push(listener);
        await listener.listen(host, port);
      }
      info.nodePortClaim = { port, hosts: hosts.join(' '), listeners };
      if (info.nodePortError !== undefined)
        this.#log.info({ service: info.servicePort.key, nodePort: port }, 'NodePort claimed');
      info.nodePortError = undefined;
    } catch (err) {
      // Held on some addresses only is not held: rules for the others would hijack someone's traffic.
      for (const l of listeners) l.destroy();
      const error = new ProxyError(
        'KUP_ERR_PORT_CONFLICT',
        `NodePort ${port}/${info.servicePort.protocol} of ${info.servicePort.name} is held by another process: ${(err as Error).message}`,
        { cause: err },
      );
      if (info.nodePortError?.message !== error.message) {
        this.#log.error(
          {
            service: info.servicePort.key,
            nodePort: port,
            err: { code: error.code, message: error.message },
          },
          'Port conflict detected',
        );
      }
      info.nodePortError = error;
    }
  }

  async #releaseNodePort(info: ServiceInfo): Promise<void> {
    const claim = info.nodePortClaim;
    info.nodePortClaim = undefined;
    info.nodePortError = undefined;
    if (claim !== undefined) await Promise.all(claim.listeners.map((l) => l.close()));
  }

  /**
   * Allocates the proxy port a new service port will most likely get: its preferred port while free,
   * else the allocator's next. Undefined when the kernel chooses ports or the range is exhausted.
   */
  #planPort(servicePort: ServicePort): number | undefined {
    if (this.#allocator.isKernelChosen) return undefined;
    const preferred = this.#preferredPorts.get(`${servicePort.name}/${servicePort.protocol}`);
    if (preferred !== undefined && this.#allocator.allocate(preferred)) return preferred;
    try {
      return this.#allocator.allocateNext(new Set());
    } catch {
      return undefined;
    }
  }

  async #start(
    servicePort: ServicePort,
    endpoints: ServicePortEndpoints | undefined,
    planned?: number,
  ): Promise<boolean> {
    const balancer = new RoundRobinBalancer(Math.random, this.#options.outlier);
    balancer.setAffinity(servicePort.sessionAffinity, servicePort.stickyMaxAgeSeconds);
    balancer.setEndpoints(clusterEndpoints(endpoints));
    const context: ServicePortContext = {
      name: servicePort.name,
      protocol: servicePort.protocol,
      balancer,
      stats: newServicePortStats(),
      observer: this.#observerFor(servicePort),
    };
    try {
      const { listener, port } = await this.#listen(context, planned);
      if (this.#closed) {
        // Closed while this one was binding: it is not ours to keep.
        listener.destroy();
        this.#allocator.release(port);
        return false;
      }
      this.#portalChanges.add(servicePort.key);
      this.#services.set(servicePort.key, {
        servicePort,
        context,
        listener,
        proxyPort: port,
        nodePortClaim: undefined,
        nodePortError: undefined,
        portal: undefined,
      });
      this.#portsChanged = true;
      if (this.#failed.delete(servicePort.key))
        this.#log.info({ service: servicePort.key, proxyPort: port }, 'Service port recovered');
      this.#log.info(
        { service: servicePort.key, proxyPort: port, endpoints: balancer.endpoints.length },
        'Opened service port',
      );
      return true;
    } catch (err) {
      const error = isProxyError(err)
        ? err
        : new ProxyError(
            'KUP_ERR_LISTEN',
            `cannot open a listener for ${servicePort.key}: ${(err as Error).message}`,
            { cause: err },
          );
      const known = this.#failed.get(servicePort.key);
      if (known?.message !== error.message) {
        this.#log.error(
          { service: servicePort.key, err: { code: error.code, message: error.message } },
          'Failed to open service port',
        );
      }
      this.#failed.set(servicePort.key, error);
      return false;
    }
  }

  /** A new listener bound on `port`; on failure the port goes back to the allocator and the error is thrown. */
  async #bind(context: ServicePortContext, port: number): Promise<TcpListener | UdpListener> {
    const listener = this.#createListener(context);
    try {
      await listener.listen(this.#options.listenHost, port);
      return listener;
    } catch (err) {
      this.#allocator.release(port);
      listener.destroy();
      throw err;
    }
  }

  /**
   * Binds a proxy port: `planned` (already allocated) when given, else the preferred port, else one
   * from the allocator; a port someone else holds is skipped and another tried.
   */
  async #listen(
    context: ServicePortContext,
    planned?: number,
  ): Promise<{ listener: TcpListener | UdpListener; port: number }> {
    const attempts = this.#allocator.isKernelChosen ? 1 : (this.#options.bindAttempts ?? 16);
    const busy = new Set<number>();
    let lastError: unknown;
    // The port a previous process used for this service port, while it is free: its rules stay valid.
    const preferred = planned ?? this.#preferredPorts.get(`${context.name}/${context.protocol}`);
    if (
      preferred !== undefined &&
      (planned !== undefined || this.#allocator.isKernelChosen || this.#allocator.allocate(preferred))
    ) {
      try {
        const listener = await this.#bind(context, preferred);
        return { listener, port: listener.port };
      } catch (err) {
        busy.add(preferred);
        lastError = err;
      }
    }
    for (let i = 0; i < attempts; i++) {
      let port: number;
      try {
        port = this.#allocator.allocateNext(busy);
      } catch (err) {
        if (busy.size === 0) throw err;
        break; // every free port of the range is held by someone else
      }
      try {
        const listener = await this.#bind(context, port);
        return { listener, port: listener.port };
      } catch (err) {
        lastError = err;
        const code = (err as NodeJS.ErrnoException).code;
        if (code !== 'EADDRINUSE' || port === 0) break;
        busy.add(port);
        // Once per failure, not on every retry: the failure itself is logged once (#start).
        if (!this.#failed.has(`${context.name}/${context.protocol}` as ServicePortKey))
          this.#log.warn(
            { service: context.name, port },
            'Proxy port in use by another process, trying another',
          );
      }
    }
    const held = busy.size > 0 ? ` (ports held by other processes: ${[...busy].join(', ')})` : '';
    throw new ProxyError(
      'KUP_ERR_LISTEN',
      `cannot listen for ${context.name}/${context.protocol}: ${(lastError as Error).message}${held}`,
      {
        cause: lastError,
      },
    );
  }

  #createListener(context: ServicePortContext, host = this.#options.listenHost): TcpListener | UdpListener {
    const deps = {
      log: this.#log,
      connect: this.#connect,
      now: () => this.#clock.now(),
      fdPressure: this.fdPressure,
      budget: this.udpBudget,
    };
    if (context.protocol === 'TCP') return new TcpListener(context, this.#options.tcp, deps);
    return new UdpListener(context, this.#options.udp, deps, host.includes(':') ? 'udp6' : 'udp4');
  }

  #update(info: ServiceInfo, servicePort: ServicePort): void {
    const before = info.servicePort;
    info.servicePort = servicePort;
    info.portal = undefined;
    this.#portalChanges.add(servicePort.key);
    info.context.balancer.setAffinity(servicePort.sessionAffinity, servicePort.stickyMaxAgeSeconds);
    if (before.trace !== servicePort.trace) info.context.observer = this.#observerFor(servicePort);
    if (before.nodePort !== servicePort.nodePort && info.nodePortClaim !== undefined)
      void this.#releaseNodePort(info);
    if (!samePortals(before, servicePort))
      this.#log.info({ service: servicePort.key }, 'Service port changed');
  }

  async #stop(info: ServiceInfo): Promise<void> {
    this.#services.delete(info.servicePort.key);
    this.#portalChanges.add(info.servicePort.key);
    this.#portsChanged = true;
    await info.listener.close();
    await this.#releaseNodePort(info);
    this.#allocator.release(info.proxyPort);
    this.#log.info({ service: info.servicePort.key, proxyPort: info.proxyPort }, 'Closed service port');
  }

  /** Stops accepting everywhere; established TCP connections may finish (see destroy()). */
  async close(): Promise<void> {
    this.#closed = true;
    const all = [...this.#services.values()];
    this.#services.clear();
    for (const info of all) this.#draining.add(info);
    await Promise.all(
      all.map(async (info) => {
        await info.listener.close();
        await Promise.all(info.nodePortClaim?.listeners.map((l) => l.close()) ?? []);
        this.#allocator.release(info.proxyPort);
      }),
    );
  }

  /** Stops accepting and tears down every connection now. */
  destroy(): void {
    this.#closed = true;
    for (const info of this.#services.values()) {
      this.#draining.add(info);
      this.#allocator.release(info.proxyPort);
    }
    this.#services.clear();
    for (const info of this.#draining) {
      info.listener.destroy();
      for (const l of info.nodePortClaim?.listeners ?? []) l.destroy();
    }
    this.#draining.clear();
  }

  /** Where listeners bind; only before the first sync (e.g. `0.0.0.0` when IPv6 is unavailable). */
  setListenHost(host: string): void {
    this.#options = { ...this.#options, listenHost: host };
  }

  /** Active TCP connections and UDP sessions across all service ports. */
  activeConnections(): number {
    let n = 0;
    for (const info of this.#services.values()) n += info.context.stats.active;
    for (const info of this.#draining) n += info.context.stats.active;
    return n;
  }

  /** The last snapshot applied, if any. */
  get snapshot(): Snapshot | undefined {
    return this.#snapshot;
  }
}

function clusterEndpoints(endpoints: ServicePortEndpoints | undefined): readonly Endpoint[] {
  return endpoints?.cluster ?? [];
}
