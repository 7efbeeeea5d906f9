// The chains we own and the jump rules that hook them into the built-in chains (reference §1.1, and
// kube-proxy's filter chains for rejects, source ranges and health check ports). Pure data: no I/O.
// Every jump and chain `--cleanup` removes is listed here.

export type Table = 'nat' | 'filter';

export const KUBE_PORTALS_CONTAINER = 'KUBE-PORTALS-CONTAINER';
export const KUBE_PORTALS_HOST = 'KUBE-PORTALS-HOST';
export const KUBE_NODEPORT_CONTAINER = 'KUBE-NODEPORT-CONTAINER';
export const KUBE_NODEPORT_HOST = 'KUBE-NODEPORT-HOST';
export const KUBE_NODEPORT_NON_LOCAL = 'KUBE-NODEPORT-NON-LOCAL';
// Filter chains under kube-proxy's names (pkg/proxy/iptables), so `iptables-save` reads as it does there.
/** REJECT/DROP for ClusterIPs whose traffic has no endpoint (FORWARD, OUTPUT). */
export const KUBE_SERVICES = 'KUBE-SERVICES';
/** REJECT/DROP for externalIPs, LB IPs and NodePorts whose traffic has no endpoint (INPUT, FORWARD). */
export const KUBE_EXTERNAL_SERVICES = 'KUBE-EXTERNAL-SERVICES';
/** DROP for LB IP traffic that loadBalancerSourceRanges kept from being NATed (INPUT, FORWARD, OUTPUT). */
export const KUBE_PROXY_FIREWALL = 'KUBE-PROXY-FIREWALL';
/** ACCEPT for health check node ports (INPUT). */
export const KUBE_NODEPORTS = 'KUBE-NODEPORTS';

/** Our filter chains. */
export type FilterChain =
  | typeof KUBE_NODEPORT_NON_LOCAL
  | typeof KUBE_SERVICES
  | typeof KUBE_EXTERNAL_SERVICES
  | typeof KUBE_PROXY_FIREWALL
  | typeof KUBE_NODEPORTS;

/** The two portal chains: each dispatches to PORTAL_SHARDS shard chains by the destination's last bits. */
export type PortalChain = typeof KUBE_PORTALS_CONTAINER | typeof KUBE_PORTALS_HOST;

/** One shard of a portal chain, e.g. `KUBE-PORTALS-CONTAINER-1F`. */
export type PortalShardChain = `${PortalChain}-${string}`;

export type Chain =
  | PortalChain
  | PortalShardChain
  | typeof KUBE_NODEPORT_CONTAINER
  | typeof KUBE_NODEPORT_HOST
  | FilterChain;

/**
 * How many shard chains each portal chain has. A portal rule lives in the shard of its destination IP's
 * lowest 5 bits, and the portal chain jumps to shard k for `-d 0.0.0.k/0.0.0.31` (`::k/::1f`): at
 * 10,000 services a new connection walks 32 + ~300 rules instead of 10,000, and adding or deleting one
 * rule costs iptables-nft a read of one small chain instead of the whole list (~1 ms instead of
 * 30–300 ms).
 */
export const PORTAL_SHARDS = 32;

/** The shard chain of `chain` that holds the portal rules for destinations in shard `k`. */
export function portalShardChain(chain: PortalChain, k: number): PortalShardChain {
  return `${chain}-${k.toString(16).toUpperCase().padStart(2, '0')}`;
}

/** The shard of a destination IP (v4 or v6, any spelling): its lowest 5 bits. */
export function portalShard(ip: string): number {
  const last = ip.slice(ip.lastIndexOf(ip.includes('.') ? '.' : ':') + 1);
  const value = ip.includes('.') ? Number(last) : Number.parseInt(last === '' ? '0' : last, 16);
  return value & (PORTAL_SHARDS - 1);
}

const SHARDS = [...Array(PORTAL_SHARDS).keys()];

/**
 * The ports listeners get their ports from (the proxy port range; `size` 0: unknown, the kernel picks).
 * KUBE-NODEPORT-NON-LOCAL accepts DNATed traffic to all of them with one rule per protocol (rules.ts).
 */
export type ListenerPorts = { readonly base: number; readonly size: number };

/** Our chains per table, in the order their `:CHAIN` lines are rendered. */
export const CHAINS: { readonly [T in Table]: readonly Chain[] } = {
  nat: [
    KUBE_PORTALS_CONTAINER,
    KUBE_PORTALS_HOST,
    KUBE_NODEPORT_CONTAINER,
    KUBE_NODEPORT_HOST,
    ...SHARDS.map((k) => portalShardChain(KUBE_PORTALS_CONTAINER, k)),
    ...SHARDS.map((k) => portalShardChain(KUBE_PORTALS_HOST, k)),
  ],
  filter: [
    KUBE_NODEPORT_NON_LOCAL,
    KUBE_SERVICES,
    KUBE_EXTERNAL_SERVICES,
    KUBE_PROXY_FIREWALL,
    KUBE_NODEPORTS,
  ],
};

/** Every chain we own, with its table. */
export const ALL_CHAINS: readonly { readonly table: Table; readonly chain: Chain }[] = [
  ...CHAINS.nat.map((chain) => ({ table: 'nat' as const, chain })),
  ...CHAINS.filter.map((chain) => ({ table: 'filter' as const, chain })),
];

