// Which endpoints of a service port receive which traffic: kube-proxy's CategorizeEndpoints (topology.go)
// plus the traffic-policy mapping the iptables proxier applies. Pure: no I/O.
import type { Endpoint, ServicePortEndpoints } from './endpoint.ts';
import type { ServicePort } from './service-port.ts';

/** The fields of a ServicePort that decide how its endpoints are used. */
export type EndpointPolicy = Pick<ServicePort, 'clusterIPs' | 'internalPolicyLocal' | 'externalPolicyLocal'>;

export const EMPTY_SERVICE_PORT_ENDPOINTS: ServicePortEndpoints = {
  all: [],
  cluster: [],
  external: [],
  localReadyCount: 0,
};

/**
 * Splits a service port's merged endpoints (sorted by key) by traffic kind, for a node in `nodeZone`
 * (its topology.kubernetes.io/zone label; undefined when it has none):
 * - only endpoints of a family the service has a cluster IP for are used (`all`);
 * - cluster list: ready endpoints, narrowed to this zone when every ready endpoint has zone hints and at
 *   least one names this zone; if none are ready, the serving and terminating ones (topology ignored);
 * - local list: local ready endpoints, else local serving+terminating ones, else none;
 * - `cluster` traffic gets the local list under internalTrafficPolicy Local, `external` traffic under
 *   externalTrafficPolicy Local, the cluster list otherwise.
 */
export function categorizeEndpoints(
  endpoints: readonly Endpoint[],
  policy: EndpointPolicy,
  nodeZone: string | undefined,
): ServicePortEndpoints {
  const hasV4 = policy.clusterIPs.some((ip) => !ip.includes(':'));
  const hasV6 = policy.clusterIPs.some((ip) => ip.includes(':'));
  const all = endpoints.filter((ep) => (ep.family === 'IPv4' ? hasV4 : hasV6));
  if (all.length === 0) return EMPTY_SERVICE_PORT_ENDPOINTS;

  const ready = all.filter((ep) => ep.ready);
  let clusterList: readonly Endpoint[];
  if (ready.length > 0) {
    clusterList = useZoneHints(ready, nodeZone)
      ? ready.filter((ep) => ep.zoneHints!.includes(nodeZone!))
      : ready;
  } else {
    clusterList = all.filter(isServingTerminating);
  }

  const localReady = ready.filter((ep) => ep.isLocal);
  const needLocal = policy.internalPolicyLocal || policy.externalPolicyLocal;
  const localList = !needLocal
    ? []
    : localReady.length > 0
      ? localReady
      : all.filter((ep) => ep.isLocal && isServingTerminating(ep));

  return {
    all,
    cluster: policy.internalPolicyLocal ? localList : clusterList,
    external: policy.externalPolicyLocal ? localList : clusterList,
    localReadyCount: new Set(localReady.map((ep) => ep.ip)).size,
  };
}

/** True when the two values list equal endpoints (every field) in the same order. */
export function sameServicePortEndpoints(a: ServicePortEndpoints, b: ServicePortEndpoints): boolean {
  return (
    a === b ||
    (a.localReadyCount === b.localReadyCount &&
      sameEndpoints(a.all, b.all) &&
      sameEndpoints(a.cluster, b.cluster) &&
      sameEndpoints(a.external, b.external))
  );
}

function sameEndpoints(a: readonly Endpoint[], b: readonly Endpoint[]): boolean {
  if (a === b) return true;
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (!sameEndpoint(a[i]!, b[i]!)) return false;
  return true;
}

function sameEndpoint(a: Endpoint, b: Endpoint): boolean {
  if (a === b) return true;
  if (
    a.key !== b.key ||
    a.ready !== b.ready ||
    a.serving !== b.serving ||
    a.terminating !== b.terminating ||
    a.isLocal !== b.isLocal ||
    a.nodeName !== b.nodeName
  )
    return false;
  const x = a.zoneHints;
  const y = b.zoneHints;
  if (x === undefined || y === undefined) return x === y;
  return x.length === y.length && x.every((z, i) => z === y[i]);
}

function isServingTerminating(ep: Endpoint): boolean {
  return ep.serving && ep.terminating;
}

// kube-proxy's topologyModeFromHints for zones: all-or-nothing, and only if this zone is named somewhere.
function useZoneHints(ready: readonly Endpoint[], nodeZone: string | undefined): boolean {
  if (nodeZone === undefined || nodeZone === '') return false;
  let matches = false;
  for (const ep of ready) {
    if (ep.zoneHints === undefined) return false;
    if (ep.zoneHints.includes(nodeZone)) matches = true;
  }
  return matches;
}
