// The proxier: makes the running listeners match the desired snapshot. Opens and closes listeners on
// ports from the allocator, hands endpoints and affinity to each service port's balancer (in place: an
// endpoint or affinity change never restarts a listener), and asks the portal programmer (iptables) to
// write the rules. Syncs run through the bounded-frequency runner; a failed open is retried next sync.
import { isProxyError, ProxyError } from '../lib/errors.ts';
import type { Logger } from '../lib/log.ts';
import { Yielder } from '../lib/yielder.ts';
import type { OutlierOptions } from '../loadbalancer/outlier.ts';
import { FdPressure } from '../relay/fd-pressure.ts';
import type { ConnectionObserver } from '../relay/observer.ts';
import { noopObserver } from '../relay/observer.ts';
import type { ServicePortContext, ServicePortStats } from '../relay/service-context.ts';
import { newServicePortStats } from '../relay/service-context.ts';
import type { Connector, TcpRelayOptions } from '../relay/tcp.ts';
import { TcpListener } from '../relay/tcp.ts';
import type { UdpRelayOptions } from '../relay/udp.ts';
import { UdpListener, UdpSessionBudget } from '../relay/udp.ts';
import type { Endpoint, ServicePortEndpoints } from '../state/endpoint.ts';
import type { TimeSlices } from '../state/proxy-state.ts';
import {
  type ServicePort,
  type ServicePortKey,
  samePortals,
  servicePortKey,
  usesClusterEndpoints,
  usesLocalEndpoints,
} from '../state/service-port.ts';
import type { Snapshot } from '../state/snapshot.ts';
import type { Clock } from './clock.ts';
import { realClock } from './clock.ts';
import {
  cleanupFamilyAffinity,
  familyEndpoints,
  isDualStack,
  newFamilyBalancers,
  primaryFamily,
  setFamilyAffinity,
  setFamilyEndpoints,
} from './family-balancers.ts';
import type { PortAllocator } from './port-allocator.ts';
import { type FamilyPortalEndpoints, portalEndpoints } from './portal-endpoints.ts';
import { noPortals, type PortalProgrammer, type PortalSpec } from './portal-programmer.ts';

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

/** The state-file key of a service port's local-list listener: its own key plus `/local`. */
export function localProxyPortKey(key: string): string {
  return `${key}/local`;
}

/**
 * True when a service port needs a second listener for its node-local endpoint list: it uses both the
 * cluster-wide and the local list (a Local traffic policy beside a Cluster one, or beside the
 * short-circuit of externalTrafficPolicy Local).
 */
export function needsLocalListener(sp: ServicePort): boolean {
  return usesClusterEndpoints(sp) && usesLocalEndpoints(sp);
}

/** A listener and what it serves: the second one of a service port that uses both endpoint lists. */
type PolicyListener = {
  context: ServicePortContext;
  listener: TcpListener | UdpListener;
  proxyPort: number;
};

