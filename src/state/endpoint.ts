// Endpoint: one usable backend address of a service port, as merged from EndpointSlices. Pure data.
import type { IPFamily } from './service-port.ts';

/** `ip:port`, IPv6 in brackets (`[fd00::1]:80`), as net.JoinHostPort writes it. */
export type EndpointKey = string & { readonly __brand: 'EndpointKey' };

export function endpointKey(ip: string, port: number): EndpointKey {
  return (ip.includes(':') ? `[${ip}]:${port}` : `${ip}:${port}`) as EndpointKey;
}

export type Endpoint = {
  readonly key: EndpointKey;
  readonly ip: string;
  readonly port: number;
  readonly family: IPFamily;
  /** conditions.ready (nil = true); a terminating endpoint is never ready. */
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
};

/**
 * The endpoints of one service port, split by the traffic they serve (kube-proxy's CategorizeEndpoints):
 * `cluster` for traffic to the ClusterIP (honours internalTrafficPolicy), `external` for NodePort,
 * externalIP and LoadBalancer traffic (honours externalTrafficPolicy). Both sorted by key.
 */
export type ServicePortEndpoints = {
  /** Every merged endpoint of this service port, before filtering (for /debug and health). */
  readonly all: readonly Endpoint[];
  readonly cluster: readonly Endpoint[];
  readonly external: readonly Endpoint[];
  /** Distinct IPs of local endpoints that are ready: what the health check node port reports. */
  readonly localReadyCount: number;
};
