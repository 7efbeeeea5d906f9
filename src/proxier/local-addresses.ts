// This host's addresses, for telling which endpoints and which clients are ourselves (loop-guard.ts,
// relay/own-traffic.ts). Read at each sync: a node address may come and go.
import { networkInterfaces } from 'node:os';

/**
 * Every address of every interface (loopback included), canonical as the kernel writes them, sorted,
 * without IPv6 link-local ones: every pod's veth brings one (so the list would change with each pod on
 * the node), and an endpoint can never be link-local (the API refuses it).
 */
export function readLocalAddresses(): string[] {
  const out: string[] = [];
  for (const list of Object.values(networkInterfaces())) {
    for (const a of list ?? []) if (!a.address.toLowerCase().startsWith('fe80:')) out.push(a.address);
  }
  return out.sort();
}