/** What runs for one service port. */
type ServiceInfo = {
  servicePort: ServicePort;
  /** The listener of the cluster-wide list (the local list when that is the only one used). */
  context: ServicePortContext;
  listener: TcpListener | UdpListener;
  proxyPort: number;
  /** The local list's listener when the service port uses both lists (needsLocalListener). */
  local: PolicyListener | undefined;
  /** What the rules know of the endpoints (REJECT / DROP when a list is empty). */
  endpoints: FamilyPortalEndpoints;
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
  /** The local list's listener, when the service port has a second one; 0 and [] otherwise. */
  localProxyPort: number;
  localEndpoints: readonly Endpoint[];
  /** What the rules know of the endpoints, per family (REJECT / DROP when a list is empty). */
  portalEndpoints: FamilyPortalEndpoints;
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
    for (const [key, info] of this.#services) {
      out.set(key, info.proxyPort);
      if (info.local !== undefined) out.set(localProxyPortKey(key), info.local.proxyPort);
    }
    return out;
  }

  /** True when endpoint changes applied without a sync (0 <-> N) changed what the rules must say. */
  get portalsPending(): boolean {
    return this.#portalChanges.size > 0;
  }

  /** Service ports that are running, with their proxy ports and current endpoints. */
  status(): ServicePortStatus[] {
    const out: ServicePortStatus[] = [];
    for (const info of this.#services.values()) out.push(statusOf(info));
    return out;
  }

  /** Service ports that should run but have no listener, with why. */
  failures(): ReadonlyMap<ServicePortKey, ProxyError> {
    return this.#failed;
  }

  get(key: ServicePortKey): ServicePortStatus | undefined {
    const info = this.#services.get(key);
    return info === undefined ? undefined : statusOf(info);
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
    const initial = this.lastSyncMs === 0;

    // Removed service ports: close their listeners (established TCP connections keep running).
    for (const key of snapshot.changedServicePorts) {
      if (snapshot.servicePorts.has(key)) continue;
      this.#failed.delete(key);
      const info = this.#services.get(key);
      if (info === undefined) continue;
      await this.#stop(info);
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
      if (info === undefined) toStart.push(servicePort);
      else if (isDualStack(info.servicePort) !== isDualStack(servicePort)) {
        // Its balancers are per family: a service port that gains or loses a family starts anew.
        await this.#stop(info);
        toStart.push(servicePort);
      } else {
        this.#update(info, servicePort, snapshot.endpoints.get(key));
        if (needsLocalListener(servicePort) !== (info.local !== undefined))
          await this.#reconcileLocal(info, snapshot.endpoints.get(key));
      }
      if (this.#closed) return undefined;
    }
    // Many new service ports (a cold start): their ports are allocated first and the rules written
    // while the listeners bind (a restore of 10,000 service ports takes ~0.8 s of kernel time, binding
    // them ~0.5 s). A listener that ends up on another port is put right by a delta below.
    const planned = new Map<ServicePortKey, number>();
    let early: Promise<unknown> | undefined;
    if (toStart.length >= OVERLAP_MIN_SERVICE_PORTS && this.#portals !== noPortals) {
      const plannedPortals = this.portals();
      for (const sp of toStart) {
        // A second listener is not planned: such service ports get their rules from the delta below.
        if (needsLocalListener(sp)) continue;
        const port = this.#planPort(sp);
        if (port === undefined) continue;
        planned.set(sp.key, port);
        // Its NodePort is not held yet: no NodePort rules until it is (see portals()).
        const unclaimed = this.#options.claimNodePorts === true && sp.nodePort !== 0;
        plannedPortals.push({
          servicePort: unclaimed ? { ...sp, nodePort: 0 } : sp,
          proxyPort: port,
          localProxyPort: 0,
          endpoints: portalEndpoints(snapshot.endpoints.get(sp.key)),
        });
      }
      early = this.#portals.sync(plannedPortals, { full, initial }).then(
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
    // The rules depend on service ports, their proxy ports and NodePort claims only (#portalChanges): a
    // sync that changed none of them (an affinity change) does not touch iptables.
    for (const info of this.#services.values()) {
      cleanupFamilyAffinity(info.context.balancers, now);
      if (info.local !== undefined) cleanupFamilyAffinity(info.local.context.balancers, now);
      if (this.#options.claimNodePorts && info.servicePort.nodePort !== 0) {
        const before = info.nodePortClaim;
        const hosts = nodePortHostsFor(info.servicePort, claimHosts);
        // The node's addresses changed: hold the NodePort where the rules now match.
        if (info.nodePortClaim !== undefined && info.nodePortClaim.hosts !== hosts.join(' '))
          await this.#releaseNodePort(info);
        if (info.nodePortClaim === undefined) await this.#claimNodePort(info, hosts);
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
      await this.#programPortals(false, initial);
    } else if (full || this.#portalChanges.size > 0) {
      await this.#programPortals(full, initial);
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
      if (info !== undefined) this.#applyEndpointsTo(info, snapshot.endpoints.get(key));
    }
  }

  /**
   * Hands a service port's listeners their lists; UDP sessions to endpoints that left are closed. When
   * a list becomes empty or stops being empty, the rules must change (REJECT / DROP instead of NAT).
   */
  #applyEndpointsTo(info: ServiceInfo, eps: ServicePortEndpoints | undefined): void {
    if (setFamilyEndpoints(info.context.balancers, primaryList(info.servicePort, eps)))
      endpointsChanged(info.listener);
    if (info.local !== undefined && setFamilyEndpoints(info.local.context.balancers, eps?.local ?? []))
      endpointsChanged(info.local.listener);
    // NodePort claims share a context with one of the two: their UDP sessions follow it.
    for (const l of info.nodePortClaim?.listeners ?? []) endpointsChanged(l);
    const flags = portalEndpoints(eps, info.endpoints);
    if (flags !== info.endpoints) {
      info.endpoints = flags;
      info.portal = undefined;
      this.#portalChanges.add(info.servicePort.key);
    }
  }

  /**
   * Programs the rules: everything when `full`, else only the service ports in #portalChanges (a
   * delta that does not look at the 10,000 others). On failure the runner asks for a full sync.
   */
  async #programPortals(full: boolean, initial: boolean): Promise<void> {
    const update = this.#portals.update?.bind(this.#portals);
    if (full || update === undefined) {
      await this.#portals.sync(this.portals(), { full, initial });
    } else {
      const changed = new Map<ServicePortKey, PortalSpec | undefined>();
      for (const key of this.#portalChanges) {
        const info = this.#services.get(key);
        changed.set(key, info === undefined ? undefined : this.#portalOf(info));
      }
      await update(changed, () => this.portals(), { initial });
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
    const localProxyPort = info.local?.proxyPort ?? 0;
    // #update and endpoint flips drop the cache; what is left is the NodePort claim and the listeners.
    if (
      cached !== undefined &&
      cached.proxyPort === info.proxyPort &&
      cached.localProxyPort === localProxyPort &&
      unclaimed !== (cached.servicePort === sp)
    )
      return cached;
    const portal: PortalSpec = {
      servicePort: unclaimed ? { ...sp, nodePort: 0 } : sp,
      proxyPort: info.proxyPort,
      localProxyPort,
      endpoints: info.endpoints,
    };
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
    // NodePort traffic is external: under externalTrafficPolicy Local it is served from the local list.
    const context =
      info.servicePort.externalPolicyLocal && info.local !== undefined ? info.local.context : info.context;
    // An IPv6-only service port held on `::` must not answer IPv4 (no IPv4 rule, no IPv4 endpoint).
    const v6Only = !isDualStack(info.servicePort) && primaryFamily(info.servicePort) === 'IPv6';
    try {
      for (const host of hosts) {
        const ipv6Only = v6Only && host === '::';
        const listener = this.#createListener(context, host, ipv6Only);
        listeners.push(listener);
        await listener.listen(host, port, ipv6Only);
      }
      if (this.#closed) {
        // Closed while these were binding: nothing is left to serve them.
        for (const l of listeners) l.destroy();
        return;
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
    const preferred = this.#preferredPorts.get(servicePort.key);
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
    const stats = newServicePortStats();
    const observer = this.#observerFor(servicePort);
    const context = this.#newContext(servicePort, stats, observer);
    setFamilyEndpoints(context.balancers, primaryList(servicePort, endpoints));
    try {
      const { listener, port } = await this.#listen(context, servicePort.key, planned);
      let local: PolicyListener | undefined;
      if (needsLocalListener(servicePort)) {
        try {
          local = await this.#openLocal(servicePort, stats, observer, endpoints);
        } catch (err) {
          listener.destroy();
          this.#allocator.release(port);
          throw err;
        }
      }
      if (this.#closed) {
        // Closed while this one was binding: it is not ours to keep.
        listener.destroy();
        this.#allocator.release(port);
        if (local !== undefined) {
          local.listener.destroy();
          this.#allocator.release(local.proxyPort);
        }
        return false;
      }
      this.#portalChanges.add(servicePort.key);
      this.#services.set(servicePort.key, {
        servicePort,
        context,
        listener,
        proxyPort: port,
        local,
        endpoints: portalEndpoints(endpoints),
        nodePortClaim: undefined,
        nodePortError: undefined,
        portal: undefined,
      });
      this.#portsChanged = true;
      if (this.#failed.delete(servicePort.key))
        this.#log.info({ service: servicePort.key, proxyPort: port }, 'Service port recovered');
      this.#log.info(
        {
          service: servicePort.key,
          proxyPort: port,
          endpoints: familyEndpoints(context.balancers).length,
          ...(local === undefined
            ? {}
            : {
                localProxyPort: local.proxyPort,
                localEndpoints: familyEndpoints(local.context.balancers).length,
              }),
        },
        'Opened service port',
      );
      return true;
    } catch (err) {
      this.#recordFailure(servicePort, err);
      return false;
    }
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
      this.#log.error(
        { service: servicePort.key, err: { code: error.code, message: error.message } },
        'Failed to open service port',
      );
    }
    this.#failed.set(servicePort.key, error);
  }

  /** A context for one listener of `sp`: its own balancers, the service port's counters and observer. */
  #newContext(sp: ServicePort, stats: ServicePortStats, observer: ConnectionObserver): ServicePortContext {
    const balancers = newFamilyBalancers(sp, this.#options.outlier);
    return {
      name: sp.name,
      protocol: sp.protocol,
      balancer: balancers[primaryFamily(sp)],
      balancers,
      stats,
      observer,
    };
  }

  /** Opens the listener of the local list (the service port's counters and observer are shared). */
  async #openLocal(
    sp: ServicePort,
    stats: ServicePortStats,
    observer: ConnectionObserver,
    endpoints: ServicePortEndpoints | undefined,
  ): Promise<PolicyListener> {
    const context = this.#newContext(sp, stats, observer);
    setFamilyEndpoints(context.balancers, endpoints?.local ?? []);
    const { listener, port } = await this.#listen(context, localProxyPortKey(sp.key));
    return { context, listener, proxyPort: port };
  }

  /**
   * Opens or closes the local list's listener after a traffic policy changed. A failure to open it
   * stops the whole service port (its external traffic must not be spread over the cluster instead),
   * which is retried at the next sync.
   */
  async #reconcileLocal(info: ServiceInfo, endpoints: ServicePortEndpoints | undefined): Promise<void> {
    const sp = info.servicePort;
    // NodePort claims serve with the external context, which changes with the local listener.
    await this.#releaseNodePort(info);
    info.portal = undefined;
    this.#portalChanges.add(sp.key);
    this.#portsChanged = true;
    const before = info.local;
    if (before !== undefined) {
      info.local = undefined;
      await before.listener.close();
      this.#allocator.release(before.proxyPort);
      this.#log.info({ service: sp.key, localProxyPort: before.proxyPort }, 'Closed local service port');
      return;
    }
    try {
      const local = await this.#openLocal(sp, info.context.stats, info.context.observer, endpoints);
      if (this.#closed) {
        local.listener.destroy();
        this.#allocator.release(local.proxyPort);
        return;
      }
      info.local = local;
      this.#log.info({ service: sp.key, localProxyPort: info.local.proxyPort }, 'Opened local service port');
    } catch (err) {
      await this.#stop(info);
      this.#recordFailure(sp, err);
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
    preferredKey: string,
    planned?: number,
  ): Promise<{ listener: TcpListener | UdpListener; port: number }> {
    const attempts = this.#allocator.isKernelChosen ? 1 : (this.#options.bindAttempts ?? 16);
    const busy = new Set<number>();
    let lastError: unknown;
    // The port a previous process used for this service port, while it is free: its rules stay valid.
    const preferred = planned ?? this.#preferredPorts.get(preferredKey);
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
        if (!this.#failed.has(servicePortKey(context.name, context.protocol)))
          this.#log.warn(
            { service: preferredKey, port },
            'Proxy port in use by another process, trying another',
          );
      }
    }
    const held = busy.size > 0 ? ` (ports held by other processes: ${[...busy].join(', ')})` : '';
    throw new ProxyError(
      'KUP_ERR_LISTEN',
      `cannot listen for ${preferredKey}: ${(lastError as Error).message}${held}`,
      {
        cause: lastError,
      },
    );
  }

  #createListener(
    context: ServicePortContext,
    host = this.#options.listenHost,
    ipv6Only = false,
  ): TcpListener | UdpListener {
    const deps = {
      log: this.#log,
      connect: this.#connect,
      now: () => this.#clock.now(),
      fdPressure: this.fdPressure,
      budget: this.udpBudget,
    };
    if (context.protocol === 'TCP') return new TcpListener(context, this.#options.tcp, deps);
    return new UdpListener(context, this.#options.udp, deps, host.includes(':') ? 'udp6' : 'udp4', ipv6Only);
  }

  #update(info: ServiceInfo, servicePort: ServicePort, endpoints: ServicePortEndpoints | undefined): void {
    const before = info.servicePort;
    info.servicePort = servicePort;
    info.portal = undefined;
    this.#portalChanges.add(servicePort.key);
    setFamilyAffinity(info.context.balancers, servicePort);
    if (info.local !== undefined) setFamilyAffinity(info.local.context.balancers, servicePort);
    if (before.trace !== servicePort.trace) {
      info.context.observer = this.#observerFor(servicePort);
      if (info.local !== undefined) info.local.context.observer = info.context.observer;
    }
    // A policy change moves the primary listener between the lists.
    this.#applyEndpointsTo(info, endpoints);
    // A claim serves with the external context, which follows externalTrafficPolicy: re-claimed below.
    if (
      (before.nodePort !== servicePort.nodePort ||
        before.externalPolicyLocal !== servicePort.externalPolicyLocal) &&
      info.nodePortClaim !== undefined
    )
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
    if (info.local !== undefined) {
      await info.local.listener.close();
      this.#allocator.release(info.local.proxyPort);
    }
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
        await info.local?.listener.close();
        await Promise.all(info.nodePortClaim?.listeners.map((l) => l.close()) ?? []);
        this.#allocator.release(info.proxyPort);
        if (info.local !== undefined) this.#allocator.release(info.local.proxyPort);
      }),
    );
  }

  /** Stops accepting and tears down every connection now. */
  destroy(): void {
    this.#closed = true;
    for (const info of this.#services.values()) {
      this.#draining.add(info);
      this.#allocator.release(info.proxyPort);
      if (info.local !== undefined) this.#allocator.release(info.local.proxyPort);
    }
    this.#services.clear();
    for (const info of this.#draining) {
      info.listener.destroy();
      info.local?.listener.destroy();
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

function statusOf(info: ServiceInfo): ServicePortStatus {
  return {
    servicePort: info.servicePort,
    proxyPort: info.proxyPort,
    endpoints: familyEndpoints(info.context.balancers),
    context: info.context,
    localProxyPort: info.local?.proxyPort ?? 0,
    localEndpoints: info.local === undefined ? [] : familyEndpoints(info.local.context.balancers),
    portalEndpoints: info.endpoints,
  };
}

/** The list the primary listener serves: the cluster-wide one, or the local one when it is the only one used. */
function primaryList(sp: ServicePort, eps: ServicePortEndpoints | undefined): readonly Endpoint[] {
  if (eps === undefined) return [];
  return usesClusterEndpoints(sp) ? eps.cluster : eps.local;
}

/** UDP sessions to endpoints that left the list are closed: the client's next datagram picks again. */
function endpointsChanged(listener: TcpListener | UdpListener): void {
  listener.endpointsChanged();
}

/**
 * Where a service port's NodePort is held: `hosts`, except that a single-stack service port is not
 * held on the other family (a wildcard `::` listener would answer an IPv4-only service over IPv6).
 */
export function nodePortHostsFor(sp: ServicePort, hosts: readonly string[]): string[] {
  if (isDualStack(sp)) return [...hosts];
  const v6 = primaryFamily(sp) === 'IPv6';
  const out: string[] = [];
  for (const host of hosts) {
    if (host === '::' && !v6) out.push('0.0.0.0');
    else if (host === '::' || host.includes(':') === v6) out.push(host);
  }
  return out;
}
