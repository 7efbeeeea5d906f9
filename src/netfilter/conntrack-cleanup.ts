// Which UDP conntrack entries a change of one service port's portals leaves stale. Conntrack decides
// NAT once per flow, so an entry outlives the rules that made it: a UDP client that keeps sending keeps
// its old NAT (an old proxy port, or none at all) for as long as it sends. Pure: no I/O.

import type { PortalSpec } from '../proxier/portal-programmer.ts';
import type { IPFamily } from '../state/service-port.ts';
import { type PortalTarget, portalTargets } from './rules.ts';

/**
 * One `conntrack -D -p udp` to run: the flows whose original destination is `origDst`:`origDstPort`
 * (a ClusterIP, externalIP or LB IP), or, without `origDst`, any flow to `origDstPort` (a NodePort,
 * which the rules match on every local address; conntrack cannot filter on "local", so this is
 * kube-proxy's ClearEntriesForPort: every UDP flow to that port).
 */
export type ConntrackDeletion = {
  readonly family: IPFamily;
  readonly protocol: 'udp';
  readonly origDst?: string;
  readonly origDstPort?: number;
};

/** Where new flows to a destination are NATed: proxy ports, or `-` (REJECT/DROP: not NATed). */
type Targets = { readonly internal: string; readonly external: string };

const NONE = '-';

/**
 * The conntrack deletions after one UDP service port went from `previous` to `next` portals (either
 * undefined: the service port did not exist / no longer exists), for the destinations of `family`.
 * A destination's entries are deleted when the NAT its new flows get changed, treating "absent" as
 * "not NATed":
 * - removed (service port, externalIP, LB IP, NodePort gone): entries would keep reaching a proxy
 *   port that is gone or reused (kube-proxy's DeletedUDPClusterIPs, extended to every destination);
 * - not NATed → a proxy port (new, or no endpoints → some): entries made while the traffic was
 *   REJECTed or not captured black-hole the flow (kube-proxy's NewlyActiveUDPServices);
 * - a proxy port → not NATed (endpoints → none): the client gets the REJECT's ICMP, as kube-proxy,
 *   whose CleanStaleEntries drops entries that reach no serving endpoint;
 * - one proxy port → another (a new listener, a Local policy's second listener).
 * TCP service ports give nothing (kube-proxy leaves TCP to the endpoints' resets).
 */
export function conntrackDeletions(
  previous: PortalSpec | undefined,
  next: PortalSpec | undefined,
  family: IPFamily,
): ConntrackDeletion[] {
  if (previous === next) return [];
  const before = destinations(previous, family);
  const after = destinations(next, family);
  const out: ConntrackDeletion[] = [];
  for (const [key, d] of before) {
    if (after.get(key)?.target !== d.target) out.push(d.deletion);
  }
  for (const [key, d] of after) {
    if (!before.has(key) && d.target !== NONE) out.push(d.deletion);
  }
  return out;
}

type Destination = { readonly deletion: ConntrackDeletion; readonly target: string };

/** Every destination of a UDP service port in `family`, by `ip|port` or `|nodePort`. */
function destinations(spec: PortalSpec | undefined, family: IPFamily): Map<string, Destination> {
  const out = new Map<string, Destination>();
  if (spec === undefined || spec.servicePort.protocol !== 'UDP') return out;
  const sp = spec.servicePort;
  const clusterIPs = sp.clusterIPs.filter((ip) => familyOf(ip) === family);
  // A service port without a ClusterIP of this family has no rules in it (NodePorts included).
  if (clusterIPs.length === 0) return out;
  const { internal, external } = targets(spec, family);
  const add = (ip: string, port: number, target: string) => {
    const key = `${ip}|${port}`;
    if (!out.has(key))
      out.set(key, { deletion: { family, protocol: 'udp', origDst: ip, origDstPort: port }, target });
  };
  for (const ip of clusterIPs) add(ip, sp.port, internal);
  for (const ip of sp.externalIPs) if (familyOf(ip) === family) add(ip, sp.port, external);
  for (const ip of sp.loadBalancerIPs) if (familyOf(ip) === family) add(ip, sp.port, external);
  if (sp.nodePort !== 0)
    out.set(`|${sp.nodePort}`, {
      deletion: { family, protocol: 'udp', origDstPort: sp.nodePort },
      target: external,
    });
  return out;
}

/**
 * Where new flows are NATed, as the rules decide it (portalTargets): ClusterIP traffic to `internal`;
 * external traffic to `external` from outside and to the short-circuit target from this node (the
 * same listener unless externalTrafficPolicy is Local). `-`: not NATed (REJECT / DROP).
 */
function targets(spec: PortalSpec, family: IPFamily): Targets {
  const t = portalTargets(spec, family);
  const port = (target: PortalTarget | undefined) => (target === undefined ? NONE : String(target.port));
  const external =
    t.external === undefined && t.shortCircuit === undefined
      ? NONE
      : `${port(t.external)}/${port(t.shortCircuit)}`;
  return { internal: port(t.internal), external };
}

function familyOf(ip: string): IPFamily {
  return ip.includes(':') ? 'IPv6' : 'IPv4';
}
