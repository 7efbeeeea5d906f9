// Which endpoints of a service port receive which traffic: kube-proxy's CategorizeEndpoints (topology.go)
// plus the traffic-policy mapping its proxiers apply. Pure: no I/O.
import { sameList } from '../lib/lists.ts';
import type { Endpoint, ServicePortEndpoints } from './endpoint.ts';
import type { IPFamily, ServicePort } from './service-port.ts';
import { usesClusterEndpoints, usesLocalEndpoints } from './service-port.ts';

/** The fields of a ServicePort that decide how its endpoints are used. */
export type EndpointPolicy = Pick<
  ServicePort,
  'clusterIPs' | 'internalPolicyLocal' | 'externalPolicyLocal' | 'externallyAccessible'
>;

/** Where this node is, for topology: its name (node hints) and zone label (zone hints). */
export type NodeTopology = { readonly nodeName: string; readonly zone: string | undefined };

const EMPTY_SERVICE_PORT_ENDPOINTS: ServicePortEndpoints = {
  all: [],
  cluster: [],
  local: [],
  hasAnyEndpoints: false,
  localReadyCount: 0,
};

/**
 * Splits a service port's merged endpoints (sorted by key) into kube-proxy's lists:
 * - only endpoints of a family the service has a cluster IP for are used (`all`);
 * - cluster list (when the service port uses it): ready endpoints available for the topology mode
 *   (node hints, else zone hints, see topologyMode); if none, the serving and terminating ones
 *   (topology ignored);
 * - local list (when a policy is Local): local ready endpoints, else local serving+terminating ones;
 * - hasAnyEndpoints: some endpoint anywhere is ready or serving+terminating.
 */
export function categorizeEndpoints(
  endpoints: readonly Endpoint[],
  policy: EndpointPolicy,
  node: NodeTopology,
): ServicePortEndpoints {
  const hasV4 = policy.clusterIPs.some((ip) => !ip.includes(':'));
  const hasV6 = policy.clusterIPs.some((ip) => ip.includes(':'));
  const all = endpoints.filter((ep) => (ep.family === 'IPv4' ? hasV4 : hasV6));
  if (all.length === 0) return EMPTY_SERVICE_PORT_ENDPOINTS;

  const ready = all.filter((ep) => ep.ready);
  let cluster: readonly Endpoint[] = [];
  if (usesClusterEndpoints(policy as ServicePort)) {
    const mode = topologyMode(ready, node);
    cluster =
      mode === 'PreferSameNode'
        ? ready.filter((ep) => ep.nodeHints!.includes(node.nodeName))
        : mode === 'PreferSameZone'
          ? ready.filter((ep) => ep.zoneHints!.includes(node.zone!))
          : ready;
    if (cluster.length === 0) cluster = all.filter(isServingTerminating);
  }

  const localReady = ready.filter((ep) => ep.isLocal);
  let local: readonly Endpoint[] = [];
  if (usesLocalEndpoints(policy as ServicePort))
    local = localReady.length > 0 ? localReady : all.filter((ep) => ep.isLocal && isServingTerminating(ep));

  return {
    all,
    cluster,
    local,
    hasAnyEndpoints: ready.length > 0 || all.some(isServingTerminating),
    localReadyCount: new Set(localReady.map((ep) => ep.ip)).size,
  };
}

/** The endpoints ClusterIP traffic goes to: the local list under internalTrafficPolicy Local. */
export function internalEndpoints(
  sp: Pick<ServicePort, 'internalPolicyLocal'>,
  eps: ServicePortEndpoints,
): readonly Endpoint[] {
  return sp.internalPolicyLocal ? eps.local : eps.cluster;
}

/** The endpoints NodePort, externalIP and LB traffic from outside goes to (externalTrafficPolicy). */
export function externalEndpoints(
  sp: Pick<ServicePort, 'externalPolicyLocal'>,
  eps: ServicePortEndpoints,
): readonly Endpoint[] {
  return sp.externalPolicyLocal ? eps.local : eps.cluster;
}

/** The endpoints of `list` of one family (a dual-stack service's traffic stays in its family). */
export function endpointsOfFamily(list: readonly Endpoint[], family: IPFamily): readonly Endpoint[] {
  let mixed = false;
  for (const ep of list) if (ep.family !== family) mixed = true;
  return mixed ? list.filter((ep) => ep.family === family) : list;
}

/** True when the two values list equal endpoints (every field) in the same order. */
export function sameServicePortEndpoints(a: ServicePortEndpoints, b: ServicePortEndpoints): boolean {
  return (
    a === b ||
    (a.localReadyCount === b.localReadyCount &&
      a.hasAnyEndpoints === b.hasAnyEndpoints &&
      sameEndpoints(a.all, b.all) &&
      sameEndpoints(a.cluster, b.cluster) &&
      sameEndpoints(a.local, b.local))
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
  return (
    a.key === b.key &&
    a.ready === b.ready &&
    a.serving === b.serving &&
    a.terminating === b.terminating &&
    a.isLocal === b.isLocal &&
    a.nodeName === b.nodeName &&
    sameHints(a.zoneHints, b.zoneHints) &&
    sameHints(a.nodeHints, b.nodeHints)
  );
}

/** True when both are undefined or list the same names in the same order. */
export function sameHints(x: readonly string[] | undefined, y: readonly string[] | undefined): boolean {
  if (x === undefined || y === undefined) return x === y;
  return sameList(x, y);
}

function isServingTerminating(ep: Endpoint): boolean {
  return ep.serving && ep.terminating;
}

type TopologyMode = 'PreferSameNode' | 'PreferSameZone' | undefined;

/**
 * kube-proxy's topologyModeFromHints, over the ready endpoints: PreferSameNode when every one has
 * node hints and one names this node; else PreferSameZone when every one has zone hints and one names
 * this node's zone; else none. All or nothing: a mode, once chosen, has no fallback within it.
 */
function topologyMode(ready: readonly Endpoint[], node: NodeTopology): TopologyMode {
  if (ready.length === 0) return undefined;
  let allNodeHints = true;
  let forNode = false;
  let allZoneHints = true;
  let forZone = false;
  const zone = node.zone ?? '';
  for (const ep of ready) {
    if (ep.nodeHints === undefined) allNodeHints = false;
    else if (ep.nodeHints.includes(node.nodeName)) forNode = true;
    if (ep.zoneHints === undefined) allZoneHints = false;
    else if (zone !== '' && ep.zoneHints.includes(zone)) forZone = true;
  }
  if (allNodeHints && forNode && node.nodeName !== '') return 'PreferSameNode';
  if (allZoneHints && forZone) return 'PreferSameZone';
  return undefined;
}
