// This host's addresses, for telling which endpoints and which clients are ourselves (loop-guard.ts,
// relay/own-traffic.ts). Read at each sync: a node address may come and go.
import { networkInterfaces } from 'node:os';

/** Every address of every interface (loopback included), canonical as the kernel writes them. */
export function readLocalAddresses(): string[] {
  const out: string[] = [];
  for (const list of Object.values(networkInterfaces())) {
    // A link-local IPv6 address carries its zone (`fe80::1%eth0`); endpoints never do.
    for (const a of list ?? []) out.push(a.address.split('%')[0]!);
  }
  return out;
}
