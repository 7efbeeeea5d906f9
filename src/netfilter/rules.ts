// Renders the portal rules (reference §1.3) as iptables-restore input: full texts and one-service deltas.
// Pure: no I/O, no clock. Same input, same bytes.
import { BlockList, isIP } from 'node:net';
import type { IPFamily, ServicePort, ServicePortKey } from '../state/service-port.ts';
import {
  CHAINS,
  type Chain,
  type Jump,
  KUBE_NODEPORT_CONTAINER,
  KUBE_NODEPORT_HOST,
  KUBE_NODEPORT_NON_LOCAL,
  KUBE_PORTALS_CONTAINER,
  KUBE_PORTALS_HOST,
  PORTAL_SHARDS,
  type PortalChain,
  portalShard,
  portalShardChain,
  type Table,
} from './chains.ts';

/** A service port with a running listener on `proxyPort`. */
export type PortalSpec = { readonly servicePort: ServicePort; readonly proxyPort: number };

/** Everything besides the portals that decides the rules of one family. */
export type RuleContext = {
  readonly family: IPFamily;
  /** `0.0.0.0` or `::` (REDIRECT on the container side), or a specific IP of this family (DNAT to it). */
  readonly bindAddress: string;
  /** Node IP of this family for host-side DNAT when bindAddress is unspecified; never loopback. */
  readonly hostIP: string;
  /** --nodeport-addresses CIDRs; none of this family (or a /0) = NodePorts on every local address. */
  readonly nodePortAddresses: readonly string[];
  /** The node's addresses; those of this family inside nodePortAddresses get one NodePort rule each. */
  readonly localAddresses: readonly string[];
};

export type RuleInput = RuleContext & { readonly portals: readonly PortalSpec[] };

/** Restore input per table; an empty string means "nothing for this table". */
export type RestoreText = { readonly nat: string; readonly filter: string };

/** One rule: its chain and the arguments after `-A <chain>`, already quoted for a restore line. */
export type Rule = { readonly table: Table; readonly chain: Chain; readonly spec: string };

export type PortalSet = readonly PortalSpec[] | ReadonlyMap<ServicePortKey, PortalSpec>;

/** iptables' comment match holds at most 255 bytes (XT_MAX_COMMENT_LEN 256 with the NUL). */
export const MAX_COMMENT_LENGTH = 255;

/**
 * Makes a service port name safe as one restore-line token: anything outside the characters a valid
 * `ns/name:port` can hold becomes `_` (so no quote, space, newline or `#` reaches the line), cut to 255.
 */
export function sanitizeComment(text: string): string {
  const s = text.replace(/[^A-Za-z0-9._:/-]/g, '_').slice(0, MAX_COMMENT_LENGTH);
  return s === '' ? '_' : s;
}

/** Joins the two tables into the single text one `iptables-restore` run reads. */
export function restoreText(text: RestoreText): string {
  return text.nat + text.filter;
}

/**
 * The rules of one portal in this family, in `openPortal` order (ClusterIP, externalIPs, LB IPs,
 * NodePort). A service port without a cluster IP of this family renders nothing here (its NodePort is
 * served by the family of its cluster IP, as kube-proxy's per-family proxiers do).
 */
