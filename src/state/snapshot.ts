// The contract between the state module and the proxier: a picture of what should run. The two maps are
// the state's own and read-only: they change at the next checkout (the proxier always reads the latest).
import type { ServicePortEndpoints } from './endpoint.ts';
import type { ServicePort, ServicePortKey } from './service-port.ts';

export type Snapshot = {
  /** Every service port that should be proxied (skipped services — headless, ExternalName, no ClusterIP,
   * SCTP — are not here). */
  readonly servicePorts: ReadonlyMap<ServicePortKey, ServicePort>;
  /** Endpoints per service port key. A key with no usable endpoints may be absent or have empty lists. */
  readonly endpoints: ReadonlyMap<ServicePortKey, ServicePortEndpoints>;
  /** Keys whose ServicePort was added, changed or removed since the previous checkout. */
  readonly changedServicePorts: ReadonlySet<ServicePortKey>;
  /** Keys whose endpoints changed since the previous checkout. */
  readonly changedEndpoints: ReadonlySet<ServicePortKey>;
  /** Trigger times (epoch ms, from endpoints.kubernetes.io/last-change-trigger-time) of the endpoint
   * changes in this checkout, for network programming latency. */
  readonly triggerTimes: readonly number[];
};
