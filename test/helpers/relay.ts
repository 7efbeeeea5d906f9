// Builds a service port context and listener for relay tests.
import { RoundRobinBalancer } from '../../src/loadbalancer/round-robin.ts';
import { silentLogger } from '../../src/log.ts';
import { noopObserver } from '../../src/relay/observer.ts';
import type { ServicePortContext } from '../../src/relay/service-context.ts';
import { newServicePortStats } from '../../src/relay/service-context.ts';
import type { Endpoint } from '../../src/state/endpoint.ts';
import type { ServicePortName } from '../../src/state/service-port.ts';

export function makeContext(
  endpoints: Endpoint[],
  protocol: 'TCP' | 'UDP' = 'TCP',
  name = 'default/test:http',
): ServicePortContext {
  const balancer = new RoundRobinBalancer();
  balancer.setEndpoints(endpoints);
  return {
    name: name as ServicePortName,
    protocol,
    balancer,
    stats: newServicePortStats(),
    observer: noopObserver,
  };
}

export const log = silentLogger();
