// Builds a service port context and listener for relay tests.

import { silentLogger } from '../../src/lib/log.ts';
import { RoundRobinBalancer } from '../../src/loadbalancer/round-robin.ts';
import { noopObserver } from '../../src/relay/observer.ts';
import type { ServicePortContext } from '../../src/relay/service-context.ts';
import { newServicePortStats } from '../../src/relay/service-context.ts';
import type { Endpoint } from '../../src/state/endpoint.ts';
import type { ServicePortName } from '../../src/state/service-port.ts';

/** A single-stack context: one balancer over `endpoints`, the same instance for both families. */
export function makeContext(
  endpoints: Endpoint[],
  protocol: 'TCP' | 'UDP' = 'TCP',
  name = 'default/test:http',
): ServicePortContext<RoundRobinBalancer> {
  const balancer = new RoundRobinBalancer();
  balancer.setEndpoints(endpoints);
  return contextFor(balancer, protocol, name);
}

/** A single-stack context over a balancer of the test's own (e.g. with outlier ejection). */
export function contextFor(
  balancer: RoundRobinBalancer,
  protocol: 'TCP' | 'UDP' = 'TCP',
  name = 'default/test:http',
): ServicePortContext<RoundRobinBalancer> {
  return {
    name: name as ServicePortName,
    protocol,
    balancer,
    balancers: { IPv4: balancer, IPv6: balancer },
    stats: newServicePortStats(),
    observer: noopObserver,
  };
}

/** A dual-stack context: one balancer per family, IPv4 the primary. */
export function makeDualStackContext(
  endpoints: { IPv4: Endpoint[]; IPv6: Endpoint[] },
  protocol: 'TCP' | 'UDP' = 'TCP',
  name = 'default/test:http',
): ServicePortContext<RoundRobinBalancer> {
  const v4 = new RoundRobinBalancer();
  v4.setEndpoints(endpoints.IPv4);
  const v6 = new RoundRobinBalancer();
  v6.setEndpoints(endpoints.IPv6);
  return {
    name: name as ServicePortName,
    protocol,
    balancer: v4,
    balancers: { IPv4: v4, IPv6: v6 },
    stats: newServicePortStats(),
    observer: noopObserver,
  };
}

export const log = silentLogger();