export function portalRules(spec: PortalSpec, ctx: RuleContext): Rule[] {
  const sp = spec.servicePort;
  const { proxyPort } = spec;
  if (!validPort(proxyPort) || !validPort(sp.port)) return [];
  if (sp.protocol !== 'TCP' && sp.protocol !== 'UDP') return [];
  const v = ipVersion(ctx.family);
  const clusterIPs = sp.clusterIPs.filter((ip) => isIP(ip) === v);
  if (clusterIPs.length === 0) return [];

  const proto = sp.protocol === 'TCP' ? 'tcp' : 'udp';
  const comment = `-m comment --comment ${sanitizeComment(sp.name)}`;
  const match = (port: number) => `${comment} -p ${proto} -m ${proto} --dport ${port}`;
  const dst = (ip: string) => `-d ${ip}/${v === 4 ? 32 : 128}`;
  const bindIP = specificBindIP(ctx);
  const containerTarget =
    bindIP === undefined
      ? `-j REDIRECT --to-ports ${proxyPort}`
      : `-j DNAT --to-destination ${joinHostPort(bindIP, proxyPort)}`;
  const hostTarget = `-j DNAT --to-destination ${joinHostPort(bindIP ?? hostIPOf(ctx), proxyPort)}`;

  const rules: Rule[] = [];
  const nat = (chain: Chain, spec: string) => rules.push({ table: 'nat', chain, spec });
  // Portal rules live in the shard chain of their destination (see PORTAL_SHARDS).
  const portal = (chain: PortalChain, ip: string, spec: string) =>
    nat(portalShardChain(chain, portalShard(ip)), spec);
  const portalIP = (ip: string) => {
    portal(KUBE_PORTALS_CONTAINER, ip, `${match(sp.port)} ${dst(ip)} ${containerTarget}`);
    portal(KUBE_PORTALS_HOST, ip, `${match(sp.port)} ${dst(ip)} ${hostTarget}`);
  };
  for (const ip of clusterIPs) portalIP(ip);
  for (const ip of sp.externalIPs) {
    if (isIP(ip) !== v) continue;
    // From outside through a physical interface, then from pods and host to an externalIP the node owns;
    // host traffic to a non-local externalIP is not captured (as legacy).
    portal(
      KUBE_PORTALS_CONTAINER,
      ip,
      `${match(sp.port)} ${dst(ip)} -m physdev ! --physdev-is-in ${containerTarget}`,
    );
    portal(
      KUBE_PORTALS_CONTAINER,
      ip,
      `${match(sp.port)} ${dst(ip)} -m addrtype --dst-type LOCAL ${containerTarget}`,
    );
    portal(KUBE_PORTALS_HOST, ip, `${match(sp.port)} ${dst(ip)} -m addrtype --dst-type LOCAL ${hostTarget}`);
  }
  for (const ip of sp.loadBalancerIPs) if (isIP(ip) === v) portalIP(ip);

  if (sp.nodePort !== 0 && validPort(sp.nodePort)) {
    const destinations = nodePortDestinations(ctx);
    for (const ip of destinations) {
      const m = ip === undefined ? match(sp.nodePort) : `${match(sp.nodePort)} ${dst(ip)}`;
      nat(KUBE_NODEPORT_CONTAINER, `${m} ${containerTarget}`);
      nat(KUBE_NODEPORT_HOST, `${m} ${hostTarget}`);
    }
    // Matches the proxy port: PREROUTING has already rewritten the destination when INPUT sees it.
    if (destinations.length > 0)
      rules.push({
        table: 'filter',
        chain: KUBE_NODEPORT_NON_LOCAL,
        spec: `${match(proxyPort)} -m state --state NEW -j ACCEPT`,
      });
  }
  return rules;
}

/**
 * The rules of the two portal chains: one jump per shard, matching the destination's lowest bits
 * (`-d 0.0.0.k/0.0.0.31`; `-d ::k/::1f`). Fixed for a family, so a delta never touches them.
 */
export function dispatchRules(family: IPFamily): Rule[] {
  const rules: Rule[] = [];
  const mask = PORTAL_SHARDS - 1;
  for (const chain of [KUBE_PORTALS_CONTAINER, KUBE_PORTALS_HOST] as const) {
    for (let k = 0; k < PORTAL_SHARDS; k++) {
      const dst =
        family === 'IPv6' ? `::${k.toString(16)}/::${mask.toString(16)}` : `0.0.0.${k}/0.0.0.${mask}`;
      rules.push({ table: 'nat', chain, spec: `-d ${dst} -j ${portalShardChain(chain, k)}` });
    }
  }
  return rules;
}

/** Restore lines (`-I`/`-A`) for the given jumps, per table; empty arrays when none is missing. */
export function renderJumps(missing: readonly Jump[]): { nat: string[]; filter: string[] } {
  const out: { nat: string[]; filter: string[] } = { nat: [], filter: [] };
  for (const j of missing) {
    const head = j.position === 'prepend' ? `-I ${j.from} 1` : `-A ${j.from}`;
    out[j.table].push(`${head} ${j.args.map(quoteArg).join(' ')} -j ${j.to}`);
  }
  return out;
}

/**
 * The complete text that, fed to `iptables-restore --noflush`, replaces exactly our chains' contents
 * (each `:CHAIN - [0:0]` line creates or flushes one) and adds `missingJumps`; nothing else is touched.
 */
export function renderRestoreInput(input: RuleInput, missingJumps: readonly Jump[] = []): RestoreText {
  return renderChains(input, missingJumps, () => true);
}

