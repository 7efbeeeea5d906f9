// Renders the portal rules (reference §1.3, with kube-proxy's traffic policies, rejects and source ranges)
// as iptables-restore input: full texts and one-service deltas. Pure: no I/O, no clock. Same input, same bytes.
import { BlockList, isIP } from 'node:net';
import { joinHostPort } from '../lib/host-port.ts';
import { isLoopbackIP } from '../lib/ip.ts';
import { sameList } from '../lib/lists.ts';
import { type PortalEndpoints, type PortalSpec, VIA_NODE_PORT } from '../proxier/portal-programmer.ts';
import { type IPFamily, type ServicePort, type ServicePortKey, samePortals } from '../state/service-port.ts';
import {
  CHAINS,
  type Chain,
  type Jump,
  KUBE_EXTERNAL_SERVICES,
  KUBE_NODEPORT_CONTAINER,
  KUBE_NODEPORT_HOST,
  KUBE_NODEPORT_NON_LOCAL,
  KUBE_NODEPORTS,
  KUBE_PORTALS_CONTAINER,
  KUBE_PORTALS_HOST,
  KUBE_PROXY_FIREWALL,
  KUBE_SERVICES,
  type ListenerPorts,
  PORTAL_SHARDS,
  type PortalChain,
  portalShard,
  portalShardChain,
  type Table,
} from './chains.ts';

/**
 * How the rules tell traffic from this node's pods apart (kube-proxy's LocalTrafficDetector): restore-line
 * fragments such as `-s 10.244.0.0/16` / `! -s 10.244.0.0/16`, or `-i cbr0` / `! -i cbr0`.
 */
export type LocalDetector = { readonly ifLocal: string; readonly ifNotLocal: string };

