// What the proxy reads from this node's Node object: its InternalIPs, spec.podCIDRs, and whether it is
// about to go away (kube-proxy's NodeManager and ProxyHealthServer.SyncNode). Pure: no I/O.
import type { IPFamily } from '../lib/ip.ts';
import { ipFamilyOf, isValidCIDR } from '../lib/ip.ts';
import type { Node } from './objects.ts';

/** The taint the Cluster Autoscaler puts on a node it is about to delete (kube-proxy's ToBeDeletedTaint). */
const TO_BE_DELETED_TAINT = 'ToBeDeletedByClusterAutoscaler';

/** The Node fields this module reads, beyond the common Node type. */
type NodeFields = {
  spec?: { podCIDR?: unknown; podCIDRs?: unknown; taints?: { key?: unknown }[] };
  status?: { addresses?: { type?: unknown; address?: unknown }[] };
};

/** The first InternalIP of `family` in status.addresses; undefined when the Node has none. */
export function nodeInternalIP(node: Node | undefined, family: IPFamily): string | undefined {
  const addresses = (node as NodeFields | undefined)?.status?.addresses;
  if (!Array.isArray(addresses)) return undefined;
  for (const a of addresses) {
    if (a?.type !== 'InternalIP' || typeof a.address !== 'string') continue;
    if (ipFamilyOf(a.address) === family) return a.address;
  }
  return undefined;
}

/** spec.podCIDRs (else the older spec.podCIDR), valid CIDRs only; [] when none is allocated yet. */
export function nodePodCIDRs(node: Node | undefined): string[] {
  const spec = (node as NodeFields | undefined)?.spec;
  const list = Array.isArray(spec?.podCIDRs) ? spec.podCIDRs : [spec?.podCIDR];
  return list.filter((c): c is string => typeof c === 'string' && isValidCIDR(c));
}

/**
 * kube-proxy's "node eligible": false when the Node is being deleted (metadata.deletionTimestamp) or
 * carries the Cluster Autoscaler's ToBeDeletedByClusterAutoscaler taint, so that /healthz turns 503
 * and cloud load balancers drain the node first.
 */
export function isNodeEligible(node: Node): boolean {
  if (node.metadata?.deletionTimestamp) return false;
  const taints = (node as NodeFields).spec?.taints;
  return !(Array.isArray(taints) && taints.some((t) => t?.key === TO_BE_DELETED_TAINT));
}