/**
 * renderRestoreInput in two restores, for a start-up: first the container-side portal chains (what pods
 * reach ClusterIPs through; ~0.3 s of kernel time at 10,000 service ports), then everything else (host
 * side, NodePorts, filter). Pods are served as soon as the first is in, without waiting for the second.
 * Together they hold exactly what renderRestoreInput holds.
 */
export function renderRestoreParts(
  input: RuleInput,
  missingJumps: readonly Jump[] = [],
): [containerSide: RestoreText, rest: RestoreText] {
  const containerSide = (chain: Chain) => chain.startsWith(KUBE_PORTALS_CONTAINER);
  return [
    renderChains(input, missingJumps, containerSide),
    renderChains(input, missingJumps, (chain) => !containerSide(chain)),
  ];
}

/** Declares (empties) the chains `pick` selects and fills them, with the missing jumps into them. */
function renderChains(
  input: RuleInput,
  missingJumps: readonly Jump[],
  pick: (c: Chain) => boolean,
): RestoreText {
  const byChain = new Map<Chain, string[]>();
  const add = (r: Rule) => {
    if (!pick(r.chain)) return;
    const list = byChain.get(r.chain);
    if (list) list.push(r.spec);
    else byChain.set(r.chain, [r.spec]);
  };
  for (const r of dispatchRules(input.family)) add(r);
  for (const portal of sortPortals(input.portals)) for (const r of portalRules(portal, input)) add(r);
  const jumps = renderJumps(missingJumps.filter((j) => pick(j.to)));
  const table = (t: Table): string => {
    const chains = CHAINS[t].filter(pick);
    if (chains.length === 0 && jumps[t].length === 0) return '';
    const lines = [`*${t}`];
    for (const chain of chains) lines.push(`:${chain} - [0:0]`);
    lines.push(...jumps[t]);
    for (const chain of chains)
      for (const spec of byChain.get(chain) ?? []) lines.push(`-A ${chain} ${spec}`);
    lines.push('COMMIT', '');
    return lines.join('\n');
  };
  return { nat: table('nat'), filter: table('filter') };
}

/**
 * Restore input that turns the rules of `previous` into those of `next` (same context) without
 * touching unchanged service ports: `-D <chain> <old rule>` for rules that went, then `-A` for new
 * ones. Tables without changes are empty strings; both empty means nothing to apply. A `-D` of a rule
 * someone else removed fails the restore: the caller then falls back to a full render.
 *
 * With `keys`, only those service ports are compared (`next` then needs to hold only them: a key it
 * lacks is one that went): O(changes) rather than O(service ports).
 */
export function renderDelta(
  previous: PortalSet,
  next: PortalSet,
  ctx: RuleContext,
  keys?: Iterable<ServicePortKey>,
): RestoreText {
  const prev = toMap(previous);
  const curr = toMap(next);
  const deletes: Rule[] = [];
  const adds: Rule[] = [];
  // Only the changed keys are sorted (one or two of 10,000 in a typical delta).
  const changed: ServicePortKey[] = [];
  if (keys !== undefined) {
    for (const key of keys) {
      const a = prev.get(key);
      const b = curr.get(key);
      if (a === undefined ? b !== undefined : b === undefined || !samePortal(a, b)) changed.push(key);
    }
  } else {
    for (const [key, a] of prev) {
      const b = curr.get(key);
      if (b === undefined || !samePortal(a, b)) changed.push(key);
    }
    for (const key of curr.keys()) if (!prev.has(key)) changed.push(key);
  }
  for (const key of changed.sort(compareStrings)) {
    const a = prev.get(key);
    const b = curr.get(key);
    const before = a === undefined ? [] : portalRules(a, ctx);
    const after = b === undefined ? [] : portalRules(b, ctx);
    // Multiset difference: unchanged rules of a changed service port stay in place.
    const count = new Map<string, number>();
    for (const r of before) count.set(ruleKey(r), (count.get(ruleKey(r)) ?? 0) + 1);
    for (const r of after) {
      const n = count.get(ruleKey(r)) ?? 0;
      if (n > 0) count.set(ruleKey(r), n - 1);
      else adds.push(r);
    }
    for (const r of before) {
      const n = count.get(ruleKey(r)) ?? 0;
      if (n > 0) {
        count.set(ruleKey(r), n - 1);
        deletes.push(r);
      }
    }
  }
  const table = (t: Table): string => {
    const lines: string[] = [];
    for (const r of deletes) if (r.table === t) lines.push(`-D ${r.chain} ${r.spec}`);
    for (const r of adds) if (r.table === t) lines.push(`-A ${r.chain} ${r.spec}`);
    return lines.length === 0 ? '' : [`*${t}`, ...lines, 'COMMIT', ''].join('\n');
  };
  return { nat: table('nat'), filter: table('filter') };
}

