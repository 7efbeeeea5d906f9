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

const NO_ENDPOINTS: readonly Endpoint[] = Object.freeze([]);

const EMPTY_SERVICE_PORT_ENDPOINTS: ServicePortEndpoints = {
  all: NO_ENDPOINTS,
  cluster: NO_ENDPOINTS,
  local: NO_ENDPOINTS,
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
 * A list that keeps every endpoint of the one it is taken from is that list, not a copy: with every
 * endpoint ready, `all` and `cluster` are `endpoints` itself (the slice cache's).
 */
export function categorizeEndpoints(
  endpoints: readonly Endpoint[],
  policy: EndpointPolicy,
  node: NodeTopology,
): ServicePortEndpoints {
  const hasV4 = policy.clusterIPs.some((ip) => !ip.includes(':'));
  const hasV6 = policy.clusterIPs.some((ip) => ip.includes(':'));
  const all = keep(endpoints, (ep) => (ep.family === 'IPv4' ? hasV4 : hasV6));
  if (all.length === 0) return EMPTY_SERVICE_PORT_ENDPOINTS;

  const ready = keep(all, isReady);
  let cluster: readonly Endpoint[] = NO_ENDPOINTS;
  if (usesClusterEndpoints(policy as ServicePort)) {
    const mode = topologyMode(ready, node);
    cluster =
      mode === 'PreferSameNode'
        ? keep(ready, (ep) => ep.nodeHints!.includes(node.nodeName))
        : mode === 'PreferSameZone'
          ? keep(ready, (ep) => ep.zoneHints!.includes(node.zone!))
          : ready;
    if (cluster.length === 0) cluster = keep(all, isServingTerminating);
  }

  const localReady = keep(ready, isLocal);
  let local: readonly Endpoint[] = NO_ENDPOINTS;
  if (usesLocalEndpoints(policy as ServicePort))
    local = localReady.length > 0 ? localReady : keep(all, (ep) => ep.isLocal && isServingTerminating(ep));

  return {
    all,
    cluster,
    local,
    hasAnyEndpoints: ready.length > 0 || all.some(isServingTerminating),
    localReadyCount: localReady.length === 0 ? 0 : new Set(localReady.map((ep) => ep.ip)).size,
  };
}

/**
 * The endpoints of `list` that pass `test`: `list` itself when all do, else a copy of its length
 * (filter leaves room for 17 or more: 190 bytes for a list of two, per service port and list).
 */
function keep(list: readonly Endpoint[], test: (ep: Endpoint) => boolean): readonly Endpoint[] {
  let kept = 0;
  for (const ep of list) if (test(ep)) kept++;
  if (kept === list.length) return list;
  if (kept === 0) return NO_ENDPOINTS;
  return list.filter(test).slice();
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
  return keep(list, (ep) => ep.family === family);
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

/** Same key (so IP, port and family) and same conditions, node and hints. */
export function sameEndpoint(a: Endpoint, b: Endpoint): boolean {
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

function isReady(ep: Endpoint): boolean {
  return ep.ready;
}

function isLocal(ep: Endpoint): boolean {
  return ep.isLocal;
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