export type Jump = {
  readonly table: Table;
  /** The built-in chain the jump sits in. */
  readonly from: 'PREROUTING' | 'OUTPUT' | 'INPUT' | 'FORWARD';
  readonly to: Chain;
  /** prepend = `-I from 1` (portals must be checked before NodePorts), append = `-A from`. */
  readonly position: 'prepend' | 'append';
  /** Match arguments between the chain and `-j`, exactly as the legacy proxier (or kube-proxy) wrote them. */
  readonly args: readonly string[];
};

const PORTALS_COMMENT = 'handle ClusterIPs; NOTE: this must be before the NodePort rules';
const NODEPORTS_COMMENT = 'handle service NodePorts; NOTE: this must be the last rule in the chain';
const NON_LOCAL_COMMENT = 'Ensure that non-local NodePort traffic can flow';
const NEW = ['-m', 'conntrack', '--ctstate', 'NEW'];

/** kube-proxy's filter jump: new connections only, then its comment. */
function filterJump(from: Jump['from'], to: FilterChain, comment: string, newOnly = true): Jump {
  const args = [...(newOnly ? NEW : []), '-m', 'comment', '--comment', comment];
  return { table: 'filter', from, to, position: 'prepend', args };
}

/**
 * Our jumps, in the order a restore inserts them. Each prepend goes to position 1, so in each filter
 * built-in chain the last listed ends up first: INPUT reads KUBE-PROXY-FIREWALL, KUBE-EXTERNAL-SERVICES
 * (the DROP/REJECTs), then KUBE-NODEPORTS and KUBE-NODEPORT-NON-LOCAL (the ACCEPTs); FORWARD
 * KUBE-PROXY-FIREWALL, KUBE-SERVICES, KUBE-EXTERNAL-SERVICES; OUTPUT KUBE-PROXY-FIREWALL, KUBE-SERVICES.
 * The order is belt and braces: the ACCEPTs match only packets our NAT rules sent to a proxy port
 * (`--ctstate DNAT`) or a health check port, the DROP/REJECTs only packets that kept a Service
 * destination (nothing NATed them), so a jump re-inserted alone at position 1 lets nothing through.
 */
export const JUMPS: readonly Jump[] = [
  {
    table: 'nat',
    from: 'OUTPUT',
    to: KUBE_PORTALS_HOST,
    position: 'prepend',
    args: ['-m', 'comment', '--comment', PORTALS_COMMENT],
  },
  {
    table: 'nat',
    from: 'PREROUTING',
    to: KUBE_PORTALS_CONTAINER,
    position: 'prepend',
    args: ['-m', 'comment', '--comment', PORTALS_COMMENT],
  },
  {
    table: 'nat',
    from: 'OUTPUT',
    to: KUBE_NODEPORT_HOST,
    position: 'append',
    args: ['-m', 'addrtype', '--dst-type', 'LOCAL', '-m', 'comment', '--comment', NODEPORTS_COMMENT],
  },
  {
    table: 'nat',
    from: 'PREROUTING',
    to: KUBE_NODEPORT_CONTAINER,
    position: 'append',
    args: ['-m', 'addrtype', '--dst-type', 'LOCAL', '-m', 'comment', '--comment', NODEPORTS_COMMENT],
  },
  filterJump('INPUT', KUBE_NODEPORT_NON_LOCAL, NON_LOCAL_COMMENT, false),
  filterJump('INPUT', KUBE_NODEPORTS, 'kubernetes health check service ports', false),
  filterJump('INPUT', KUBE_EXTERNAL_SERVICES, 'kubernetes externally-visible service portals'),
  filterJump('FORWARD', KUBE_EXTERNAL_SERVICES, 'kubernetes externally-visible service portals'),
  filterJump('FORWARD', KUBE_SERVICES, 'kubernetes service portals'),
  filterJump('OUTPUT', KUBE_SERVICES, 'kubernetes service portals'),
  filterJump('INPUT', KUBE_PROXY_FIREWALL, 'kubernetes load balancer firewall'),
  filterJump('FORWARD', KUBE_PROXY_FIREWALL, 'kubernetes load balancer firewall'),
  filterJump('OUTPUT', KUBE_PROXY_FIREWALL, 'kubernetes load balancer firewall'),
];

const OUR_CHAINS: { readonly [T in Table]: ReadonlySet<string> } = {
  nat: new Set(CHAINS.nat),
  filter: new Set(CHAINS.filter),
};

/**
 * True for the names of chains we own in `table` (to find our jumps and chains in `iptables-save`
 * output), including portal shard chains of another shard count than ours. Without a table: ours in
 * either. Per table because the filter chains carry kube-proxy's names: nat `KUBE-SERVICES` and
 * `KUBE-NODEPORTS` belong to an iptables-mode kube-proxy, never to us.
 */
export function isOurChain(name: string, table?: Table): name is Chain {
  if (table !== 'nat' && OUR_CHAINS.filter.has(name)) return true;
  if (table === 'filter') return false;
  return OUR_CHAINS.nat.has(name) || /^KUBE-PORTALS-(CONTAINER|HOST)-[0-9A-F]{2}$/.test(name);
}
