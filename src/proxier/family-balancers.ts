// The balancers behind one listener: one per IP family of a dual-stack service port (traffic to its
// IPv4 ClusterIP must reach IPv4 endpoints only, as with kube-proxy's per-family proxiers), one shared
// by both families otherwise. The relay picks by the client's family, which NAT never changes.
import type { OutlierOptions } from '../loadbalancer/outlier.ts';
import { RoundRobinBalancer } from '../loadbalancer/round-robin.ts';
import type { FamilyBalancers as Families } from '../relay/service-context.ts';

/** The proxier's balancers: it sets their endpoints and affinity. */
export type FamilyBalancers = Families<RoundRobinBalancer>;

import { endpointsOfFamily } from '../state/categorize-endpoints.ts';
import type { Endpoint } from '../state/endpoint.ts';
import type { IPFamily, ServicePort } from '../state/service-port.ts';

/** True when the service port has a cluster IP of each family. */
export function isDualStack(sp: Pick<ServicePort, 'clusterIPs'>): boolean {
  let v4 = false;
  let v6 = false;
  for (const ip of sp.clusterIPs) {
    if (ip.includes(':')) v6 = true;
    else v4 = true;
  }
  return v4 && v6;
}

/** The family of the service port's primary cluster IP. */
export function primaryFamily(sp: Pick<ServicePort, 'clusterIPs'>): IPFamily {
  return sp.clusterIPs[0]?.includes(':') ? 'IPv6' : 'IPv4';
}

/** New empty balancers for `sp`, with its session affinity. */
export function newFamilyBalancers(
  sp: ServicePort,
  outlier: OutlierOptions | undefined,
  random: () => number = Math.random,
  affinityByHash = false,
): FamilyBalancers {
  const first = new RoundRobinBalancer(random, outlier, affinityByHash);
  const balancers = {
    IPv4: first,
    IPv6: isDualStack(sp) ? new RoundRobinBalancer(random, outlier, affinityByHash) : first,
  };
  setFamilyAffinity(balancers, sp);
  return balancers;
}

export function setFamilyAffinity(balancers: FamilyBalancers, sp: ServicePort): void {
  balancers.IPv4.setAffinity(sp.sessionAffinity, sp.stickyMaxAgeSeconds);
  if (balancers.IPv6 !== balancers.IPv4)
    balancers.IPv6.setAffinity(sp.sessionAffinity, sp.stickyMaxAgeSeconds);
}

/** Hands each balancer its family's part of `list`. True when some balancer's endpoint set changed. */
export function setFamilyEndpoints(balancers: FamilyBalancers, list: readonly Endpoint[]): boolean {
  if (balancers.IPv6 === balancers.IPv4) return balancers.IPv4.setEndpoints(list);
  const v4 = balancers.IPv4.setEndpoints(endpointsOfFamily(list, 'IPv4'));
  const v6 = balancers.IPv6.setEndpoints(endpointsOfFamily(list, 'IPv6'));
  return v4 || v6;
}

/** Every endpoint the balancers hold (IPv4 first). */
export function familyEndpoints(balancers: FamilyBalancers): readonly Endpoint[] {
  if (balancers.IPv6 === balancers.IPv4) return balancers.IPv4.endpoints;
  return [...balancers.IPv4.endpoints, ...balancers.IPv6.endpoints];
}

/** Drops expired ClientIP affinity entries. */
export function cleanupFamilyAffinity(balancers: FamilyBalancers, nowMs: number): void {
  balancers.IPv4.cleanupStaleStickySessions(nowMs);
  if (balancers.IPv6 !== balancers.IPv4) balancers.IPv6.cleanupStaleStickySessions(nowMs);
}
