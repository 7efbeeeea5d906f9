// The chains we own and the jump rules that hook them into the built-in chains (reference §1.1).
// Pure data: no I/O. Every jump and chain `--cleanup` removes is listed here.

export type Table = 'nat' | 'filter';

export const KUBE_PORTALS_CONTAINER = 'KUBE-PORTALS-CONTAINER';
export const KUBE_PORTALS_HOST = 'KUBE-PORTALS-HOST';
export const KUBE_NODEPORT_CONTAINER = 'KUBE-NODEPORT-CONTAINER';
export const KUBE_NODEPORT_HOST = 'KUBE-NODEPORT-HOST';
export const KUBE_NODEPORT_NON_LOCAL = 'KUBE-NODEPORT-NON-LOCAL';

/** The two portal chains: each dispatches to PORTAL_SHARDS shard chains by the destination's last bits. */
export type PortalChain = typeof KUBE_PORTALS_CONTAINER | typeof KUBE_PORTALS_HOST;

/** One shard of a portal chain, e.g. `KUBE-PORTALS-CONTAINER-1F`. */
export type PortalShardChain = `${PortalChain}-${string}`;

export type Chain =
  | PortalChain
  | PortalShardChain
  | typeof KUBE_NODEPORT_CONTAINER
  | typeof KUBE_NODEPORT_HOST
  | typeof KUBE_NODEPORT_NON_LOCAL;

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
  filter: [KUBE_NODEPORT_NON_LOCAL],
};

/** Every chain we own, with its table. */
export const ALL_CHAINS: readonly { readonly table: Table; readonly chain: Chain }[] = [
  ...CHAINS.nat.map((chain) => ({ table: 'nat' as const, chain })),
  ...CHAINS.filter.map((chain) => ({ table: 'filter' as const, chain })),
];

export type Jump = {
  readonly table: Table;
  /** The built-in chain the jump sits in. */
  readonly from: 'PREROUTING' | 'OUTPUT' | 'INPUT';
  readonly to: Chain;
  /** prepend = `-I from 1` (portals must be checked before NodePorts), append = `-A from`. */
  readonly position: 'prepend' | 'append';
  /** Match arguments between the chain and `-j`, exactly as the legacy proxier wrote them. */
  readonly args: readonly string[];
};

const PORTALS_COMMENT = 'handle ClusterIPs; NOTE: this must be before the NodePort rules';
const NODEPORTS_COMMENT = 'handle service NodePorts; NOTE: this must be the last rule in the chain';
const NON_LOCAL_COMMENT = 'Ensure that non-local NodePort traffic can flow';

/** The five jumps, in the order `--cleanup` deletes them (reference §1.7). */
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
  {
    table: 'filter',
    from: 'INPUT',
    to: KUBE_NODEPORT_NON_LOCAL,
    position: 'prepend',
    args: ['-m', 'comment', '--comment', NON_LOCAL_COMMENT],
  },
];

const OUR_CHAIN_NAMES: ReadonlySet<string> = new Set(ALL_CHAINS.map((c) => c.chain));

/**
 * True for the names of chains we own (to find our jumps and chains in `iptables-save` output),
 * including portal shard chains of another shard count than ours.
 */
export function isOurChain(name: string): name is Chain {
  return OUR_CHAIN_NAMES.has(name) || /^KUBE-PORTALS-(CONTAINER|HOST)-[0-9A-F]{2}$/.test(name);
}
