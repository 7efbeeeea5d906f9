// Which listeners a service port with the PROXY protocol on needs besides its own, so that each
// connection's header can name the destination the client asked for: REDIRECT and DNAT hide it from a
// Node socket, so every external destination (each externalIP, each LoadBalancer IP, the NodePort)
// gets listeners of its own, and the service port's own listeners then serve ClusterIP traffic alone.
// Pure: no I/O.
import type { ProxyProtocolMode } from '../config/config.ts';
import {
  CLUSTER_IP_DESTINATION,
  LISTENER_DESTINATION,
  NODE_PORT_DESTINATION,
  type OriginalDestination,
} from '../relay/original-destination.ts';
import type { ProxyProtocolVersion } from '../relay/proxy-protocol.ts';
import type { ProxyProtocolSettings } from '../relay/service-context.ts';
import type { ServicePort } from '../state/service-port.ts';
import { VIA_NODE_PORT } from './portal-programmer.ts';

/**
 * One listener of an external destination: `via` (the IP, or `node`) names it in rule comments and the
 * state file (`<key>/to/<via>`, `/local` added for the node-local list's), `list` is what it serves.
 */
export type PortalListenerSpec = {
  readonly key: string;
  readonly via: string;
  readonly list: 'cluster' | 'local';
  readonly destination: OriginalDestination;
};

/** The PROXY protocol version of `sp`: its annotation, else `defaultMode`; TCP service ports only. */
export function proxyProtocolOf(
  sp: ServicePort,
  defaultMode: ProxyProtocolMode,
): ProxyProtocolVersion | undefined {
  if (sp.protocol !== 'TCP') return undefined;
  const mode = sp.proxyProtocol ?? defaultMode;
  return mode === 'off' ? undefined : mode;
}

/** What the headers of `sp`'s connections say of it; undefined without the PROXY protocol. */
export function proxyProtocolSettings(
  sp: ServicePort,
  version: ProxyProtocolVersion | undefined,
): ProxyProtocolSettings | undefined {
  if (version === undefined) return undefined;
  const clusterIPs = { IPv4: '', IPv6: '' };
  for (const ip of sp.clusterIPs) clusterIPs[ip.includes(':') ? 'IPv6' : 'IPv4'] = ip;
  return { version, clusterIPs, port: sp.port, nodePort: sp.nodePort };
}

/**
 * The key of the listener of one external destination in the state file (`ns/name:port/PROTO/to/<via>`,
 * `/local` added for the node-local list's), as previousProxyPorts reads the rules' comments back.
 */
export function portalListenerKey(key: string, via: string, list: 'cluster' | 'local'): string {
  return `${key}/to/${via}${list === 'local' ? '/local' : ''}`;
}

/**
 * The extra listeners of `sp`: none without the PROXY protocol or without rules in front (with
 * --no-iptables a listener's own address is the destination). Each external destination once (an IP
 * both external and LB is one destination), with the cluster-wide list (traffic from the node and its
 * pods always uses it) and, under externalTrafficPolicy Local, the local list for traffic from outside.
 */
export function portalListenerSpecs(
  sp: ServicePort,
  version: ProxyProtocolVersion | undefined,
  portals: boolean,
): PortalListenerSpec[] {
  if (version === undefined || !portals) return [];
  const out: PortalListenerSpec[] = [];
  const add = (via: string, destination: OriginalDestination) => {
    out.push({ key: portalListenerKey(sp.key, via, 'cluster'), via, list: 'cluster', destination });
    if (sp.externalPolicyLocal)
      out.push({ key: portalListenerKey(sp.key, via, 'local'), via, list: 'local', destination });
  };
  const seen = new Set<string>();
  for (const ip of [...sp.externalIPs, ...sp.loadBalancerIPs]) {
    if (seen.has(ip)) continue;
    seen.add(ip);
    add(ip, { kind: 'external-ip', ip });
  }
  if (sp.nodePort !== 0) add(VIA_NODE_PORT, NODE_PORT_DESTINATION);
  return out;
}

/** What a service port's own listeners name as destination: the ClusterIP when rules are in front. */
export function ownListenerDestination(portals: boolean): OriginalDestination {
  return portals ? CLUSTER_IP_DESTINATION : LISTENER_DESTINATION;
}
