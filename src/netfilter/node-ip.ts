// Which IP the host-side DNAT rules send to: the bind address when one is set, else this Node's
// InternalIP (when it is an address of this host), else the address of the interface that carries the
// default route (as the legacy proxier's ChooseHostInterface), per family. Never loopback. Also
// resolves `--nodeport-addresses primary`. Reading /proc and the interface list is injected.
import { readFileSync } from 'node:fs';
import { isIP } from 'node:net';
import { type NetworkInterfaceInfo, networkInterfaces } from 'node:os';
import { NODE_PORT_ADDRESSES_PRIMARY } from '../config/config.ts';
import type { IPFamily } from '../state/service-port.ts';
import type { FamilyConfig } from './netfilter.ts';
import { nodePortDestinations } from './rules.ts';

export type HostInfo = {
  /** Contents of /proc/net/route and /proc/net/ipv6_route ('' when unreadable). */
  route4: string;
  route6: string;
  interfaces: NodeJS.Dict<NetworkInterfaceInfo[]>;
};

export function readHostInfo(): HostInfo {
  const read = (p: string) => {
    try {
      return readFileSync(p, 'utf8');
    } catch {
      return '';
    }
  };
  return {
    route4: read('/proc/net/route'),
    route6: read('/proc/net/ipv6_route'),
    interfaces: networkInterfaces(),
  };
}

/** The interface of the IPv4 default route (destination 00000000, mask 00000000). */
function defaultRouteInterface4(route: string): string | undefined {
  for (const line of route.split('\n').slice(1)) {
    const f = line.trim().split(/\s+/);
    if (f.length >= 8 && f[1] === '00000000' && f[7] === '00000000') return f[0];
  }
  return undefined;
}

/** The interface of the IPv6 default route (::/0), skipping the loopback "unreachable" entries. */
function defaultRouteInterface6(route: string): string | undefined {
  for (const line of route.split('\n')) {
    const f = line.trim().split(/\s+/);
    if (f.length >= 10 && /^0{32}$/.test(f[0]!) && f[1] === '00' && f[9] !== 'lo') return f[9];
  }
  return undefined;
}

function usable(a: NetworkInterfaceInfo, family: IPFamily): boolean {
  if (a.internal) return false;
  if (family === 'IPv4') return a.family === 'IPv4';
  return a.family === 'IPv6' && !a.address.toLowerCase().startsWith('fe80');
}

/**
 * The node IP of `family`: the default-route interface's first global address, else the first global
 * address of any interface; undefined when the host has none (that family is then not programmed).
 */
function chooseHostIP(info: HostInfo, family: IPFamily): string | undefined {
  const ifname =
    family === 'IPv4' ? defaultRouteInterface4(info.route4) : defaultRouteInterface6(info.route6);
  if (ifname !== undefined) {
    const a = (info.interfaces[ifname] ?? []).find((x) => usable(x, family));
    if (a) return a.address;
  }
  for (const list of Object.values(info.interfaces)) {
    const a = (list ?? []).find((x) => usable(x, family));
    if (a) return a.address;
  }
  return undefined;
}

/**
 * The node IP of `family` when the bind address is a wildcard: the Node's InternalIP of that family
 * (kube-proxy's NodeManager.NodeIPs) when it is an address of this host, else chooseHostIP's guess.
 * A Node address the host does not have is not used: DNAT to it would send host traffic away.
 */
export function chooseNodeIP(
  info: HostInfo,
  family: IPFamily,
  nodeInternalIP: string | undefined,
): { ip: string | undefined; ignoredNodeIP?: string } {
  if (nodeInternalIP !== undefined) {
    const local = Object.values(info.interfaces).some((list) =>
      (list ?? []).some((a) => a.address.toLowerCase() === nodeInternalIP.toLowerCase()),
    );
    if (local) return { ip: nodeInternalIP };
    return { ip: chooseHostIP(info, family), ignoredNodeIP: nodeInternalIP };
  }
  return { ip: chooseHostIP(info, family) };
}

/**
 * `--nodeport-addresses` with `primary` resolved as kube-proxy's newProxyServer does: the node IP of each
 * family as a /32 or /128 (a family without one gets none). Any other list is returned as it is.
 */
export function resolveNodePortAddresses(
  configured: readonly string[],
  nodeIPs: Partial<Record<IPFamily, string>>,
): string[] {
  if (configured.length !== 1 || configured[0] !== NODE_PORT_ADDRESSES_PRIMARY) return [...configured];
  const out: string[] = [];
  if (nodeIPs.IPv4 !== undefined) out.push(`${nodeIPs.IPv4}/32`);
  if (nodeIPs.IPv6 !== undefined) out.push(`${nodeIPs.IPv6}/128`);
  return out;
}

/** Every non-loopback address of the host (NodePorts with --nodeport-addresses match these). */
export function localAddresses(info: HostInfo): string[] {
  const out: string[] = [];
  for (const list of Object.values(info.interfaces))
    for (const a of list ?? []) if (!a.internal) out.push(a.address);
  return out;
}

/**
 * Where NodePorts are held open: undefined = every address (one wildcard listener), else the
 * addresses the NodePort rules match. With --nodeport-addresses, a wildcard listener would answer
 * NodePorts on addresses outside the CIDRs. A family without CIDRs matches all its addresses
 * (link-local ones excepted: binding them needs a scope).
 */
export function nodePortClaimHosts(families: readonly FamilyConfig[], info: HostInfo): string[] | undefined {
  const all = Object.values(info.interfaces).flatMap((list) => (list ?? []).map((a) => a.address));
  let restricted = false;
  const out: string[] = [];
  for (const f of families) {
    const v = f.family === 'IPv4' ? 4 : 6;
    const destinations = nodePortDestinations({ ...f, localAddresses: localAddresses(info) });
    if (destinations.length !== 1 || destinations[0] !== undefined) {
      restricted = true;
      out.push(...(destinations as string[]));
    } else out.push(...all.filter((ip) => isIP(ip) === v && !ip.toLowerCase().startsWith('fe80')));
  }
  // Sorted: the proxier re-claims when this list changes, interface order must not count.
  return restricted ? [...new Set(out)].sort() : undefined;
}
