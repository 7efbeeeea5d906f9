// Endpoint: one usable backend address of a service port, as merged from EndpointSlices. Pure data.
import { flat } from '../lib/flat-string.ts';
import type { IPFamily } from './service-port.ts';

/** `ip:port`, IPv6 in brackets (`[fd00::1]:80`), as net.JoinHostPort writes it. */
export type EndpointKey = string & { readonly __brand: 'EndpointKey' };

export function endpointKey(ip: string, port: number): EndpointKey {
  return (ip.includes(':') ? flat('[', ip, ']:', port) : flat(ip, ':', port)) as EndpointKey;
}

export type Endpoint = {
  readonly key: EndpointKey;
  readonly ip: string;
  readonly port: number;
  readonly family: IPFamily;
  /**
   * conditions.ready (nil = true), trusted as kube-proxy does: the slice controller sets it on
   * terminating endpoints of Services with publishNotReadyAddresses.
   */
  readonly ready: boolean;
  /** conditions.serving (nil = true). */
  readonly serving: boolean;
  /** conditions.terminating (nil = false). */
  readonly terminating: boolean;
  /** nodeName equals this node's name. */
  readonly isLocal: boolean;
  readonly nodeName: string | undefined;
  /** hints.forZones[].name; undefined when the endpoint carries no zone hints. */
  readonly zoneHints: readonly string[] | undefined;
  /** hints.forNodes[].name (trafficDistribution PreferSameNode); undefined when it carries none. */
  readonly nodeHints: readonly string[] | undefined;
};

/**
 * The endpoints of one service port, as kube-proxy's CategorizeEndpoints splits them: the cluster-wide
 * list and the node-local list. Which traffic uses which is the traffic policies' business
 * (`internalEndpoints`, `externalEndpoints` in categorize-endpoints.ts). Both sorted by key.
 */
export type ServicePortEndpoints = {
  /** Every merged endpoint of this service port, before filtering (for /debug and health). */
  readonly all: readonly Endpoint[];
  /**
   * Ready endpoints (narrowed by node, else zone hints), else the serving and terminating ones; [] when
   * the service port does not use the cluster list (internalTrafficPolicy Local, not externally
   * accessible).
   */
  readonly cluster: readonly Endpoint[];
  /**
   * This node's ready endpoints, else its serving and terminating ones; [] when no traffic policy of
   * the service port is Local.
   */
  readonly local: readonly Endpoint[];
  /**
   * Some endpoint anywhere is usable (ready, or serving and terminating), whatever the policies: a
   * service port without any is REJECTed, one whose policy leaves none for some traffic DROPs it.
   */
  readonly hasAnyEndpoints: boolean;
  /** Distinct IPs of local endpoints that are ready: what the health check node port reports. */
  readonly localReadyCount: number;
};