/** True when two contexts render the same rules for the same portals (a change needs a full render). */
export function sameContext(a: RuleContext, b: RuleContext): boolean {
  return (
    a.family === b.family &&
    a.bindAddress === b.bindAddress &&
    a.hostIP === b.hostIP &&
    sameList(nodePortDestinations(a), nodePortDestinations(b))
  );
}

/**
 * The destinations NodePort rules are written for: `[undefined]` = one rule without `-d`; otherwise the
 * local addresses of this family inside the family's CIDRs, sorted (interface order must not matter).
 */
export function nodePortDestinations(ctx: RuleContext): (string | undefined)[] {
  const v = ipVersion(ctx.family);
  const type = v === 4 ? 'ipv4' : 'ipv6';
  const blocks = new BlockList();
  let any = false;
  for (const cidr of ctx.nodePortAddresses) {
    const slash = cidr.indexOf('/');
    const ip = cidr.slice(0, slash);
    const prefix = Number(cidr.slice(slash + 1));
    if (
      slash < 0 ||
      isIP(ip) !== v ||
      !Number.isInteger(prefix) ||
      prefix < 0 ||
      prefix > (v === 4 ? 32 : 128)
    )
      continue;
    if (prefix === 0) return [undefined];
    blocks.addSubnet(ip, prefix, type);
    any = true;
  }
  if (!any) return [undefined];
  const local = new Set(ctx.localAddresses.filter((ip) => isIP(ip) === v && blocks.check(ip, type)));
  return [...local].sort(compareStrings);
}

function samePortal(a: PortalSpec, b: PortalSpec): boolean {
  if (a === b) return true;
  const x = a.servicePort;
  const y = b.servicePort;
  return (
    a.proxyPort === b.proxyPort &&
    x.name === y.name &&
    x.protocol === y.protocol &&
    x.port === y.port &&
    x.nodePort === y.nodePort &&
    sameList(x.clusterIPs, y.clusterIPs) &&
    sameList(x.externalIPs, y.externalIPs) &&
    sameList(x.loadBalancerIPs, y.loadBalancerIPs)
  );
}

function toMap(set: PortalSet): ReadonlyMap<ServicePortKey, PortalSpec> {
  if (!Array.isArray(set)) return set as ReadonlyMap<ServicePortKey, PortalSpec>;
  const m = new Map<ServicePortKey, PortalSpec>();
  for (const p of set as readonly PortalSpec[]) m.set(p.servicePort.key, p);
  return m;
}

function sortPortals(portals: readonly PortalSpec[]): PortalSpec[] {
  return [...portals].sort((a, b) => compareStrings(a.servicePort.key, b.servicePort.key));
}

function ruleKey(r: Rule): string {
  return `${r.table} ${r.chain} ${r.spec}`;
}

function specificBindIP(ctx: RuleContext): string | undefined {
  const ip = ctx.bindAddress;
  if (ip === '' || ip === '0.0.0.0' || ip === '::') return undefined;
  if (isIP(ip) !== ipVersion(ctx.family))
    throw new TypeError(`bindAddress ${ip} is not an ${ctx.family} address`);
  return ip;
}

function hostIPOf(ctx: RuleContext): string {
  const ip = ctx.hostIP;
  if (isIP(ip) !== ipVersion(ctx.family))
    throw new TypeError(`hostIP "${ip}" is not an ${ctx.family} address`);
  // DNAT to loopback makes packets vanish (reference §1.3): the host side needs a real node address.
  if (ip === '::1' || ip.startsWith('127.')) throw new TypeError(`hostIP ${ip} is loopback`);
  return ip;
}

function joinHostPort(ip: string, port: number): string {
  return ip.includes(':') ? `[${ip}]:${port}` : `${ip}:${port}`;
}

function quoteArg(arg: string): string {
  return /^[A-Za-z0-9._:/-]+$/.test(arg) ? arg : `"${arg.replace(/["\\]/g, '\\$&')}"`;
}

function ipVersion(family: IPFamily): 4 | 6 {
  return family === 'IPv6' ? 6 : 4;
}

function validPort(port: number): boolean {
  return Number.isInteger(port) && port >= 1 && port <= 65535;
}

function compareStrings(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

function sameList<T>(a: readonly T[], b: readonly T[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}
