// Builders of ServicePorts and PortalSpecs for netfilter tests and benchmarks.
import type { PortalEndpoints, PortalSpec } from '../../src/proxier/portal-programmer.ts';
import {
  type Protocol,
  type ServicePort,
  servicePortKey,
  servicePortName,
} from '../../src/state/service-port.ts';

export type PortalOptions = Partial<Omit<ServicePort, 'key' | 'name'>> & {
  proxyPort?: number;
  localProxyPort?: number;
  portalPorts?: PortalSpec['portalPorts'];
  /** Both families' endpoint flags (default: usable cluster-wide endpoints, none local). */
  endpoints?: Partial<PortalEndpoints>;
  /** Per-family overrides, on top of `endpoints`. */
  IPv4?: Partial<PortalEndpoints>;
  IPv6?: Partial<PortalEndpoints>;
};

/**
 * A ClusterIP service port `namespace/serviceName:portName` with defaults for everything else:
 * no second listener, endpoints (any, cluster) in both families, externally accessible when it has a
 * NodePort, externalIPs or LB IPs.
 */
export function portal(
  namespace: string,
  serviceName: string,
  portName: string,
  o: PortalOptions = {},
): PortalSpec {
  const protocol: Protocol = o.protocol ?? 'TCP';
  const name = servicePortName(namespace, serviceName, portName);
  const servicePort: ServicePort = {
    key: servicePortKey(name, protocol),
    name,
    namespace,
    serviceName,
    portName,
    protocol,
    clusterIPs: o.clusterIPs ?? ['10.0.0.1'],
    port: o.port ?? 80,
    nodePort: o.nodePort ?? 0,
    externalIPs: o.externalIPs ?? [],
    loadBalancerIPs: o.loadBalancerIPs ?? [],
    externallyAccessible:
      o.externallyAccessible ??
      ((o.nodePort ?? 0) !== 0 || (o.externalIPs ?? []).length > 0 || (o.loadBalancerIPs ?? []).length > 0),
    loadBalancerSourceRanges: o.loadBalancerSourceRanges ?? [],
    sessionAffinity: o.sessionAffinity ?? 'None',
    stickyMaxAgeSeconds: o.stickyMaxAgeSeconds ?? 10800,
    externalPolicyLocal: o.externalPolicyLocal ?? false,
    internalPolicyLocal: o.internalPolicyLocal ?? false,
    healthCheckNodePort: o.healthCheckNodePort ?? 0,
    trace: o.trace,
    proxyProtocol: o.proxyProtocol,
  };
  const base: PortalEndpoints = { any: true, cluster: true, local: false, ...o.endpoints };
  return {
    servicePort,
    proxyPort: o.proxyPort ?? 40000,
    localProxyPort: o.localProxyPort ?? 0,
    ...(o.portalPorts === undefined ? {} : { portalPorts: o.portalPorts }),
    endpoints: { IPv4: { ...base, ...o.IPv4 }, IPv6: { ...base, ...o.IPv6 } },
  };
}

/**
 * `n` service ports like a busy cluster: ClusterIPs from 10.96.0.0/12, every tenth with a NodePort,
 * every twentieth UDP; proxy ports from 20000.
 */
export function manyPortals(n: number): PortalSpec[] {
  const out: PortalSpec[] = [];
  for (let i = 0; i < n; i++) {
    const ip = `10.${96 + (i >> 16)}.${(i >> 8) & 255}.${i & 255}`;
    out.push(
      portal('bench', `svc-${i}`, 'http', {
        clusterIPs: [ip],
        protocol: i % 20 === 19 ? 'UDP' : 'TCP',
        nodePort: i % 10 === 9 ? 30000 + (i % 2768) : 0,
        proxyPort: 20000 + (i % 40000),
      }),
    );
  }
  return out;
}
