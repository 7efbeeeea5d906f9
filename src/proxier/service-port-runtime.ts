// What runs for one service port: its primary listener (the cluster-wide list, or the local one when
// it is the only one used), the local list's second listener when it uses both, the listeners of its
// external destinations when it sends the PROXY protocol (portal-listeners.ts), their per-family
// balancers, and what the rules know of its endpoints. Binds through the port binder; writes no rules.

import type { ProxyProtocolMode } from '../config/config.ts';
import { sameList } from '../lib/lists.ts';
import type { Logger } from '../lib/log.ts';
import type { OutlierOptions } from '../loadbalancer/outlier.ts';
import type { RoundRobinBalancer } from '../loadbalancer/round-robin.ts';
import type { ConnectionObserver } from '../relay/observer.ts';
import type { ServicePortContext } from '../relay/service-context.ts';

import { IDLE_STATS, newServicePortStats, retainPicks } from '../relay/service-context.ts';
import type { Endpoint, EndpointKey, ServicePortEndpoints } from '../state/endpoint.ts';
import { type ServicePort, usesClusterEndpoints, usesLocalEndpoints } from '../state/service-port.ts';
import {
  cleanupFamilyAffinity,
  familyEndpoints,
  newFamilyBalancers,
  primaryFamily,
  setFamilyAffinity,
  setFamilyEndpoints,
} from './family-balancers.ts';
import type { LoopGuard } from './loop-guard.ts';
import type { PortBinder } from './port-binder.ts';
import { type FamilyPortalEndpoints, portalEndpoints } from './portal-endpoints.ts';
import {
  ownListenerDestination,
  type PortalListenerSpec,
  portalListenerSpecs,
  proxyProtocolOf,
  proxyProtocolSettings,
} from './portal-listeners.ts';
import type { PortalPorts, PortalSpec } from './portal-programmer.ts';
import type { ServicePortListener } from './service-port-listener.ts';

/** The contexts the proxier builds: of its own balancers, whose endpoints and affinity it sets. */
type RelayContext = ServicePortContext<RoundRobinBalancer>;

/** One listener's key as the state file keeps it (see proxyPortsByKey), and its proxy port. */
export type ListenerPort = readonly [key: string, port: number];

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

export type ServicePortStatus = {
  servicePort: ServicePort;
  proxyPort: number;
  endpoints: readonly Endpoint[];
  context: RelayContext;
  /** The local list's listener, when the service port has a second one; 0 and [] otherwise. */
  localProxyPort: number;
  localEndpoints: readonly Endpoint[];
  /** What the rules know of the endpoints, per family (REJECT / DROP when a list is empty). */
  portalEndpoints: FamilyPortalEndpoints;
  /** Endpoints left out of the balancers because they lead back to this proxy (loop-guard.ts). */
  loopEndpoints: readonly EndpointKey[];
  /** The PROXY protocol version its TCP connections send; undefined: none. */
  proxyProtocol: 'v1' | 'v2' | undefined;
  /** The listeners of its external destinations (PROXY protocol with rules), by `via` (IP or `node`). */
  portalPorts: ReadonlyMap<string, PortalPorts>;
};

/** What a runtime needs besides its service port: where ports come from, balancer settings, the tracer. */
export type RuntimeDeps = {
  binder: PortBinder;
  outlier: OutlierOptions | undefined;
  observerFor: (sp: ServicePort) => ConnectionObserver;
  log: Logger;
  /** Leaves out the endpoints that lead back to this proxy. */
  loopGuard: LoopGuard;
  /** Rules send traffic to the listeners (false with --no-iptables): destinations are told apart. */
  portals: boolean;
  /** --proxy-protocol: for service ports without the annotation. */
  proxyProtocolDefault: ProxyProtocolMode;
  /** ClientIP affinity by rendezvous hashing, the same in every process (--workers). */
  affinityByHash?: boolean;
};

const NO_KEYS: readonly EndpointKey[] = [];

/** Scratch for the endpoints a setEndpoints left out (one call at a time: the proxier is synchronous here). */
const refusedScratch = new Set<EndpointKey>();

