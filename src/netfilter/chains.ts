// The chains we own and the jump rules that hook them into the built-in chains (reference §1.1).
// Pure data: no I/O. Every jump and chain `--cleanup` removes is listed here.

export type Table = 'nat' | 'filter';

export const KUBE_PORTALS_CONTAINER = 'KUBE-PORTALS-CONTAINER';
export const KUBE_PORTALS_HOST = 'KUBE-PORTALS-HOST';
export const KUBE_NODEPORT_CONTAINER = 'KUBE-NODEPORT-CONTAINER';
export const KUBE_NODEPORT_HOST = 'KUBE-NODEPORT-HOST';
export const KUBE_NODEPORT_NON_LOCAL = 'KUBE-NODEPORT-NON-LOCAL';

export type Chain =
  | typeof KUBE_PORTALS_CONTAINER
  | typeof KUBE_PORTALS_HOST
  | typeof KUBE_NODEPORT_CONTAINER
  | typeof KUBE_NODEPORT_HOST
  | typeof KUBE_NODEPORT_NON_LOCAL;

/** Our chains per table, in the order their `:CHAIN` lines are rendered. */
export const CHAINS: { readonly [T in Table]: readonly Chain[] } = {
  nat: [KUBE_PORTALS_CONTAINER, KUBE_PORTALS_HOST, KUBE_NODEPORT_CONTAINER, KUBE_NODEPORT_HOST],
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

/** True for the names of chains we own (used to find our jumps in `iptables-save` output). */
export function isOurChain(name: string): name is Chain {
  return (ALL_CHAINS as readonly { chain: string }[]).some((c) => c.chain === name);
}
