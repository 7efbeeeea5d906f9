// Where a client connected to before NAT sent it to one of our listeners: what a PROXY protocol
// header tells the endpoint. REDIRECT and DNAT rewrite the destination, and a Node socket cannot ask
// for the original one (SO_ORIGINAL_DST), so each portal whose address cannot be told otherwise gets
// a listener of its own, and the listener knows which portal it serves. Pure: no I/O.
import type { IPFamily } from '../lib/ip.ts';
import type { ProxyProtocolSettings } from './service-context.ts';

/**
 * What a listener knows of its clients' destination:
 * - `listener`: nothing NATs in front of it (--no-iptables, a NodePort claim): its own address and port;
 * - `cluster-ip`: the rules send it ClusterIP traffic only: the ClusterIP of the client's family;
 * - `external-ip`: one externalIP or LoadBalancer IP (`ip`), on the service port;
 * - `node-port`: NodePort traffic: the node address the NAT left as destination (REDIRECT: the
 *   primary address of the interface the packet came in on; DNAT from the node: the node IP), on the
 *   NodePort. Exact when the client used that address; else the best true answer there is.
 */
export type OriginalDestination =
  | { readonly kind: 'listener' }
  | { readonly kind: 'cluster-ip' }
  | { readonly kind: 'external-ip'; readonly ip: string }
  | { readonly kind: 'node-port' };

export const LISTENER_DESTINATION: OriginalDestination = { kind: 'listener' };
export const CLUSTER_IP_DESTINATION: OriginalDestination = { kind: 'cluster-ip' };
export const NODE_PORT_DESTINATION: OriginalDestination = { kind: 'node-port' };

/** The address and port a client of `family` connected to; `local*` are the accepted socket's own. */
export function originalDestination(
  destination: OriginalDestination,
  settings: ProxyProtocolSettings,
  family: IPFamily,
  localAddress: string,
  localPort: number,
): { address: string; port: number } {
  switch (destination.kind) {
    case 'cluster-ip':
      return { address: settings.clusterIPs[family], port: settings.port };
    case 'external-ip':
      return { address: destination.ip, port: settings.port };
    case 'node-port':
      return { address: localAddress, port: settings.nodePort };
    default:
      return { address: localAddress, port: localPort };
  }
}
