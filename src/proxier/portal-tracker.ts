// Portal bookkeeping: which service ports' portals may differ from what the rules hold, the PortalSpec
// of each (the same object while nothing it depends on changed, kept by its runtime), and the call that
// programs them: the whole picture, or a delta of the changed ones. Opens nothing; the portal programmer
// writes the rules.
import type { ServicePortEndpoints } from '../state/endpoint.ts';
import type { ServicePort, ServicePortKey } from '../state/service-port.ts';
import { portalEndpoints } from './portal-endpoints.ts';
import { noPortals, type PortalProgrammer, type PortalSpec } from './portal-programmer.ts';
import type { ServicePortRuntime } from './service-port-runtime.ts';

export class PortalTracker {
  readonly #programmer: PortalProgrammer;
  readonly #claimNodePorts: boolean;
  /** Service ports whose portal may differ from what was last programmed (the next delta's keys). */
  readonly #changes = new Set<ServicePortKey>();

  /** `claimNodePorts`: a NodePort gets rules only while it is held (see NodePortClaims). */
  constructor(programmer: PortalProgrammer, claimNodePorts: boolean) {
    this.#programmer = programmer;
    this.#claimNodePorts = claimNodePorts;
  }

  /** True when rules are written at all (not --no-iptables). */
  get enabled(): boolean {
    return this.#programmer !== noPortals;
  }

  /** True when some portal may differ from what was last programmed. */
  get pending(): boolean {
    return this.#changes.size > 0;
  }

  /** `key`'s listeners or NodePort claim may have changed: its portal is looked at again. */
  touch(key: ServicePortKey): void {
    this.#changes.add(key);
  }

  /** `rt`'s service port or endpoint flags changed (or it stopped): its portal is built anew. */
  invalidate(rt: ServicePortRuntime): void {
    rt.portal = undefined;
    this.#changes.add(rt.servicePort.key);
  }

  /**
   * One running service port's portal; `heldNodePort` is the NodePort held for it, if any. Kept in
   * `rt.portal` for the next call only when rules are written (not in a worker process, nor with
   * --no-iptables): the same object lets the rules' delta skip an unchanged service port with one
   * identity check.
   */
  portalOf(rt: ServicePortRuntime, heldNodePort: number | undefined): PortalSpec {
    const sp = rt.servicePort;
    // A NodePort someone else holds gets no rules: we must not hijack their traffic.
    const unclaimed = this.#claimNodePorts && sp.nodePort !== 0 && heldNodePort !== sp.nodePort;
    const cached = rt.portal;
    const localProxyPort = rt.localProxyPort;
    // invalidate() drops the cache; what is left to compare is the NodePort claim and the listeners.
    if (
      cached !== undefined &&
      cached.proxyPort === rt.proxyPort &&
      cached.localProxyPort === localProxyPort &&
      cached.portalPorts === rt.portalPorts &&
      unclaimed !== (cached.servicePort === sp)
    )
      return cached;
    const portal: PortalSpec = {
      servicePort: unclaimed ? { ...sp, nodePort: 0 } : sp,
      proxyPort: rt.proxyPort,
      localProxyPort,
      endpoints: rt.endpoints,
      portalPorts: rt.portalPorts,
    };
    if (this.enabled) rt.portal = portal;
    return portal;
  }

  /** The portal a service port not yet bound will most likely get: `proxyPort` planned, no NodePort held. */
  plannedPortal(sp: ServicePort, proxyPort: number, eps: ServicePortEndpoints | undefined): PortalSpec {
    const unclaimed = this.#claimNodePorts && sp.nodePort !== 0;
    return {
      servicePort: unclaimed ? { ...sp, nodePort: 0 } : sp,
      proxyPort,
      localProxyPort: 0,
      endpoints: portalEndpoints(eps),
    };
  }

  /** Rewrites every rule from `portals` (the early restore of a cold start). */
  syncAll(portals: readonly PortalSpec[], full: boolean, initial: boolean): Promise<void> {
    return this.#programmer.sync(portals, { full, initial });
  }

  /**
   * Programs the rules: everything when `full`, else only the touched service ports (a delta that
   * does not look at the 10,000 others). `all` gives every running portal, `current` one key's
   * (undefined: it runs no more).
   */
  async program(
    full: boolean,
    initial: boolean,
    all: () => PortalSpec[],
    current: (key: ServicePortKey) => PortalSpec | undefined,
  ): Promise<void> {
    // No rules (--no-iptables, a worker): nothing to hand over, so the 10,000 portals are not built.
    if (!this.enabled) {
      this.#changes.clear();
      return;
    }
    const update = this.#programmer.update?.bind(this.#programmer);
    if (full || update === undefined) {
      await this.#programmer.sync(all(), { full, initial });
    } else {
      const changed = new Map<ServicePortKey, PortalSpec | undefined>();
      for (const key of this.#changes) changed.set(key, current(key));
      await update(changed, all, { initial });
    }
    this.#changes.clear();
  }
}