/** A listener and what it serves: the second one of a service port that uses both endpoint lists. */
type PolicyListener = { context: RelayContext; listener: ServicePortListener; proxyPort: number };

/** A listener of one external destination, and the context (of one of the lists) it shares. */
type PortalListener = PolicyListener & { readonly spec: PortalListenerSpec };

const NO_PORTAL_PORTS: ReadonlyMap<string, PortalPorts> = new Map();
const NO_PORTAL_LISTENERS: ReadonlyMap<string, PortalListener> = new Map();

export class ServicePortRuntime {
  servicePort: ServicePort;
  /** The primary listener's context: the cluster-wide list (the local list when it is the only one used). */
  readonly context: RelayContext;
  readonly listener: ServicePortListener;
  readonly proxyPort: number;
  /** What the rules know of the endpoints (REJECT / DROP when a list is empty). */
  endpoints: FamilyPortalEndpoints;
  /** Endpoints left out because they lead back to this proxy. */
  loopEndpoints: readonly EndpointKey[] = NO_KEYS;
  #local: PolicyListener | undefined;
  /** By key (portalListenerKey); the shared empty map until the first (most service ports have none). */
  #portalListeners: ReadonlyMap<string, PortalListener> = NO_PORTAL_LISTENERS;
  /** Their ports by destination, for the rules; a new object whenever a listener comes or goes. */
  portalPorts: ReadonlyMap<string, PortalPorts> = NO_PORTAL_PORTS;
  /** The last endpoints handed over, to filter again when our listeners change. */
  #eps: ServicePortEndpoints | undefined;
  readonly #deps: RuntimeDeps;
  // What the proxier's parts keep of a running service port is kept here, with it, not in maps keyed by
  // service port (a map's entry costs ~46 bytes; a field 8).
  /** The service port as the loop guard's picture has it (LoopGuard.place), taken out when it stops. */
  placed: ServicePort | undefined = undefined;
  /** Its portal as last handed to the rules (PortalTracker.portalOf); undefined: built anew. */
  portal: PortalSpec | undefined = undefined;

  private constructor(
    servicePort: ServicePort,
    primary: PolicyListener,
    local: PolicyListener | undefined,
    endpoints: ServicePortEndpoints | undefined,
    deps: RuntimeDeps,
  ) {
    this.servicePort = servicePort;
    this.context = primary.context;
    this.listener = primary.listener;
    this.proxyPort = primary.proxyPort;
    this.#local = local;
    this.endpoints = portalEndpoints(endpoints);
    this.#eps = endpoints;
    this.#deps = deps;
  }

  /**
   * Binds the listeners of `sp` (the primary on `planned` when given) with `endpoints` in their
   * balancers. Throws the binder's error with every port given back.
   */
  static async open(
    sp: ServicePort,
    endpoints: ServicePortEndpoints | undefined,
    deps: RuntimeDeps,
    planned?: number,
  ): Promise<ServicePortRuntime> {
    const context = newContext(sp, deps.observerFor(sp), deps, undefined);
    setFamilyEndpoints(context.balancers, deps.loopGuard.filter(sp, primaryList(sp, endpoints), new Set()));
    const destination = ownListenerDestination(deps.portals);
    const { listener, port } = await deps.binder.listen(context, sp.key, planned, destination);
    let local: PolicyListener | undefined;
    if (needsLocalListener(sp)) {
      try {
        local = await openLocal(sp, context, endpoints, deps);
      } catch (err) {
        listener.destroy();
        deps.binder.release(port);
        throw err;
      }
    }
    const rt = new ServicePortRuntime(sp, { context, listener, proxyPort: port }, local, endpoints, deps);
    try {
      await rt.reconcilePortals();
    } catch (err) {
      rt.destroy();
      rt.releasePorts();
      throw err;
    }
    // The same lists again (no change): what was left out is recorded.
    rt.setEndpoints(endpoints);
    return rt;
  }