/** Everything besides the portals that decides the rules of one family. */
export type RuleContext = {
  readonly family: IPFamily;
  /** `0.0.0.0` or `::` (REDIRECT on the container side), or a specific IP of this family (DNAT to it). */
  readonly bindAddress: string;
  /**
   * Node IP of this family: host-side DNAT goes to it when bindAddress is unspecified (never loopback),
   * and a loadBalancerSourceRanges entry containing it lets the node reach the LB IP (allowFromNode).
   */
  readonly hostIP: string;
  /** --nodeport-addresses CIDRs; none of this family (or a /0) = NodePorts on every local address. */
  readonly nodePortAddresses: readonly string[];
  /** The node's addresses; those of this family inside nodePortAddresses get one NodePort rule each. */
  readonly localAddresses: readonly string[];
  /**
   * Tells this node's pods apart, so their traffic to an external destination of an
   * externalTrafficPolicy Local service goes to the cluster-wide list (kube-proxy's short-circuit).
   * Undefined: pods cannot be told apart and are treated as traffic from outside.
   */
  readonly localDetector?: LocalDetector | undefined;
  /**
   * The ports listeners get theirs from (the proxy port range): KUBE-NODEPORT-NON-LOCAL accepts DNATed
   * traffic to all of them at once (nonLocalRangeRules), so a listener there needs no rule of its own.
   * Undefined or empty (the kernel picks ports): one ACCEPT per listener.
   */
  readonly listenerPorts?: ListenerPorts | undefined;
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
 * A listener NAT rules send traffic to. `local`: it is the second listener (`localProxyPort`, serving the
 * node-local list); its rules carry the comment `<name>/local`, which previousProxyPorts reads back.
 * `via`: it is the listener of one external destination (portalPorts), comment `<name>/to/<via>[/local]`.
 */
export type PortalTarget = { readonly port: number; readonly local: boolean; readonly via?: string };

/** What a traffic kind without a target gets in the filter table (kube-proxy's choice). */
export type FilterVerdict = 'REJECT' | 'DROP';

/** Where each kind of traffic of one service port goes, in one family (kube-proxy's syncProxyRules). */
export type PortalTargets = {
  /** ClusterIP traffic, from pods and from the node. Undefined: not NATed, `internalFilter` instead. */
  readonly internal: PortalTarget | undefined;
  /** externalIPs, LB IPs and NodePorts from outside. Undefined: not NATed, `externalFilter` instead. */
  readonly external: PortalTarget | undefined;
  /** externalIPs, LB IPs and NodePorts from the node itself and, under externalTrafficPolicy Local, from
   * this node's pods (when a detector tells them apart): always the cluster-wide list. */
  readonly shortCircuit: PortalTarget | undefined;
  /** REJECT when no endpoint is usable at all, DROP when only the policy leaves none; undefined: NATed. */
  readonly internalFilter: FilterVerdict | undefined;
  readonly externalFilter: FilterVerdict | undefined;
};

/**
 * Which listener each kind of traffic of `spec` goes to in `family`. The cluster-wide list is served
 * by `proxyPort`; the node-local one by `localProxyPort`, or by `proxyPort` when the service port uses
 * only the local list (then localProxyPort is 0). A list that is empty is no target.
 */
export function portalTargets(spec: PortalSpec, family: IPFamily, via?: string): PortalTargets {
  const sp = spec.servicePort;
  const eps = spec.endpoints[family];
  // An external destination with listeners of its own (`via`): they stand in for the service port's.
  const own = via === undefined ? undefined : spec.portalPorts?.get(via);
  const proxyPort = own?.proxyPort ?? spec.proxyPort;
  const localProxyPort = own === undefined ? spec.localProxyPort : own.localProxyPort;
  const at = own === undefined ? undefined : via;
  const cluster: PortalTarget | undefined = eps.cluster ? target(proxyPort, false, at) : undefined;
  const local: PortalTarget | undefined = !eps.local
    ? undefined
    : localProxyPort !== 0
      ? target(localProxyPort, true, at)
      : target(proxyPort, false, at);
  const internal = sp.internalPolicyLocal ? local : cluster;
  const external = sp.externalPolicyLocal ? local : cluster;
  const verdict = (t: PortalTarget | undefined): FilterVerdict | undefined =>
    t !== undefined ? undefined : eps.any ? 'DROP' : 'REJECT';
  return {
    internal,
    external,
    shortCircuit: cluster,
    internalFilter: verdict(internal),
    externalFilter: verdict(external),
  };
}

function target(port: number, local: boolean, via: string | undefined): PortalTarget {
  return via === undefined ? { port, local } : { port, local, via };
}

/** The comment suffix of the rules that go to `t` (previousProxyPorts reads it back). */
export function targetSuffix(t: PortalTarget): string {
  return `${t.via === undefined ? '' : `/to/${t.via}`}${t.local ? '/local' : ''}`;
}

/**
 * The rules of one portal in this family: nat rules in `openPortal` order (ClusterIP, externalIPs, LB
 * IPs, NodePort), then the filter rules (REJECT/DROP where a kind of traffic has no endpoint, DROP for
 * LB IP traffic outside loadBalancerSourceRanges, ACCEPT for the listeners and the health check node
 * port). Within a chain the order matters: a short-circuit rule comes before the catch-all after it, so
 * deltas replace a service port's rules of a chain whole (renderDelta). A service port without a
 * cluster IP of this family renders nothing here (its NodePort is served by the family of its cluster
 * IP, as kube-proxy's per-family proxiers do).
 */
export function portalRules(spec: PortalSpec, ctx: RuleContext): Rule[] {
  const sp = spec.servicePort;
  const { proxyPort, localProxyPort } = spec;
  if (!validPort(proxyPort) || !validPort(sp.port)) return [];
  if (localProxyPort !== 0 && !validPort(localProxyPort)) return [];
  if (sp.protocol !== 'TCP' && sp.protocol !== 'UDP') return [];
  const v = ipVersion(ctx.family);
  const clusterIPs = sp.clusterIPs.filter((ip) => isIP(ip) === v);
  if (clusterIPs.length === 0) return [];

  const targets = portalTargets(spec, ctx.family);
  const proto = sp.protocol === 'TCP' ? 'tcp' : 'udp';
  const name = sanitizeComment(sp.name);
  const comment = (t: PortalTarget) => {
    const suffix = targetSuffix(t);
    return `-m comment --comment ${suffix === '' ? name : `${name.slice(0, MAX_COMMENT_LENGTH - suffix.length)}${suffix}`}`;
  };
  const match = (t: PortalTarget, port: number) => `${comment(t)} -p ${proto} -m ${proto} --dport ${port}`;
  const dst = (ip: string) => `-d ${ip}/${v === 4 ? 32 : 128}`;
  const bindIP = specificBindIP(ctx);
  const containerTarget = (t: PortalTarget) =>
    bindIP === undefined
      ? `-j REDIRECT --to-ports ${t.port}`
      : `-j DNAT --to-destination ${joinHostPort(bindIP, t.port)}`;
  const hostTarget = (t: PortalTarget) =>
    `-j DNAT --to-destination ${joinHostPort(bindIP ?? hostIPOf(ctx), t.port)}`;

  const rules: Rule[] = [];
  const filterRules: Rule[] = [];
  // One rule: `--dport` first, then the destination and source matches, then the target.
  const line = (head: string, matches: (string | undefined)[], target: string) =>
    [head, ...matches.filter((m) => m !== undefined && m !== ''), target].join(' ');
  const nat = (chain: Chain, t: PortalTarget, port: number, matches: (string | undefined)[], side: Side) =>
    rules.push({
      table: 'nat',
      chain,
      spec: line(match(t, port), matches, side === 'container' ? containerTarget(t) : hostTarget(t)),
    });
  const filter = (
    chain: Chain,
    text: string,
    port: number,
    matches: (string | undefined)[],
    target: string,
  ) =>
    filterRules.push({
      table: 'filter',
      chain,
      spec: line(
        `-m comment --comment ${quotedComment(name, text)} -p ${proto} -m ${proto} --dport ${port}`,
        matches,
        `-j ${target}`,
      ),
    });
  const noEndpoints = (verdict: FilterVerdict) =>
    verdict === 'REJECT' ? ' has no endpoints' : ' has no local endpoints';

  // Portal rules live in the shard chain of their destination (see PORTAL_SHARDS).
  const shard = (chain: PortalChain, ip: string) => portalShardChain(chain, portalShard(ip));
  for (const ip of clusterIPs) {
    if (targets.internal !== undefined) {
      nat(shard(KUBE_PORTALS_CONTAINER, ip), targets.internal, sp.port, [dst(ip)], 'container');
      nat(shard(KUBE_PORTALS_HOST, ip), targets.internal, sp.port, [dst(ip)], 'host');
    } else if (targets.internalFilter !== undefined) {
      const verdict = targets.internalFilter;
      filter(KUBE_SERVICES, noEndpoints(verdict), sp.port, [dst(ip)], verdict);
    }
  }

  /**
   * The rules of one external destination. `sources`: the loadBalancerSourceRanges of this family
   * (undefined: every source), with `fromNode` the extra source the node itself may use (allowFromNode).
   */
  const external = (
    targets: PortalTargets,
    chains: { container: Chain; host: Chain },
    port: number,
    destination: string,
    sources: readonly string[] | undefined,
    fromNode: string | undefined,
  ) => {
    const all = sources ?? [undefined];
    // This node's pods (detector) to an ETP Local service: the cluster-wide list, before the rule below
    // that sends everyone else to the local one (order matters: one chain, first match wins).
    const detector = ctx.localDetector;
    if (sp.externalPolicyLocal && detector !== undefined && targets.shortCircuit !== undefined) {
      for (const src of all) {
        const pods = podSource(detector, src, v);
        if (pods !== undefined)
          nat(chains.container, targets.shortCircuit, port, [destination, pods], 'container');
      }
    }
    if (targets.external !== undefined)
      for (const src of all)
        nat(chains.container, targets.external, port, [destination, source(src)], 'container');
    // The node itself: always the cluster-wide list (kube-proxy's `--src-type LOCAL` short-circuit).
    if (targets.shortCircuit !== undefined) {
      for (const src of all) nat(chains.host, targets.shortCircuit, port, [destination, source(src)], 'host');
      if (fromNode !== undefined)
        nat(chains.host, targets.shortCircuit, port, [destination, source(fromNode)], 'host');
    }
  };
  const rejectExternal = (port: number, destination: string) => {
    if (targets.externalFilter !== undefined)
      filter(
        KUBE_EXTERNAL_SERVICES,
        noEndpoints(targets.externalFilter),
        port,
        [destination],
        targets.externalFilter,
      );
  };
  const portalChains = (ip: string) => ({
    container: shard(KUBE_PORTALS_CONTAINER, ip),
    host: shard(KUBE_PORTALS_HOST, ip),
  });

  // Every source, from pods and from the node alike (current kube-proxy; no physdev/addrtype condition).
  for (const ip of sp.externalIPs) {
    if (isIP(ip) !== v) continue;
    external(portalTargets(spec, ctx.family, ip), portalChains(ip), sp.port, dst(ip), undefined, undefined);
    rejectExternal(sp.port, dst(ip));
  }

  const ranges = sourceRanges(sp, v);
  // kube-proxy's usesFWChain: ranges of this family (none of this family: every source, as there) and
  // some endpoint; without one the REJECT below covers every source anyway.
  const firewall = ranges.length > 0 && spec.endpoints[ctx.family].any;
  const allowFromNode = firewall && containsIP(ranges, ctx.hostIP, v);
  for (const ip of sp.loadBalancerIPs) {
    if (isIP(ip) !== v) continue;
    external(
      portalTargets(spec, ctx.family, ip),
      portalChains(ip),
      sp.port,
      dst(ip),
      firewall ? ranges : undefined,
      allowFromNode ? `${ip}/${v === 4 ? 32 : 128}` : undefined,
    );
    if (firewall)
      filter(
        KUBE_PROXY_FIREWALL,
        ' traffic not accepted by loadBalancerSourceRanges',
        sp.port,
        [dst(ip)],
        'DROP',
      );
    rejectExternal(sp.port, dst(ip));
  }

  if (sp.nodePort !== 0 && validPort(sp.nodePort)) {
    const nodePortTargets = portalTargets(spec, ctx.family, VIA_NODE_PORT);
    // NodePorts are not subject to loadBalancerSourceRanges (as kube-proxy).
    for (const ip of nodePortDestinations(ctx)) {
      const destination = ip === undefined ? '' : dst(ip);
      external(
        nodePortTargets,
        { container: KUBE_NODEPORT_CONTAINER, host: KUBE_NODEPORT_HOST },
        sp.nodePort,
        destination,
        undefined,
        undefined,
      );
      rejectExternal(sp.nodePort, ip === undefined ? '-m addrtype --dst-type LOCAL' : destination);
    }
  }

  // For hosts whose INPUT policy is DROP: every packet of a connection a NAT rule sent to a listener
  // (DNAT, and the reply's source is the listener port). Both directions: the node's own connections
  // to its proxy ports come back through INPUT too (on lo), where a reply has no listener dport.
  const listeners: PortalTarget[] = [{ port: proxyPort, local: false }];
  if (localProxyPort !== 0 && localProxyPort !== proxyPort)
    listeners.push({ port: localProxyPort, local: true });
  for (const [via, ports] of spec.portalPorts ?? []) {
    if (ports.proxyPort !== 0 && validPort(ports.proxyPort))
      listeners.push({ port: ports.proxyPort, local: false, via });
    if (ports.localProxyPort !== 0 && validPort(ports.localProxyPort))
      listeners.push({ port: ports.localProxyPort, local: true, via });
  }
  for (const t of listeners) {
    if (inRange(t.port, ctx.listenerPorts)) continue;
    filterRules.push({
      table: 'filter',
      chain: KUBE_NODEPORT_NON_LOCAL,
      spec: `${comment(t)} -p ${proto} -m conntrack --ctstate DNAT --ctreplsrcport ${t.port} -j ACCEPT`,
    });
  }
  if (sp.healthCheckNodePort !== 0 && validPort(sp.healthCheckNodePort))
    filterRules.push({
      table: 'filter',
      chain: KUBE_NODEPORTS,
      spec: `-m comment --comment ${quotedComment(name, ' health check node port')} -p tcp -m tcp --dport ${sp.healthCheckNodePort} -j ACCEPT`,
    });
  // A rule equal to an earlier one (two ranges with the same intersection, a repeated IP) could never
  // match, and would make a delta's `-D` ambiguous: kept once.
  const seen = new Set<string>();
  return [...rules, ...filterRules].filter((r) => {
    const key = `${r.chain} ${r.spec}`;
    if (seen.has(key)) return false;
    seen.add(key);
    return true;
  });
}

type Side = 'container' | 'host';

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

/**
 * KUBE-NODEPORT-NON-LOCAL's first rule: a packet our NAT rules did not send to a listener returns at once.
 * Every ACCEPT after it requires `--ctstate DNAT`, so this changes no verdict; but INPUT jumps here for
 * every packet, and without it each one the proxy does not serve (an endpoint's answers to our upstream
 * connections, the node's other traffic) walked one rule per listener: 10,000 at 10,000 service ports.
 * Fixed, so a delta never touches it (its appends land after it).
 */
export const NON_LOCAL_RETURN: Rule = {
  table: 'filter',
  chain: KUBE_NODEPORT_NON_LOCAL,
  spec: '-m conntrack ! --ctstate DNAT -j RETURN',
};

/**
 * KUBE-NODEPORT-NON-LOCAL's ACCEPTs for every port of the listener port range, after NON_LOCAL_RETURN:
 * one per protocol, fixed for a context, so adding or removing a listener never touches the filter table.
 * One ACCEPT per listener costs more than a walk: on every change to a table, nf_tables validates
 * every rule reachable in it (~0.5 µs a rule here), so at 10,000 listeners each Service added or removed
 * paid ~5 ms for its ACCEPT (a `-D` in a 10,000-rule chain ~100 ms), every other filter change ~5 ms
 * more, and a DNATed packet walked up to 10,000 rules. The difference: a DNATed connection to a port of
 * the range without a listener is refused by the kernel (RST) where the INPUT policy would have dropped
 * it; only NAT rules, which root writes, DNAT anything here.
 */
export function nonLocalRangeRules(ctx: RuleContext): Rule[] {
  const ports = ctx.listenerPorts;
  if (ports === undefined || ports.size <= 0) return [];
  const last = ports.base + ports.size - 1;
  const range = ports.size === 1 ? `${ports.base}` : `${ports.base}:${last}`;
  return (['tcp', 'udp'] as const).map((proto) => ({
    table: 'filter',
    chain: KUBE_NODEPORT_NON_LOCAL,
    spec: `-m comment --comment "kube-userspace-proxy listener ports" -p ${proto} -m conntrack --ctstate DNAT --ctreplsrcport ${range} -j ACCEPT`,
  }));
}

/** True when `port` is one of `ports`. */
function inRange(port: number, ports: ListenerPorts | undefined): boolean {
  return ports !== undefined && port >= ports.base && port < ports.base + ports.size;
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
  add(NON_LOCAL_RETURN);
  for (const r of nonLocalRangeRules(input)) add(r);
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
 * ones. A changed service port's rules are compared per chain, in order: from the first rule that
 * differs, its old rules in that chain are deleted and its new ones appended, so the order within a
 * service port survives (its short-circuit rules before its catch-all; the rules kept before that point
 * precede whatever is appended). Rules of different service ports never depend on each other's order
 * (different destinations). Tables without changes are empty strings;
 * both empty means nothing to apply. A `-D` of a rule someone else removed fails the restore: the
 * caller then falls back to a full render.
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
    const before = byChain(a === undefined ? [] : portalRules(a, ctx));
    const after = byChain(b === undefined ? [] : portalRules(b, ctx));
    for (const [chain, old] of before) {
      const now = after.get(chain) ?? [];
      // The rules both lists start with stay: whatever is appended comes after them anyway.
      const keep = commonPrefix(old, now);
      deletes.push(...old.slice(keep));
      adds.push(...now.slice(keep));
    }
    for (const [chain, now] of after) if (!before.has(chain)) adds.push(...now);
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
    a.localDetector?.ifLocal === b.localDetector?.ifLocal &&
    a.localDetector?.ifNotLocal === b.localDetector?.ifNotLocal &&
    (a.listenerPorts?.base ?? 0) === (b.listenerPorts?.base ?? 0) &&
    (a.listenerPorts?.size ?? 0) === (b.listenerPorts?.size ?? 0) &&
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
  for (const text of ctx.nodePortAddresses) {
    const cidr = parseCIDR(text, v);
    if (cidr === undefined) continue;
    if (cidr.prefix === 0) return [undefined];
    blocks.addSubnet(cidr.ip, cidr.prefix, type);
    any = true;
  }
  if (!any) return [undefined];
  const local = new Set(ctx.localAddresses.filter((ip) => isIP(ip) === v && blocks.check(ip, type)));
  return [...local].sort(compareStrings);
}

/** True when `a` and `b` render the same rules in any context: every field portalRules reads. */
function samePortal(a: PortalSpec, b: PortalSpec): boolean {
  if (a === b) return true;
  const x = a.servicePort;
  const y = b.servicePort;
  return (
    a.proxyPort === b.proxyPort &&
    a.localProxyPort === b.localProxyPort &&
    sameEndpoints(a.endpoints.IPv4, b.endpoints.IPv4) &&
    sameEndpoints(a.endpoints.IPv6, b.endpoints.IPv6) &&
    x.name === y.name &&
    samePortals(x, y)
  );
}

function sameEndpoints(a: PortalEndpoints, b: PortalEndpoints): boolean {
  return a.any === b.any && a.cluster === b.cluster && a.local === b.local;
}

/** A service port's rules per `table chain`, in order. */
function byChain(rules: readonly Rule[]): Map<string, Rule[]> {
  const out = new Map<string, Rule[]>();
  for (const r of rules) {
    const key = `${r.table} ${r.chain}`;
    const list = out.get(key);
    if (list) list.push(r);
    else out.set(key, [r]);
  }
  return out;
}

/** How many rules `a` and `b` start with in common. */
function commonPrefix(a: readonly Rule[], b: readonly Rule[]): number {
  let i = 0;
  while (i < a.length && i < b.length && a[i]!.spec === b[i]!.spec) i++;
  return i;
}

/** `"<name><suffix>"`: a comment with spaces (kube-proxy's wording), within iptables' 255 bytes. */
function quotedComment(name: string, suffix: string): string {
  return `"${name.slice(0, MAX_COMMENT_LENGTH - suffix.length)}${suffix}"`;
}

/** `-s <cidr>`, or nothing for every source. */
function source(cidr: string | undefined): string | undefined {
  return cidr === undefined ? undefined : `-s ${cidr}`;
}

/**
 * The match for "from this node's pods and from `range`" (undefined `range`: any source), or undefined
 * when no source can be both. A CIDR detector and a range are nested or disjoint, so their
 * intersection is the narrower of the two or nothing (one `-s` per rule: iptables takes no second).
 * Any other detector (`-i cbr0`) is added beside the range.
 */
function podSource(detector: LocalDetector, range: string | undefined, v: 4 | 6): string | undefined {
  const cidr = /^-s (\S+)$/.exec(detector.ifLocal.trim())?.[1];
  if (cidr === undefined) return range === undefined ? detector.ifLocal : `-s ${range} ${detector.ifLocal}`;
  if (range === undefined) return detector.ifLocal;
  const pods = parseCIDR(cidr, v);
  const allowed = parseCIDR(range, v);
  if (pods === undefined || allowed === undefined) return undefined;
  const [narrow, wide] = allowed.prefix >= pods.prefix ? [allowed, pods] : [pods, allowed];
  const blocks = new BlockList();
  blocks.addSubnet(wide.ip, wide.prefix, v === 4 ? 'ipv4' : 'ipv6');
  return blocks.check(narrow.ip, v === 4 ? 'ipv4' : 'ipv6') ? `-s ${narrow.text}` : undefined;
}

/** The valid loadBalancerSourceRanges of this family, as written (the rest is never rendered). */
function sourceRanges(sp: ServicePort, v: 4 | 6): string[] {
  return sp.loadBalancerSourceRanges.filter((r) => parseCIDR(r, v) !== undefined);
}

/** True when `ip` (of this family) is inside one of `cidrs` (kube-proxy's allowFromNode on nodeIP). */
function containsIP(cidrs: readonly string[], ip: string, v: 4 | 6): boolean {
  if (isIP(ip) !== v) return false;
  const type = v === 4 ? 'ipv4' : 'ipv6';
  const blocks = new BlockList();
  for (const c of cidrs) {
    const p = parseCIDR(c, v);
    if (p !== undefined) blocks.addSubnet(p.ip, p.prefix, type);
  }
  return blocks.check(ip, type);
}

function parseCIDR(text: string, v: 4 | 6): { ip: string; prefix: number; text: string } | undefined {
  const m = /^([^/\s]+)\/(\d{1,3})$/.exec(text);
  if (!m || isIP(m[1]!) !== v) return undefined;
  const prefix = Number(m[2]);
  if (prefix > (v === 4 ? 32 : 128)) return undefined;
  return { ip: m[1]!, prefix, text };
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
  if (isLoopbackIP(ip)) throw new TypeError(`hostIP ${ip} is loopback`);
  return ip;
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
