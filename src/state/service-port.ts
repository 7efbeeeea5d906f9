// ServicePort: what the proxier needs to know about one port of one Service, after validation.
// Pure data; built by the state module from Service objects.

export type Protocol = 'TCP' | 'UDP';
export type { IPFamily } from '../lib/ip.ts';
export type SessionAffinity = 'None' | 'ClientIP';
export type { ProxyProtocolMode, TraceMode } from '../config/config.ts';

import type { ProxyProtocolMode, TraceMode } from '../config/config.ts';
import { flat } from '../lib/flat-string.ts';
import { sameList } from '../lib/lists.ts';

/** `namespace/name:portName` — kube-proxy's ServicePortName string (portName may be empty: `ns/name:`). */
export type ServicePortName = string & { readonly __brand: 'ServicePortName' };
/** `namespace/name:portName/PROTOCOL` — the unique key of a service port (name + protocol). */
export type ServicePortKey = string & { readonly __brand: 'ServicePortKey' };

export function servicePortName(namespace: string, name: string, portName: string): ServicePortName {
  return flat(namespace, '/', name, ':', portName) as ServicePortName;
}

export function servicePortKey(name: ServicePortName, protocol: Protocol): ServicePortKey {
  return flat(name, '/', protocol) as ServicePortKey;
}

/** The name and protocol of a key built by servicePortKey. */
export function parseServicePortKey(key: ServicePortKey): { name: ServicePortName; protocol: Protocol } {
  const slash = key.lastIndexOf('/');
  return { name: key.slice(0, slash) as ServicePortName, protocol: key.slice(slash + 1) as Protocol };
}

/** The default and the maximum of sessionAffinityConfig.clientIP.timeoutSeconds (API server rules). */
export const DEFAULT_STICKY_MAX_AGE_SECONDS = 10800;
export const MAX_STICKY_MAX_AGE_SECONDS = 86400;

export type ServicePort = {
  readonly key: ServicePortKey;
  readonly name: ServicePortName;
  readonly namespace: string;
  readonly serviceName: string;
  readonly portName: string;
  readonly protocol: Protocol;
  /** Cluster IPs, primary family first (one per family; dual-stack services have two). */
  readonly clusterIPs: readonly string[];
  readonly port: number;
  /** 0 when the service has no NodePort. */
  readonly nodePort: number;
  /** Valid external IPs, in spec order. */
  readonly externalIPs: readonly string[];
  /** status.loadBalancer.ingress[].ip whose ipMode is absent or VIP. */
  readonly loadBalancerIPs: readonly string[];
  readonly loadBalancerSourceRanges: readonly string[];
  readonly sessionAffinity: SessionAffinity;
  /** Seconds a ClientIP affinity entry lives without use (only meaningful for ClientIP). */
  readonly stickyMaxAgeSeconds: number;
  /** Reachable from outside the cluster: a NodePort, externalIPs, LB IPs, or type NodePort/LoadBalancer. */
  readonly externallyAccessible: boolean;
  /** externalTrafficPolicy: Local on an externally accessible service. */
  readonly externalPolicyLocal: boolean;
  /** internalTrafficPolicy: Local. */
  readonly internalPolicyLocal: boolean;
  /** Health check node port for LoadBalancer services with externalTrafficPolicy: Local; 0 = none. */
  readonly healthCheckNodePort: number;
  /** Per-service tracing override from our annotation; undefined = use --trace. */
  readonly trace: TraceMode | undefined;
  /**
   * Per-service PROXY protocol from our annotation (`off` also for a value that is not one); undefined =
   * use --proxy-protocol. Only TCP service ports send it.
   */
  readonly proxyProtocol: ProxyProtocolMode | undefined;
};

/**
 * kube-proxy's UsesClusterEndpoints: internal traffic under policy Cluster, or any external traffic
 * (even under externalTrafficPolicy Local: traffic from this node's pods and from the node itself to an
 * external destination is short-circuited to the cluster list).
 */
export function usesClusterEndpoints(sp: ServicePort): boolean {
  return !sp.internalPolicyLocal || sp.externallyAccessible;
}

/** kube-proxy's UsesLocalEndpoints: a traffic policy of the service port is Local. */
export function usesLocalEndpoints(sp: ServicePort): boolean {
  return sp.internalPolicyLocal || sp.externalPolicyLocal;
}

/** True when the two ports would render the same iptables rules for the same proxy port. */
export function samePortals(a: ServicePort, b: ServicePort): boolean {
  return (
    a.protocol === b.protocol &&
    a.port === b.port &&
    a.nodePort === b.nodePort &&
    a.externallyAccessible === b.externallyAccessible &&
    a.internalPolicyLocal === b.internalPolicyLocal &&
    a.externalPolicyLocal === b.externalPolicyLocal &&
    a.healthCheckNodePort === b.healthCheckNodePort &&
    sameList(a.clusterIPs, b.clusterIPs) &&
    sameList(a.externalIPs, b.externalIPs) &&
    sameList(a.loadBalancerIPs, b.loadBalancerIPs) &&
    sameList(a.loadBalancerSourceRanges, b.loadBalancerSourceRanges)
  );
}