  /**
   * Opens the listeners of external destinations the service port now needs and closes those it no
   * longer does (the PROXY protocol turned on or off, an IP or the NodePort added or removed, a
   * traffic policy change). True when any came or went: the rules must follow. Throws the binder's
   * error (those opened before stay: the caller stops the whole service port).
   */
  async reconcilePortals(): Promise<boolean> {
    const sp = this.servicePort;
    const wanted = new Map<string, { spec: PortalListenerSpec; context: RelayContext }>();
    for (const spec of portalListenerSpecs(
      sp,
      proxyProtocolOf(sp, this.#deps.proxyProtocolDefault),
      this.#deps.portals,
    )) {
      const context = spec.list === 'local' ? this.#local?.context : this.context;
      if (context !== undefined) wanted.set(spec.key, { spec, context });
    }
    let changed = false;
    if (wanted.size > 0 && this.#portalListeners === NO_PORTAL_LISTENERS) this.#portalListeners = new Map();
    const listeners = this.#portalListeners as Map<string, PortalListener>;
    for (const [key, pl] of listeners) {
      const want = wanted.get(key);
      if (want !== undefined && want.context === pl.context) continue;
      listeners.delete(key);
      await pl.listener.close();
      this.#deps.binder.release(pl.proxyPort);
      changed = true;
    }
    for (const [key, { spec, context }] of wanted) {
      if (listeners.has(key)) continue;
      const { listener, port } = await this.#deps.binder.listen(context, key, undefined, spec.destination);
      listeners.set(key, { context, listener, proxyPort: port, spec });
      changed = true;
    }
    if (changed) this.portalPorts = portalPortsOf(listeners.values());
    return changed;
  }

  /** Every endpoint of the last lists handed over, before filtering (what the loop guard indexes). */
  get listedEndpoints(): readonly Endpoint[] | undefined {
    return this.#eps?.all;
  }

  /** Every listener's proxy port, keyed as the state file keeps them: its own key, `/local`, the portals'. */
  proxyPortsByKey(): ListenerPort[] {
    const key = this.servicePort.key;
    const out: ListenerPort[] = [[key, this.proxyPort]];
    if (this.#local !== undefined) out.push([localProxyPortKey(key), this.#local.proxyPort]);
    for (const [k, pl] of this.#portalListeners) out.push([k, pl.proxyPort]);
    return out;
  }

  /** Every proxy port of the listeners of external destinations, keyed as the state file keeps them. */
  portalProxyPorts(): [string, number][] {
    return [...this.#portalListeners].map(([key, pl]) => [key, pl.proxyPort]);
  }

  /** The local list's proxy port; 0 without a second listener. */
  get localProxyPort(): number {
    return this.#local?.proxyPort ?? 0;
  }

  /** True when the second listener (the local list's) runs. */
  get hasLocal(): boolean {
    return this.#local !== undefined;
  }

  /** What external traffic (NodePort claims) is served from: the local list under externalTrafficPolicy Local. */
  get externalContext(): RelayContext {
    return this.servicePort.externalPolicyLocal && this.#local !== undefined
      ? this.#local.context
      : this.context;
  }

  /**
   * Hands the listeners their lists; UDP sessions to endpoints that left are closed. True when what
   * the rules know flipped (a list became empty or stopped being empty).
   */
  setEndpoints(eps: ServicePortEndpoints | undefined): boolean {
    this.#eps = eps;
    const sp = this.servicePort;
    const guard = this.#deps.loopGuard;
    const refused = refusedScratch;
    refused.clear();
    let changed = false;
    if (setFamilyEndpoints(this.context.balancers, guard.filter(sp, primaryList(sp, eps), refused))) {
      this.listener.endpointsChanged();
      changed = true;
    }
    const local = this.#local;
    if (
      local !== undefined &&
      setFamilyEndpoints(local.context.balancers, guard.filter(sp, eps?.local ?? [], refused))
    ) {
      local.listener.endpointsChanged();
      changed = true;
    }
    this.loopEndpoints = refused.size === 0 ? NO_KEYS : [...refused];
    if (changed) this.#retainPicks();
    const flags = portalEndpoints(eps);
    if (flags === this.endpoints) return false;
    this.endpoints = flags;
    return true;
  }

  /**
   * Our listeners changed: the last endpoints are filtered again (see LoopGuard). True when what is left
   * out changed (and with it the balancers: the endpoints are the same).
   */
  refilter(): boolean {
    const before = this.loopEndpoints;
    this.setEndpoints(this.#eps);
    return !sameList(before, this.loopEndpoints);
  }

  /** The pick counts of endpoints no balancer of this service port holds any more are dropped. */
  #retainPicks(): void {
    const keys = new Set<string>();
    for (const e of familyEndpoints(this.context.balancers)) keys.add(e.key);
    if (this.#local !== undefined)
      for (const e of familyEndpoints(this.#local.context.balancers)) keys.add(e.key);
    retainPicks(this.context.stats, keys);
  }

  /**
   * A changed service port of the same families: affinity and tracing are applied in place, and the
   * endpoints (a policy change moves the primary listener between the lists). Returns setEndpoints'.
   */
  update(sp: ServicePort, eps: ServicePortEndpoints | undefined): boolean {
    const before = this.servicePort;
    this.servicePort = sp;
    setFamilyAffinity(this.context.balancers, sp);
    if (this.#local !== undefined) setFamilyAffinity(this.#local.context.balancers, sp);
    if (before.trace !== sp.trace) {
      this.context.observer = this.#deps.observerFor(sp);
      if (this.#local !== undefined) this.#local.context.observer = this.context.observer;
    }
    // New connections only: each reads it once, at accept.
    const pp = proxyProtocolSettings(sp, proxyProtocolOf(sp, this.#deps.proxyProtocolDefault));
    this.context.proxyProtocol = pp;
    if (this.#local !== undefined) this.#local.context.proxyProtocol = pp;
    return this.setEndpoints(eps);
  }

  /** Every balancer of the service port: both lists', both families' (the same one for a single stack). */
  balancers(): RoundRobinBalancer[] {
    const out = new Set<RoundRobinBalancer>([this.context.balancers.IPv4, this.context.balancers.IPv6]);
    if (this.#local !== undefined) {
      out.add(this.#local.context.balancers.IPv4);
      out.add(this.#local.context.balancers.IPv6);
    }
    return [...out];
  }

  /** Drops expired ClientIP affinity entries. */
  cleanupAffinity(nowMs: number): void {
    cleanupFamilyAffinity(this.context.balancers, nowMs);
    if (this.#local !== undefined) cleanupFamilyAffinity(this.#local.context.balancers, nowMs);
  }

  /** Opens the local list's listener (it shares the counters and observer). Throws the binder's error. */
  async openLocal(eps: ServicePortEndpoints | undefined): Promise<void> {
    this.#local = await openLocal(this.servicePort, this.context, eps, this.#deps);
  }

  /** Closes the local list's listener and gives its port back. */
  async closeLocal(): Promise<void> {
    const before = this.#local;
    if (before === undefined) return;
    this.#local = undefined;
    await before.listener.close();
    this.#deps.binder.release(before.proxyPort);
    this.#deps.log.info(
      { service: this.servicePort.key, localProxyPort: before.proxyPort },
      'Closed local service port',
    );
  }

  /** Tears down a local listener opened after its proxier closed, and gives its port back. */
  discardLocal(): void {
    const local = this.#local;
    if (local === undefined) return;
    this.#local = undefined;
    local.listener.destroy();
    this.#deps.binder.release(local.proxyPort);
  }

  /** Stops accepting (established TCP connections run on) and gives the ports back. */
  async close(): Promise<void> {
    await this.listener.close();
    await this.#local?.listener.close();
    for (const pl of this.#portalListeners.values()) await pl.listener.close();
    this.releasePorts();
  }

  /** Resolves once its listeners have no connection left. */
  async drained(): Promise<void> {
    await Promise.all([
      this.listener.drained(),
      this.#local?.listener.drained(),
      ...[...this.#portalListeners.values()].map((pl) => pl.listener.drained()),
    ]);
  }

  /** Gives the ports back to the allocator (the listeners may still drain). */
  releasePorts(): void {
    this.#deps.binder.release(this.proxyPort);
    if (this.#local !== undefined) this.#deps.binder.release(this.#local.proxyPort);
    for (const pl of this.#portalListeners.values()) this.#deps.binder.release(pl.proxyPort);
  }

  /** Tears down the listeners and their connections now (the ports are not given back). */
  destroy(): void {
    this.listener.destroy();
    this.#local?.listener.destroy();
    for (const pl of this.#portalListeners.values()) pl.listener.destroy();
  }

  status(): ServicePortStatus {
    const local = this.#local;
    return {
      servicePort: this.servicePort,
      proxyPort: this.proxyPort,
      endpoints: familyEndpoints(this.context.balancers),
      context: this.context,
      localProxyPort: local?.proxyPort ?? 0,
      localEndpoints: local === undefined ? [] : familyEndpoints(local.context.balancers),
      portalEndpoints: this.endpoints,
      loopEndpoints: this.loopEndpoints,
      proxyProtocol: this.context.proxyProtocol?.version,
      portalPorts: this.portalPorts,
    };
  }

  /** Endpoint counts for the log line of an opened service port. */
  logFields(): Record<string, unknown> {
    const local = this.#local;
    return {
      service: this.servicePort.key,
      proxyPort: this.proxyPort,
      endpoints: familyEndpoints(this.context.balancers).length,
      ...(local === undefined
        ? {}
        : {
            localProxyPort: local.proxyPort,
            localEndpoints: familyEndpoints(local.context.balancers).length,
          }),
    };
  }
}

/**
 * A context for one listener of `sp`: its own balancers, the service port's counters and observer (the
 * primary's, for a second listener: `primary`). A TCP service port's counters start as the shared idle
 * ones (its listeners make them its own at the first connection: liveStats).
 */
function newContext(
  sp: ServicePort,
  observer: ConnectionObserver,
  deps: RuntimeDeps,
  primary: RelayContext | undefined,
): RelayContext {
  const balancers = newFamilyBalancers(sp, deps.outlier, Math.random, deps.affinityByHash);
  const proxyProtocol = proxyProtocolSettings(sp, proxyProtocolOf(sp, deps.proxyProtocolDefault));
  const balancer = balancers[primaryFamily(sp)];
  const stats = primary?.stats ?? (sp.protocol === 'TCP' ? IDLE_STATS : newServicePortStats());
  const context = {
    name: sp.name,
    protocol: sp.protocol,
    balancer,
    balancers,
    stats,
    observer,
    proxyProtocol,
  };
  return primary === undefined ? context : { ...context, statsOwner: primary };
}

/** The ports of the listeners of external destinations, by destination (`via`). */
function portalPortsOf(listeners: Iterable<PortalListener>): ReadonlyMap<string, PortalPorts> {
  const out = new Map<string, { proxyPort: number; localProxyPort: number }>();
  for (const pl of listeners) {
    const ports = out.get(pl.spec.via) ?? { proxyPort: 0, localProxyPort: 0 };
    if (pl.spec.list === 'local') ports.localProxyPort = pl.proxyPort;
    else ports.proxyPort = pl.proxyPort;
    out.set(pl.spec.via, ports);
  }
  return out.size === 0 ? NO_PORTAL_PORTS : out;
}

/** The local list's listener: a context of its own sharing `primary`'s counters and observer. */
async function openLocal(
  sp: ServicePort,
  primary: RelayContext,
  endpoints: ServicePortEndpoints | undefined,
  deps: RuntimeDeps,
): Promise<PolicyListener> {
  const context = newContext(sp, primary.observer, deps, primary);
  setFamilyEndpoints(context.balancers, deps.loopGuard.filter(sp, endpoints?.local ?? [], new Set()));
  const { listener, port } = await deps.binder.listen(
    context,
    localProxyPortKey(sp.key),
    undefined,
    ownListenerDestination(deps.portals),
  );
  return { context, listener, proxyPort: port };
}

/** The list the primary listener serves: the cluster-wide one, or the local one when it is the only one used. */
function primaryList(sp: ServicePort, eps: ServicePortEndpoints | undefined): readonly Endpoint[] {
  if (eps === undefined) return [];
  return usesClusterEndpoints(sp) ? eps.cluster : eps.local;
}
