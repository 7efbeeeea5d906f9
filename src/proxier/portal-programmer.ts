// The contract between the proxier and what writes the rules (iptables, or nothing with --no-iptables):
// the portals of each service port, and the calls that program them. Types only, and the null object.
import type { ServicePort, ServicePortKey } from '../state/service-port.ts';

/**
 * What the endpoint lists of one family hold, for the rules: a list that is empty gets no NAT rule for
 * the traffic it serves, and a filter rule instead (REJECT when the service port has no usable
 * endpoint at all, DROP when only its traffic policy leaves none, as kube-proxy).
 */
export type PortalEndpoints = {
  /** Some endpoint of this family is usable (ready, or serving and terminating), whatever the policies. */
  readonly any: boolean;
  /** The cluster-wide list is not empty (false when the service port does not use it). */
  readonly cluster: boolean;
  /** The node-local list is not empty (false when no policy of the service port is Local). */
  readonly local: boolean;
};

/** The listeners an external destination's traffic goes to: the cluster-wide list's, and the local's. */
export type PortalPorts = { readonly proxyPort: number; readonly localProxyPort: number };

/** The `via` of the NodePort's listeners in portalPorts (an IP is the via of the others). */
export const VIA_NODE_PORT = 'node';

/**
 * A service port and the listeners its traffic goes to. `proxyPort` serves the cluster-wide endpoint
 * list; a service port that uses only the local list (internalTrafficPolicy Local, not externally
 * accessible) has it serve the local list instead. A service port that uses both lists (a Local
 * policy beside external access or a Cluster policy) has a second listener, `localProxyPort`, serving
 * the local list; otherwise that is 0. Which traffic goes where (portalTargets):
 * - ClusterIP: the local list under internalTrafficPolicy Local, else the cluster list;
 * - NodePort, externalIPs, LB IPs from outside: the local list under externalTrafficPolicy Local, else
 *   the cluster list; from this node's pods and from the node itself always the cluster list
 *   (kube-proxy's short-circuit).
 */
export type PortalSpec = {
  readonly servicePort: ServicePort;
  readonly proxyPort: number;
  readonly localProxyPort: number;
  /** Per family: a dual-stack service's families are programmed (and REJECTed) separately. */
  readonly endpoints: { readonly IPv4: PortalEndpoints; readonly IPv6: PortalEndpoints };
  /**
   * External destinations with listeners of their own (a service port that sends the PROXY protocol:
   * portal-listeners.ts), by `via` (the IP, or `node` for the NodePort): their traffic goes there
   * instead, as it would to proxyPort / localProxyPort. Absent or empty: none.
   */
  readonly portalPorts?: ReadonlyMap<string, PortalPorts>;
};

/** Writes the rules that send service traffic to proxy ports (iptables), or nothing (--no-iptables). */
export interface PortalProgrammer {
  /** `full`: rewrite everything (start, periodic repair, after a failure); else only what changed. */
  sync(portals: readonly PortalSpec[], options: PortalSyncOptions & { full: boolean }): Promise<void>;
  /**
   * Only the portals of `changed` service ports (undefined: it has none any more) differ from the last
   * sync or update: apply them without looking at the others (`all()` is for a state it does not
   * know). Optional; without it the proxier calls sync().
   */
  update?(
    changed: ReadonlyMap<ServicePortKey, PortalSpec | undefined>,
    all: () => readonly PortalSpec[],
    options: PortalSyncOptions,
  ): Promise<void>;
}

export type PortalSyncOptions = {
  /**
   * Part of the proxier's first sync: the state the kernel holds (rules, conntrack entries) comes from
   * before this process, so nothing is concluded from what changed (e.g. no conntrack deletions).
   */
  readonly initial: boolean;
};

export const noPortals: PortalProgrammer = { sync: async () => {} };
