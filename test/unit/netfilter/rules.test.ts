import assert from 'node:assert/strict';
import { isIP } from 'node:net';
import { test } from 'node:test';
import {
  ALL_CHAINS,
  CHAINS,
  isOurChain,
  JUMPS,
  KUBE_PORTALS_CONTAINER,
  KUBE_PORTALS_HOST,
  PORTAL_SHARDS,
  portalShard,
  portalShardChain,
} from '../../../src/netfilter/chains.ts';
import { splitLine } from '../../../src/netfilter/iptables.ts';
import {
  dispatchRules,
  MAX_COMMENT_LENGTH,
  portalRules,
  portalTargets,
  type Rule,
  type RuleContext,
  renderDelta,
  renderJumps,
  renderRestoreInput,
  restoreText,
  sameContext,
  sanitizeComment,
} from '../../../src/netfilter/rules.ts';
import type { PortalSpec } from '../../../src/proxier/portal-programmer.ts';
import type { IPFamily, ServicePortKey, ServicePortName } from '../../../src/state/service-port.ts';
import { manyPortals, type PortalOptions, portal } from '../../helpers/portals.ts';

const v4: RuleContext = {
  family: 'IPv4',
  bindAddress: '0.0.0.0',
  hostIP: '192.168.1.5',
  nodePortAddresses: [],
  localAddresses: [],
};
const v6: RuleContext = { ...v4, family: 'IPv6', bindAddress: '::', hostIP: 'fd00::5' };

// The expected layout, spelled out here rather than taken from the code under test: 32 shards per portal
// chain, named with two upper-case hex digits, chosen by the destination's lowest 5 bits.
const SHARD_NUMBERS = Array.from({ length: 32 }, (_, k) => k);
/** `0A` for shard 10. */
const hex2 = (k: number) => k.toString(16).toUpperCase().padStart(2, '0');

/** `*nat` and the `:CHAIN` lines of a full restore: the four base chains, then the 64 shard chains. */
const NAT_CHAINS = [
  '*nat',
  ':KUBE-PORTALS-CONTAINER - [0:0]',
  ':KUBE-PORTALS-HOST - [0:0]',
  ':KUBE-NODEPORT-CONTAINER - [0:0]',
  ':KUBE-NODEPORT-HOST - [0:0]',
  ...SHARD_NUMBERS.map((k) => `:KUBE-PORTALS-CONTAINER-${hex2(k)} - [0:0]`),
  ...SHARD_NUMBERS.map((k) => `:KUBE-PORTALS-HOST-${hex2(k)} - [0:0]`),
  '',
].join('\n');

/** The 64 dispatch rules of a family: each portal chain jumps to shard k for destinations ending in k. */
function dispatchLines(family: IPFamily): string {
  const dst = (k: number) => (family === 'IPv6' ? `::${k.toString(16)}/::1f` : `0.0.0.${k}/0.0.0.31`);
  return ['KUBE-PORTALS-CONTAINER', 'KUBE-PORTALS-HOST']
    .flatMap((chain) => SHARD_NUMBERS.map((k) => `-A ${chain} -d ${dst(k)} -j ${chain}-${hex2(k)}\n`))
    .join('');
}

const NAT_HEAD = NAT_CHAINS + dispatchLines('IPv4');
const NAT_HEAD6 = NAT_CHAINS + dispatchLines('IPv6');
/**
 * `*filter` and the `:CHAIN` lines of a full restore (ours, then kube-proxy's names), then the fixed first
 * rule of KUBE-NODEPORT-NON-LOCAL (the first chain, so its rule comes before any other).
 */
const FILTER_CHAINS = `*filter
:KUBE-NODEPORT-NON-LOCAL - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-NODEPORTS - [0:0]
`;
const NON_LOCAL_RETURN_LINE = '-A KUBE-NODEPORT-NON-LOCAL -m conntrack ! --ctstate DNAT -j RETURN\n';
const FILTER_HEAD = FILTER_CHAINS + NON_LOCAL_RETURN_LINE;
const FILTER_EMPTY = `${FILTER_HEAD}COMMIT
`;

/** The ACCEPT of a listener port for hosts whose INPUT policy is DROP. */
function accept(comment: string, port: number, proto = 'tcp'): string {
  return `-A KUBE-NODEPORT-NON-LOCAL -m comment --comment ${comment} -p ${proto} -m conntrack --ctstate DNAT --ctreplsrcport ${port} -j ACCEPT\n`;
}

/** A full filter text holding `lines`. */
function filterOf(...lines: string[]): string {
  return `${FILTER_HEAD}${lines.join('')}COMMIT\n`;
}

test('the expected nat head of these tests (checked, since every golden builds on it)', () => {
  const lines = NAT_HEAD.split('\n');
  assert.equal(lines.filter((l) => l.startsWith(':')).length, 4 + 64);
  assert.equal(lines.filter((l) => l.startsWith('-A ')).length, 64);
  for (const line of [
    ':KUBE-PORTALS-CONTAINER-00 - [0:0]',
    ':KUBE-PORTALS-CONTAINER-0A - [0:0]',
    ':KUBE-PORTALS-HOST-1F - [0:0]',
    '-A KUBE-PORTALS-CONTAINER -d 0.0.0.0/0.0.0.31 -j KUBE-PORTALS-CONTAINER-00',
    '-A KUBE-PORTALS-CONTAINER -d 0.0.0.20/0.0.0.31 -j KUBE-PORTALS-CONTAINER-14',
    '-A KUBE-PORTALS-HOST -d 0.0.0.31/0.0.0.31 -j KUBE-PORTALS-HOST-1F',
  ])
    assert.ok(lines.includes(line), line);
  for (const line of [
    '-A KUBE-PORTALS-CONTAINER -d ::0/::1f -j KUBE-PORTALS-CONTAINER-00',
    '-A KUBE-PORTALS-CONTAINER -d ::1a/::1f -j KUBE-PORTALS-CONTAINER-1A',
    '-A KUBE-PORTALS-HOST -d ::1f/::1f -j KUBE-PORTALS-HOST-1F',
  ])
    assert.ok(NAT_HEAD6.split('\n').includes(line), line);
});

// 10.0.0.10 is in shard 10 (0A), 10.0.0.20 in shard 20 (14).
const dns = portal('default', 'dns', 'dns', {
  protocol: 'UDP',
  port: 53,
  clusterIPs: ['10.0.0.10'],
  proxyPort: 40001,
});
const web = portal('default', 'web', 'http', { clusterIPs: ['10.0.0.20'], proxyPort: 40002 });
const webNodePort = portal('default', 'web', 'http', {
  clusterIPs: ['10.0.0.20'],
  nodePort: 30080,
  proxyPort: 40002,
});

const goldens: { name: string; ctx: RuleContext; portals: PortalSpec[]; nat: string; filter: string }[] = [
  {
    name: 'ClusterIP TCP: ACCEPT of the proxy port for DNATed traffic (INPUT policy DROP)',
    ctx: v4,
    portals: [web],
    nat: `${NAT_HEAD}-A KUBE-PORTALS-CONTAINER-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
COMMIT
`,
    filter: filterOf(accept('default/web:http', 40002)),
  },
  {
    // The example of reference §1.3, byte for byte (in its shard chain).
    name: 'UDP DNS',
    ctx: v4,
    portals: [dns],
    nat: `${NAT_HEAD}-A KUBE-PORTALS-CONTAINER-0A -m comment --comment default/dns:dns -p udp -m udp --dport 53 -d 10.0.0.10/32 -j REDIRECT --to-ports 40001
-A KUBE-PORTALS-HOST-0A -m comment --comment default/dns:dns -p udp -m udp --dport 53 -d 10.0.0.10/32 -j DNAT --to-destination 192.168.1.5:40001
COMMIT
`,
    filter: filterOf(accept('default/dns:dns', 40001, 'udp')),
  },
  {
    name: 'two services in different shards, one more sharing a shard: shard order, then key order',
    ctx: v4,
    portals: [web, dns, portal('default', 'a', 'http', { clusterIPs: ['10.0.0.52'], proxyPort: 40003 })],
    nat: `${NAT_HEAD}-A KUBE-PORTALS-CONTAINER-0A -m comment --comment default/dns:dns -p udp -m udp --dport 53 -d 10.0.0.10/32 -j REDIRECT --to-ports 40001
-A KUBE-PORTALS-CONTAINER-14 -m comment --comment default/a:http -p tcp -m tcp --dport 80 -d 10.0.0.52/32 -j REDIRECT --to-ports 40003
-A KUBE-PORTALS-CONTAINER-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST-0A -m comment --comment default/dns:dns -p udp -m udp --dport 53 -d 10.0.0.10/32 -j DNAT --to-destination 192.168.1.5:40001
-A KUBE-PORTALS-HOST-14 -m comment --comment default/a:http -p tcp -m tcp --dport 80 -d 10.0.0.52/32 -j DNAT --to-destination 192.168.1.5:40003
-A KUBE-PORTALS-HOST-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
COMMIT
`,
    filter: filterOf(
      accept('default/a:http', 40003),
      accept('default/dns:dns', 40001, 'udp'),
      accept('default/web:http', 40002),
    ),
  },
  {
    name: 'externalIPs: from pods and from the node, like LB IPs (no physdev/addrtype); in the shard of the externalIP',
    ctx: v4,
    portals: [
      portal('default', 'web', 'http', {
        clusterIPs: ['10.0.0.20'],
        externalIPs: ['203.0.113.7'],
        proxyPort: 40002,
      }),
    ],
    nat: `${NAT_HEAD}-A KUBE-PORTALS-CONTAINER-07 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 203.0.113.7/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-CONTAINER-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST-07 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 203.0.113.7/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-HOST-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
COMMIT
`,
    filter: filterOf(accept('default/web:http', 40002)),
  },
  {
    name: 'LoadBalancer IPs like ClusterIPs, in the shard of the LB IP',
    ctx: v4,
    portals: [
      portal('default', 'web', 'http', {
        clusterIPs: ['10.0.0.20'],
        loadBalancerIPs: ['198.51.100.1'],
        proxyPort: 40002,
      }),
    ],
    nat: `${NAT_HEAD}-A KUBE-PORTALS-CONTAINER-01 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-CONTAINER-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST-01 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-HOST-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
COMMIT
`,
    filter: filterOf(accept('default/web:http', 40002)),
  },
  {
    name: 'NodePort on every local address (NodePort chains are not sharded)',
    ctx: v4,
    portals: [webNodePort],
    nat: `${NAT_HEAD}-A KUBE-NODEPORT-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -j REDIRECT --to-ports 40002
-A KUBE-NODEPORT-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-CONTAINER-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
COMMIT
`,
    filter: filterOf(accept('default/web:http', 40002)),
  },
  {
    name: 'NodePort with --nodeport-addresses: one rule per local address inside the CIDRs',
    ctx: {
      ...v4,
      nodePortAddresses: ['192.168.1.0/24', 'fd00::/64'],
      localAddresses: ['192.168.1.5', '10.1.0.1', '192.168.1.6', 'fd00::5', '127.0.0.1'],
    },
    portals: [webNodePort],
    nat: `${NAT_HEAD}-A KUBE-NODEPORT-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -d 192.168.1.5/32 -j REDIRECT --to-ports 40002
-A KUBE-NODEPORT-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -d 192.168.1.6/32 -j REDIRECT --to-ports 40002
-A KUBE-NODEPORT-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -d 192.168.1.5/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-NODEPORT-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -d 192.168.1.6/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-CONTAINER-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
COMMIT
`,
    filter: filterOf(accept('default/web:http', 40002)),
  },
  {
    name: 'NodePort with --nodeport-addresses matching no local address: no NodePort rules',
    ctx: { ...v4, nodePortAddresses: ['172.16.0.0/12'], localAddresses: ['192.168.1.5'] },
    portals: [webNodePort],
    nat: `${NAT_HEAD}-A KUBE-PORTALS-CONTAINER-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
COMMIT
`,
    filter: filterOf(accept('default/web:http', 40002)),
  },
  {
    name: 'specific bind IP: DNAT to it on both sides',
    ctx: { ...v4, bindAddress: '192.168.1.9' },
    portals: [webNodePort],
    nat: `${NAT_HEAD}-A KUBE-NODEPORT-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -j DNAT --to-destination 192.168.1.9:40002
-A KUBE-NODEPORT-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -j DNAT --to-destination 192.168.1.9:40002
-A KUBE-PORTALS-CONTAINER-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.9:40002
-A KUBE-PORTALS-HOST-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.9:40002
COMMIT
`,
    filter: filterOf(accept('default/web:http', 40002)),
  },
  {
    name: 'IPv6: only this family, /128, bracketed DNAT, IPv6 dispatch',
    ctx: v6,
    portals: [
      portal('default', 'web', 'http', {
        clusterIPs: ['10.0.0.20', 'fd00:96::20'],
        externalIPs: ['203.0.113.7', '2001:db8::7'],
        loadBalancerIPs: ['198.51.100.1'],
        proxyPort: 40002,
      }),
      portal('default', 'v4only', 'x', { clusterIPs: ['10.0.0.30'], nodePort: 30099, proxyPort: 40003 }),
    ],
    // fd00:96::20 ends in 0x20: shard 0.
    nat: `${NAT_HEAD6}-A KUBE-PORTALS-CONTAINER-00 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d fd00:96::20/128 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-CONTAINER-07 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 2001:db8::7/128 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST-00 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d fd00:96::20/128 -j DNAT --to-destination [fd00::5]:40002
-A KUBE-PORTALS-HOST-07 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 2001:db8::7/128 -j DNAT --to-destination [fd00::5]:40002
COMMIT
`,
    filter: filterOf(accept('default/web:http', 40002)),
  },
  {
    name: 'IPv6: hex shard names (0x7b → 1B, 0xa → 0A)',
    ctx: v6,
    portals: [
      portal('default', 'web', 'http', {
        clusterIPs: ['fd00:96::7b'],
        loadBalancerIPs: ['2001:db8::a'],
        proxyPort: 40002,
      }),
    ],
    nat: `${NAT_HEAD6}-A KUBE-PORTALS-CONTAINER-0A -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 2001:db8::a/128 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-CONTAINER-1B -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d fd00:96::7b/128 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST-0A -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 2001:db8::a/128 -j DNAT --to-destination [fd00::5]:40002
-A KUBE-PORTALS-HOST-1B -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d fd00:96::7b/128 -j DNAT --to-destination [fd00::5]:40002
COMMIT
`,
    filter: filterOf(accept('default/web:http', 40002)),
  },
  {
    name: 'IPv6 with a specific bind IP',
    ctx: { ...v6, bindAddress: 'fd00::9' },
    portals: [portal('default', 'web', 'http', { clusterIPs: ['fd00:96::20'], proxyPort: 40002 })],
    nat: `${NAT_HEAD6}-A KUBE-PORTALS-CONTAINER-00 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d fd00:96::20/128 -j DNAT --to-destination [fd00::9]:40002
-A KUBE-PORTALS-HOST-00 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d fd00:96::20/128 -j DNAT --to-destination [fd00::9]:40002
COMMIT
`,
    filter: filterOf(accept('default/web:http', 40002)),
  },
  {
    name: 'no portals: chains declared (flushed), dispatch rules, nothing else',
    ctx: v4,
    portals: [],
    nat: `${NAT_HEAD}COMMIT
`,
    filter: FILTER_EMPTY,
  },
  {
    name: 'IPv6, no portals: the IPv6 dispatch rules',
    ctx: v6,
    portals: [],
    nat: `${NAT_HEAD6}COMMIT
`,
    filter: FILTER_EMPTY,
  },
];

for (const c of goldens) {
  test(`renderRestoreInput: ${c.name}`, () => {
    const got = renderRestoreInput({ ...c.ctx, portals: c.portals });
    assert.equal(got.nat, c.nat);
    assert.equal(got.filter, c.filter);
  });
}

// Traffic policies, rejects, source ranges, ACCEPTs (issue 13). 10.0.0.20 is in shard 14, 198.51.100.1
// in shard 01. The expected text is each table's rules, after the heads checked above.
const pods: RuleContext = {
  ...v4,
  localDetector: { ifLocal: '-s 10.244.0.0/16', ifNotLocal: '! -s 10.244.0.0/16' },
};
const cbr: RuleContext = { ...v4, localDetector: { ifLocal: '-i cbr0', ifNotLocal: '! -i cbr0' } };
/** An ETP Local LoadBalancer with a NodePort: proxyPort serves the cluster list, localProxyPort the local one. */
const etpLocal = (o: PortalOptions = {}) =>
  portal('default', 'lb', 'http', {
    clusterIPs: ['10.0.0.20'],
    loadBalancerIPs: ['198.51.100.1'],
    nodePort: 30080,
    proxyPort: 40002,
    localProxyPort: 40003,
    externalPolicyLocal: true,
    healthCheckNodePort: 32000,
    endpoints: { local: true },
    ...o,
  });
const itpLocal = (o: PortalOptions = {}) =>
  portal('default', 'web', 'http', {
    clusterIPs: ['10.0.0.20'],
    nodePort: 30080,
    proxyPort: 40002,
    localProxyPort: 40003,
    internalPolicyLocal: true,
    endpoints: { local: true },
    ...o,
  });
const noEndpoints = portal('default', 'web', 'http', {
  clusterIPs: ['10.0.0.20'],
  externalIPs: ['203.0.113.7'],
  loadBalancerIPs: ['198.51.100.1'],
  loadBalancerSourceRanges: ['203.0.113.0/24'],
  nodePort: 30080,
  proxyPort: 40002,
  endpoints: { any: false, cluster: false },
});
const NONE = { any: false, cluster: false, local: false };
const dualStack = portal('default', 'web', 'http', {
  clusterIPs: ['10.0.0.20', 'fd00:96::20'],
  externalIPs: ['203.0.113.7', '2001:db8::7'],
  nodePort: 30080,
  proxyPort: 40002,
  IPv6: { any: false, cluster: false },
});

/** The rule lines of a full restore (nat, then filter), without the heads the goldens above check. */
function ruleLines(text: { nat: string; filter: string }, family: IPFamily): string {
  assert.ok(text.nat.startsWith(family === 'IPv6' ? NAT_HEAD6 : NAT_HEAD));
  assert.ok(text.filter.startsWith(FILTER_HEAD));
  const nat = text.nat.slice((family === 'IPv6' ? NAT_HEAD6 : NAT_HEAD).length);
  const filter = text.filter.slice(FILTER_HEAD.length);
  return (nat + filter).replaceAll('COMMIT\n', '');
}

const policyGoldens: { name: string; ctx: RuleContext; portals: PortalSpec[]; want: string }[] = [
  {
    name: 'externalTrafficPolicy Local with local endpoints and a CIDR detector: pods (first) and the node to the cluster listener, everyone else to the local one',
    ctx: pods,
    portals: [etpLocal()],
    want: `-A KUBE-NODEPORT-CONTAINER -m comment --comment default/lb:http -p tcp -m tcp --dport 30080 -s 10.244.0.0/16 -j REDIRECT --to-ports 40002
-A KUBE-NODEPORT-CONTAINER -m comment --comment default/lb:http/local -p tcp -m tcp --dport 30080 -j REDIRECT --to-ports 40003
-A KUBE-NODEPORT-HOST -m comment --comment default/lb:http -p tcp -m tcp --dport 30080 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-CONTAINER-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 10.244.0.0/16 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-CONTAINER-01 -m comment --comment default/lb:http/local -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -j REDIRECT --to-ports 40003
-A KUBE-PORTALS-CONTAINER-14 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-HOST-14 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/lb:http -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40002 -j ACCEPT
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/lb:http/local -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40003 -j ACCEPT
-A KUBE-NODEPORTS -m comment --comment "default/lb:http health check node port" -p tcp -m tcp --dport 32000 -j ACCEPT
`,
  },
  {
    name: 'externalTrafficPolicy Local without local endpoints, CIDR detector: pods and the node still served, everyone else DROPped',
    ctx: pods,
    portals: [etpLocal({ endpoints: { local: false } })],
    want: `-A KUBE-NODEPORT-CONTAINER -m comment --comment default/lb:http -p tcp -m tcp --dport 30080 -s 10.244.0.0/16 -j REDIRECT --to-ports 40002
-A KUBE-NODEPORT-HOST -m comment --comment default/lb:http -p tcp -m tcp --dport 30080 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-CONTAINER-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 10.244.0.0/16 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-CONTAINER-14 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-HOST-14 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/lb:http -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40002 -j ACCEPT
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/lb:http/local -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40003 -j ACCEPT
-A KUBE-EXTERNAL-SERVICES -m comment --comment "default/lb:http has no local endpoints" -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -j DROP
-A KUBE-EXTERNAL-SERVICES -m comment --comment "default/lb:http has no local endpoints" -p tcp -m tcp --dport 30080 -m addrtype --dst-type LOCAL -j DROP
-A KUBE-NODEPORTS -m comment --comment "default/lb:http health check node port" -p tcp -m tcp --dport 32000 -j ACCEPT
`,
  },
  {
    name: 'externalTrafficPolicy Local without a detector: no pod short-circuit, the node to the cluster listener',
    ctx: v4,
    portals: [etpLocal()],
    want: `-A KUBE-NODEPORT-CONTAINER -m comment --comment default/lb:http/local -p tcp -m tcp --dport 30080 -j REDIRECT --to-ports 40003
-A KUBE-NODEPORT-HOST -m comment --comment default/lb:http -p tcp -m tcp --dport 30080 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-CONTAINER-01 -m comment --comment default/lb:http/local -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -j REDIRECT --to-ports 40003
-A KUBE-PORTALS-CONTAINER-14 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-HOST-14 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/lb:http -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40002 -j ACCEPT
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/lb:http/local -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40003 -j ACCEPT
-A KUBE-NODEPORTS -m comment --comment "default/lb:http health check node port" -p tcp -m tcp --dport 32000 -j ACCEPT
`,
  },
  {
    name: 'externalTrafficPolicy Local, no local endpoint, no detector: only the node is served, the rest DROPped',
    ctx: v4,
    portals: [etpLocal({ endpoints: { local: false } })],
    want: `-A KUBE-NODEPORT-HOST -m comment --comment default/lb:http -p tcp -m tcp --dport 30080 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-CONTAINER-14 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-HOST-14 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/lb:http -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40002 -j ACCEPT
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/lb:http/local -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40003 -j ACCEPT
-A KUBE-EXTERNAL-SERVICES -m comment --comment "default/lb:http has no local endpoints" -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -j DROP
-A KUBE-EXTERNAL-SERVICES -m comment --comment "default/lb:http has no local endpoints" -p tcp -m tcp --dport 30080 -m addrtype --dst-type LOCAL -j DROP
-A KUBE-NODEPORTS -m comment --comment "default/lb:http health check node port" -p tcp -m tcp --dport 32000 -j ACCEPT
`,
  },
  {
    name: 'internalTrafficPolicy Local, not external: proxyPort serves the local list',
    ctx: v4,
    portals: [
      portal('default', 'web', 'http', {
        clusterIPs: ['10.0.0.20'],
        proxyPort: 40002,
        internalPolicyLocal: true,
        endpoints: { cluster: false, local: true },
      }),
    ],
    want: `-A KUBE-PORTALS-CONTAINER-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/web:http -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40002 -j ACCEPT
`,
  },
  {
    name: 'internalTrafficPolicy Local with a NodePort: ClusterIP to the local listener, the NodePort to the cluster one',
    ctx: v4,
    portals: [itpLocal()],
    want: `-A KUBE-NODEPORT-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -j REDIRECT --to-ports 40002
-A KUBE-NODEPORT-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-CONTAINER-14 -m comment --comment default/web:http/local -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40003
-A KUBE-PORTALS-HOST-14 -m comment --comment default/web:http/local -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40003
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/web:http -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40002 -j ACCEPT
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/web:http/local -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40003 -j ACCEPT
`,
  },
  {
    name: 'internalTrafficPolicy Local without local endpoints: ClusterIP DROPped, the NodePort still served',
    ctx: v4,
    portals: [itpLocal({ endpoints: { local: false } })],
    want: `-A KUBE-NODEPORT-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -j REDIRECT --to-ports 40002
-A KUBE-NODEPORT-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/web:http -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40002 -j ACCEPT
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/web:http/local -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40003 -j ACCEPT
-A KUBE-SERVICES -m comment --comment "default/web:http has no local endpoints" -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DROP
`,
  },
  {
    name: 'no endpoints at all: no NAT rule, REJECT for the ClusterIP, externalIP, LB IP (no firewall) and NodePort',
    ctx: v4,
    portals: [noEndpoints],
    want: `-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/web:http -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40002 -j ACCEPT
-A KUBE-SERVICES -m comment --comment "default/web:http has no endpoints" -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REJECT
-A KUBE-EXTERNAL-SERVICES -m comment --comment "default/web:http has no endpoints" -p tcp -m tcp --dport 80 -d 203.0.113.7/32 -j REJECT
-A KUBE-EXTERNAL-SERVICES -m comment --comment "default/web:http has no endpoints" -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -j REJECT
-A KUBE-EXTERNAL-SERVICES -m comment --comment "default/web:http has no endpoints" -p tcp -m tcp --dport 30080 -m addrtype --dst-type LOCAL -j REJECT
`,
  },
  {
    name: 'no endpoints, NodePort with --nodeport-addresses: a REJECT per address',
    ctx: {
      ...v4,
      nodePortAddresses: ['192.168.1.0/24'],
      localAddresses: ['192.168.1.5', '192.168.1.6', '10.1.0.1'],
    },
    portals: [
      portal('default', 'web', 'http', {
        clusterIPs: ['10.0.0.20'],
        nodePort: 30080,
        proxyPort: 40002,
        endpoints: { any: false, cluster: false },
      }),
    ],
    want: `-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/web:http -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40002 -j ACCEPT
-A KUBE-SERVICES -m comment --comment "default/web:http has no endpoints" -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REJECT
-A KUBE-EXTERNAL-SERVICES -m comment --comment "default/web:http has no endpoints" -p tcp -m tcp --dport 30080 -d 192.168.1.5/32 -j REJECT
-A KUBE-EXTERNAL-SERVICES -m comment --comment "default/web:http has no endpoints" -p tcp -m tcp --dport 30080 -d 192.168.1.6/32 -j REJECT
`,
  },
  {
    name: "loadBalancerSourceRanges: LB IP rules per range of this family, the node's own LB IP source (a range holds the node IP), firewall DROP; the NodePort is not subject to them",
    ctx: v4,
    portals: [
      portal('default', 'lb', 'http', {
        clusterIPs: ['10.0.0.20'],
        loadBalancerIPs: ['198.51.100.1'],
        nodePort: 30080,
        loadBalancerSourceRanges: ['203.0.113.0/24', '192.168.0.0/16', '2001:db8::/32'],
        proxyPort: 40002,
      }),
    ],
    want: `-A KUBE-NODEPORT-CONTAINER -m comment --comment default/lb:http -p tcp -m tcp --dport 30080 -j REDIRECT --to-ports 40002
-A KUBE-NODEPORT-HOST -m comment --comment default/lb:http -p tcp -m tcp --dport 30080 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-CONTAINER-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 203.0.113.0/24 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-CONTAINER-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 192.168.0.0/16 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-CONTAINER-14 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 203.0.113.0/24 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-HOST-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 192.168.0.0/16 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-HOST-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 198.51.100.1/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-HOST-14 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/lb:http -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40002 -j ACCEPT
-A KUBE-PROXY-FIREWALL -m comment --comment "default/lb:http traffic not accepted by loadBalancerSourceRanges" -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -j DROP
`,
  },
  {
    name: 'loadBalancerSourceRanges without the node IP: no allowFromNode rule',
    ctx: v4,
    portals: [
      portal('default', 'lb', 'http', {
        clusterIPs: ['10.0.0.20'],
        loadBalancerIPs: ['198.51.100.1'],
        loadBalancerSourceRanges: ['203.0.113.0/24'],
        proxyPort: 40002,
      }),
    ],
    want: `-A KUBE-PORTALS-CONTAINER-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 203.0.113.0/24 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-CONTAINER-14 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 203.0.113.0/24 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-HOST-14 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/lb:http -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40002 -j ACCEPT
-A KUBE-PROXY-FIREWALL -m comment --comment "default/lb:http traffic not accepted by loadBalancerSourceRanges" -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -j DROP
`,
  },
  {
    name: 'loadBalancerSourceRanges with externalTrafficPolicy Local and a CIDR detector: the pod rule gets the intersection (pod CIDR inside a range, a range inside the pod CIDR, none for a disjoint one)',
    ctx: pods,
    portals: [
      etpLocal({
        nodePort: 0,
        healthCheckNodePort: 0,
        loadBalancerSourceRanges: ['10.0.0.0/8', '10.244.1.0/24', '203.0.113.0/24'],
      }),
    ],
    want: `-A KUBE-PORTALS-CONTAINER-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 10.244.0.0/16 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-CONTAINER-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 10.244.1.0/24 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-CONTAINER-01 -m comment --comment default/lb:http/local -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 10.0.0.0/8 -j REDIRECT --to-ports 40003
-A KUBE-PORTALS-CONTAINER-01 -m comment --comment default/lb:http/local -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 10.244.1.0/24 -j REDIRECT --to-ports 40003
-A KUBE-PORTALS-CONTAINER-01 -m comment --comment default/lb:http/local -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 203.0.113.0/24 -j REDIRECT --to-ports 40003
-A KUBE-PORTALS-CONTAINER-14 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 10.0.0.0/8 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-HOST-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 10.244.1.0/24 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-HOST-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 203.0.113.0/24 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-HOST-14 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/lb:http -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40002 -j ACCEPT
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/lb:http/local -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40003 -j ACCEPT
-A KUBE-PROXY-FIREWALL -m comment --comment "default/lb:http traffic not accepted by loadBalancerSourceRanges" -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -j DROP
`,
  },
  {
    name: 'loadBalancerSourceRanges, externalTrafficPolicy Local, no local endpoint: pods in a range and the node served; the rest DROPped (policy or firewall)',
    ctx: pods,
    portals: [
      etpLocal({
        nodePort: 0,
        healthCheckNodePort: 0,
        loadBalancerSourceRanges: ['10.0.0.0/8', '203.0.113.0/24'],
        endpoints: { local: false },
      }),
    ],
    want: `-A KUBE-PORTALS-CONTAINER-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 10.244.0.0/16 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-CONTAINER-14 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 10.0.0.0/8 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-HOST-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 203.0.113.0/24 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-HOST-14 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/lb:http -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40002 -j ACCEPT
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/lb:http/local -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40003 -j ACCEPT
-A KUBE-EXTERNAL-SERVICES -m comment --comment "default/lb:http has no local endpoints" -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -j DROP
-A KUBE-PROXY-FIREWALL -m comment --comment "default/lb:http traffic not accepted by loadBalancerSourceRanges" -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -j DROP
`,
  },
  {
    name: 'loadBalancerSourceRanges with externalTrafficPolicy Local and an interface detector: range and interface on one rule',
    ctx: cbr,
    portals: [
      etpLocal({
        nodePort: 0,
        healthCheckNodePort: 0,
        loadBalancerSourceRanges: ['10.0.0.0/8', '203.0.113.0/24'],
      }),
    ],
    want: `-A KUBE-PORTALS-CONTAINER-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 10.0.0.0/8 -i cbr0 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-CONTAINER-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 203.0.113.0/24 -i cbr0 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-CONTAINER-01 -m comment --comment default/lb:http/local -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 10.0.0.0/8 -j REDIRECT --to-ports 40003
-A KUBE-PORTALS-CONTAINER-01 -m comment --comment default/lb:http/local -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 203.0.113.0/24 -j REDIRECT --to-ports 40003
-A KUBE-PORTALS-CONTAINER-14 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 10.0.0.0/8 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-HOST-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 203.0.113.0/24 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-HOST-14 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/lb:http -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40002 -j ACCEPT
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/lb:http/local -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40003 -j ACCEPT
-A KUBE-PROXY-FIREWALL -m comment --comment "default/lb:http traffic not accepted by loadBalancerSourceRanges" -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -j DROP
`,
  },
  {
    name: 'loadBalancerSourceRanges of the other family only: every source of this one (as kube-proxy), no firewall',
    ctx: v4,
    portals: [
      portal('default', 'lb', 'http', {
        clusterIPs: ['10.0.0.20'],
        loadBalancerIPs: ['198.51.100.1'],
        loadBalancerSourceRanges: ['2001:db8::/32'],
        proxyPort: 40002,
      }),
    ],
    want: `-A KUBE-PORTALS-CONTAINER-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-CONTAINER-14 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-HOST-14 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/lb:http -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40002 -j ACCEPT
`,
  },
  {
    name: 'dual-stack with endpoints in IPv4 only: IPv4 served',
    ctx: v4,
    portals: [dualStack],
    want: `-A KUBE-NODEPORT-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -j REDIRECT --to-ports 40002
-A KUBE-NODEPORT-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-CONTAINER-07 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 203.0.113.7/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-CONTAINER-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST-07 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 203.0.113.7/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-HOST-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/web:http -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40002 -j ACCEPT
`,
  },
  {
    name: 'dual-stack with endpoints in IPv4 only: IPv6 REJECTed',
    ctx: v6,
    portals: [dualStack],
    want: `-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/web:http -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40002 -j ACCEPT
-A KUBE-SERVICES -m comment --comment "default/web:http has no endpoints" -p tcp -m tcp --dport 80 -d fd00:96::20/128 -j REJECT
-A KUBE-EXTERNAL-SERVICES -m comment --comment "default/web:http has no endpoints" -p tcp -m tcp --dport 80 -d 2001:db8::7/128 -j REJECT
-A KUBE-EXTERNAL-SERVICES -m comment --comment "default/web:http has no endpoints" -p tcp -m tcp --dport 30080 -m addrtype --dst-type LOCAL -j REJECT
`,
  },
];

for (const c of policyGoldens) {
  test(`renderRestoreInput: ${c.name}`, () => {
    assert.equal(ruleLines(renderRestoreInput({ ...c.ctx, portals: c.portals }), c.ctx.family), c.want);
  });
}

test('portalTargets: which listener each kind of traffic goes to, and the filter verdicts', () => {
  const t = (p: PortalSpec, family: IPFamily = 'IPv4') => portalTargets(p, family);
  const cluster = { port: 40002, local: false };
  const local = { port: 40003, local: true };
  const cases: {
    name: string;
    got: ReturnType<typeof portalTargets>;
    want: ReturnType<typeof portalTargets>;
  }[] = [
    {
      name: 'Cluster policies',
      got: t(web),
      want: {
        internal: cluster,
        external: cluster,
        shortCircuit: cluster,
        internalFilter: undefined,
        externalFilter: undefined,
      },
    },
    {
      name: 'ETP Local',
      got: t(etpLocal()),
      want: {
        internal: cluster,
        external: local,
        shortCircuit: cluster,
        internalFilter: undefined,
        externalFilter: undefined,
      },
    },
    {
      name: 'ETP Local, no local endpoint: DROP for external traffic',
      got: t(etpLocal({ endpoints: { local: false } })),
      want: {
        internal: cluster,
        external: undefined,
        shortCircuit: cluster,
        internalFilter: undefined,
        externalFilter: 'DROP',
      },
    },
    {
      name: 'ITP Local beside a NodePort',
      got: t(itpLocal()),
      want: {
        internal: local,
        external: cluster,
        shortCircuit: cluster,
        internalFilter: undefined,
        externalFilter: undefined,
      },
    },
    {
      name: 'ITP Local only: proxyPort serves the local list',
      got: t(
        portal('a', 'b', 'c', {
          proxyPort: 40002,
          internalPolicyLocal: true,
          endpoints: { cluster: false, local: true },
        }),
      ),
      want: {
        internal: cluster,
        external: undefined,
        shortCircuit: undefined,
        internalFilter: undefined,
        externalFilter: 'DROP',
      },
    },
    {
      name: 'no endpoint at all: REJECT',
      got: t(noEndpoints),
      want: {
        internal: undefined,
        external: undefined,
        shortCircuit: undefined,
        internalFilter: 'REJECT',
        externalFilter: 'REJECT',
      },
    },
    {
      name: 'per family: endpoints in IPv4 only',
      got: t(dualStack, 'IPv6'),
      want: {
        internal: undefined,
        external: undefined,
        shortCircuit: undefined,
        internalFilter: 'REJECT',
        externalFilter: 'REJECT',
      },
    },
  ];
  for (const c of cases) assert.deepEqual(c.got, c.want, c.name);
});

test('renderRestoreInput: missing jumps come after the chain lines, with positions and comments of §1.1', () => {
  const got = renderRestoreInput({ ...v4, portals: [] }, JUMPS);
  assert.equal(
    got.nat,
    `${NAT_CHAINS}-I OUTPUT 1 -m comment --comment "handle ClusterIPs; NOTE: this must be before the NodePort rules" -j KUBE-PORTALS-HOST
-I PREROUTING 1 -m comment --comment "handle ClusterIPs; NOTE: this must be before the NodePort rules" -j KUBE-PORTALS-CONTAINER
-A OUTPUT -m addrtype --dst-type LOCAL -m comment --comment "handle service NodePorts; NOTE: this must be the last rule in the chain" -j KUBE-NODEPORT-HOST
-A PREROUTING -m addrtype --dst-type LOCAL -m comment --comment "handle service NodePorts; NOTE: this must be the last rule in the chain" -j KUBE-NODEPORT-CONTAINER
${dispatchLines('IPv4')}COMMIT
`,
  );
  assert.equal(
    got.filter,
    `${FILTER_CHAINS}-I INPUT 1 -m comment --comment "Ensure that non-local NodePort traffic can flow" -j KUBE-NODEPORT-NON-LOCAL
-I INPUT 1 -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
-I INPUT 1 -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-I FORWARD 1 -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-I FORWARD 1 -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-I OUTPUT 1 -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-I INPUT 1 -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-I FORWARD 1 -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-I OUTPUT 1 -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
${NON_LOCAL_RETURN_LINE}COMMIT
`,
  );
  const onlyOne = renderRestoreInput(
    { ...v4, portals: [] },
    JUMPS.filter((j) => j.table === 'filter'),
  );
  assert.equal(onlyOne.nat, `${NAT_HEAD}COMMIT\n`);
});

test('the jumps, each inserted at position 1 in order, leave the DROP/REJECT chains before the ACCEPTs', () => {
  const builtins = new Map<string, string[]>();
  for (const line of renderJumps(JUMPS).filter) {
    const [, from, , ...rest] = line.split(' ');
    const list = builtins.get(from!) ?? [];
    list.unshift(rest.at(-1)!);
    builtins.set(from!, list);
  }
  assert.deepEqual(Object.fromEntries(builtins), {
    INPUT: ['KUBE-PROXY-FIREWALL', 'KUBE-EXTERNAL-SERVICES', 'KUBE-NODEPORTS', 'KUBE-NODEPORT-NON-LOCAL'],
    FORWARD: ['KUBE-PROXY-FIREWALL', 'KUBE-SERVICES', 'KUBE-EXTERNAL-SERVICES'],
    OUTPUT: ['KUBE-PROXY-FIREWALL', 'KUBE-SERVICES'],
  });
  // The DROP/REJECT hooks see new connections only (as kube-proxy's), so replies are never dropped.
  for (const j of JUMPS.filter(
    (j) =>
      j.table === 'filter' &&
      ['KUBE-SERVICES', 'KUBE-EXTERNAL-SERVICES', 'KUBE-PROXY-FIREWALL'].includes(j.to),
  ))
    assert.deepEqual(j.args.slice(0, 4), ['-m', 'conntrack', '--ctstate', 'NEW'], `${j.from} -> ${j.to}`);
});

test('renderRestoreInput is deterministic: same bytes twice and for any input order', () => {
  const portals = [...manyPortals(200), dns, webNodePort];
  const input = { ...v4, portals };
  const a = restoreText(renderRestoreInput(input, JUMPS));
  assert.equal(restoreText(renderRestoreInput(input, JUMPS)), a);
  assert.equal(restoreText(renderRestoreInput({ ...input, portals: [...portals].reverse() }, JUMPS)), a);
  const shuffledLocal = {
    ...v4,
    nodePortAddresses: ['10.0.0.0/8'],
    localAddresses: ['10.0.0.2', '10.0.0.1'],
  };
  assert.equal(
    restoreText(renderRestoreInput({ ...shuffledLocal, portals })),
    restoreText(renderRestoreInput({ ...shuffledLocal, localAddresses: ['10.0.0.1', '10.0.0.2'], portals })),
  );
});

const BUILTIN = new Set(['PREROUTING', 'INPUT', 'OUTPUT', 'POSTROUTING', 'FORWARD']);
const TARGETS = new Set(['REDIRECT', 'DNAT', 'ACCEPT', 'REJECT', 'DROP', 'RETURN']);

test('no rule jumps to or is appended to an undeclared chain', () => {
  const ctxs = [v4, v6, { ...v4, bindAddress: '192.168.1.9' }, pods, cbr];
  const portals = [
    ...manyPortals(50),
    dns,
    webNodePort,
    etpLocal({ loadBalancerSourceRanges: ['10.0.0.0/8'] }),
    itpLocal({ clusterIPs: ['10.0.0.21'], endpoints: { local: false } }),
    {
      ...noEndpoints,
      servicePort: { ...noEndpoints.servicePort, key: 'default/none:http/TCP' as ServicePortKey },
    },
    dualStack,
  ];
  for (const ctx of ctxs) {
    const text = renderRestoreInput({ ...ctx, portals }, JUMPS);
    for (const table of ['nat', 'filter'] as const) {
      const lines = text[table].split('\n');
      const declared = new Set(lines.filter((l) => l.startsWith(':')).map((l) => l.slice(1).split(' ')[0]));
      for (const line of lines.filter((l) => l.startsWith('-'))) {
        const args = splitLine(line);
        const chain = args[1]!;
        assert.ok(declared.has(chain) || BUILTIN.has(chain), `${table}: ${line}`);
        const target = args[args.indexOf('-j') + 1]!;
        assert.ok(declared.has(target) || TARGETS.has(target), `${table}: undefined target in ${line}`);
      }
    }
  }
});

const hostile = [
  'default/a b:c',
  'default/"quoted":"x"',
  "default/'single':x",
  'default/x:y\n-A KUBE-PORTALS-HOST -j ACCEPT',
  'default/x:y\r\nCOMMIT\n*filter',
  'default/back\\slash:"\\"',
  'default/#comment:x',
  '-j ACCEPT',
  'ns/' + 'long-'.repeat(200) + ':p',
  'ns/ünïcödé:😀',
  '',
];

test('hostile names change nothing but their own comment, in every kind of rule', () => {
  const benigns = [
    portal('default', 'benign', 'p', {
      clusterIPs: ['10.0.0.50'],
      externalIPs: ['203.0.113.9'],
      nodePort: 30050,
      proxyPort: 40050,
    }),
    // `/local` comments, health check, firewall and DROP comments (quoted, with spaces).
    etpLocal({ loadBalancerSourceRanges: ['10.0.0.0/8'], endpoints: { local: false } }),
    { ...noEndpoints, servicePort: { ...noEndpoints.servicePort, loadBalancerSourceRanges: [] } },
  ];
  for (const benign of benigns) {
    const plain = benign.servicePort.name;
    const render = (p: PortalSpec) =>
      restoreText(renderRestoreInput({ ...pods, portals: [p] }, JUMPS)).split('\n');
    const want = render(benign);
    for (const name of hostile) {
      const evil: PortalSpec = {
        ...benign,
        servicePort: { ...benign.servicePort, name: name as ServicePortName },
      };
      const got = render(evil);
      assert.equal(got.length, want.length, JSON.stringify(name));
      for (let i = 0; i < got.length; i++) {
        const g = splitLine(got[i]!);
        const w = splitLine(want[i]!);
        assert.equal(g.length, w.length, `${JSON.stringify(name)}: line ${i}: ${got[i]}`);
        const at = w.indexOf('--comment');
        for (let k = 0; k < w.length; k++) {
          if (k === at + 1 && w[k]!.startsWith(plain)) {
            const suffix = w[k]!.slice(plain.length);
            assert.ok(
              g[k]!.length <= MAX_COMMENT_LENGTH && g[k]!.endsWith(suffix),
              `${JSON.stringify(name)}: ${g[k]}`,
            );
            assert.match(g[k]!.slice(0, g[k]!.length - suffix.length), /^[A-Za-z0-9._:/-]+$/);
          } else assert.equal(g[k], w[k], `${JSON.stringify(name)}: line ${i}`);
        }
      }
    }
  }
});

test('sanitizeComment keeps valid names and caps the length', () => {
  assert.equal(sanitizeComment('kube-system/kube-dns:dns-tcp'), 'kube-system/kube-dns:dns-tcp');
  assert.equal(sanitizeComment('default/web:'), 'default/web:');
  assert.equal(sanitizeComment('a b"c'), 'a_b_c');
  assert.equal(sanitizeComment('x'.repeat(1000)).length, MAX_COMMENT_LENGTH);
  assert.equal(sanitizeComment(''), '_');
});

test('invalid data is never rendered: bad IPs, ports, protocols, proxy port 0', () => {
  const p = portal('default', 'bad', 'x', {
    clusterIPs: ['10.0.0.1 -j ACCEPT', '10.0.0.2'],
    externalIPs: ['not-an-ip', '1.2.3.4/32'],
    loadBalancerIPs: [''],
    nodePort: 70000,
    proxyPort: 40000,
  });
  const text = renderRestoreInput({ ...v4, portals: [p] });
  assert.ok(text.nat.startsWith(NAT_HEAD));
  const portalLines = text.nat.slice(NAT_HEAD.length).split('\n');
  assert.equal(portalLines.filter((l) => l.startsWith('-A')).length, 2);
  assert.ok(text.nat.includes('-A KUBE-PORTALS-CONTAINER-02 -m comment --comment default/bad:x'));
  assert.equal(text.filter, filterOf(accept('default/bad:x', 40000)));
  for (const bad of [{ proxyPort: 0 }, { localProxyPort: 70000 }, { localProxyPort: -1 }]) {
    const got = renderRestoreInput({ ...v4, portals: [{ ...p, ...bad }] });
    assert.equal(got.nat, `${NAT_HEAD}COMMIT\n`, JSON.stringify(bad));
    assert.equal(got.filter, FILTER_EMPTY, JSON.stringify(bad));
  }
  // Source ranges and detectors that are no CIDR of the family never reach a line.
  const lb = portal('default', 'lb', 'x', {
    clusterIPs: ['10.0.0.3'],
    loadBalancerIPs: ['198.51.100.3'],
    loadBalancerSourceRanges: ['10.0.0.0/8 -j ACCEPT', '10.0.0.0/33', 'x/8', '10.0.0.0/8\n-A', '10.1.0.0/16'],
  });
  const ranges = restoreText(renderRestoreInput({ ...v4, portals: [lb] }));
  assert.deepEqual(
    [...ranges.matchAll(/ -s (\S+)/g)].map((m) => m[1]),
    ['10.1.0.0/16', '10.1.0.0/16'],
  );
});

test('a loopback or wrong-family host IP or bind address is refused', () => {
  assert.throws(() => renderRestoreInput({ ...v4, hostIP: '127.0.0.1', portals: [web] }), TypeError);
  assert.throws(
    () =>
      renderRestoreInput({
        ...v6,
        hostIP: '::1',
        portals: [portal('a', 'b', 'c', { clusterIPs: ['fd00::1'] })],
      }),
    TypeError,
  );
  assert.throws(() => renderRestoreInput({ ...v4, bindAddress: 'fd00::1', portals: [web] }), TypeError);
});

// A model of iptables-restore --noflush on our chains: enough to check that full + delta = full.
function apply(model: Map<string, string[]>, text: string): void {
  let table = '';
  for (const line of text.split('\n')) {
    if (line.startsWith('*')) table = line.slice(1);
    else if (line.startsWith(':')) model.set(`${table} ${line.slice(1).split(' ')[0]}`, []);
    else if (line.startsWith('-A ') || line.startsWith('-D ')) {
      const [op, chain, ...rest] = line.split(' ');
      const key = `${table} ${chain}`;
      const rules = model.get(key);
      if (rules === undefined) throw new Error(`no chain ${key}`);
      const spec = rest.join(' ');
      if (op === '-A') rules.push(spec);
      else {
        const i = rules.indexOf(spec);
        if (i < 0) throw new Error(`-D of a missing rule: ${line}`);
        rules.splice(i, 1);
      }
    }
  }
}

function modelOf(text: string): Map<string, string[]> {
  const m = new Map<string, string[]>();
  apply(m, text);
  for (const [k, rules] of m) m.set(k, [...rules].sort());
  return m;
}

const deltaCases: { name: string; prev: PortalSpec[]; next: PortalSpec[]; nat: string; filter: string }[] = [
  {
    name: 'add',
    prev: [web],
    next: [web, dns],
    nat: `*nat
-A KUBE-PORTALS-CONTAINER-0A -m comment --comment default/dns:dns -p udp -m udp --dport 53 -d 10.0.0.10/32 -j REDIRECT --to-ports 40001
-A KUBE-PORTALS-HOST-0A -m comment --comment default/dns:dns -p udp -m udp --dport 53 -d 10.0.0.10/32 -j DNAT --to-destination 192.168.1.5:40001
COMMIT
`,
    filter: `*filter
${accept('default/dns:dns', 40001, 'udp')}COMMIT
`,
  },
  {
    name: 'remove',
    prev: [web, dns],
    next: [web],
    nat: `*nat
-D KUBE-PORTALS-CONTAINER-0A -m comment --comment default/dns:dns -p udp -m udp --dport 53 -d 10.0.0.10/32 -j REDIRECT --to-ports 40001
-D KUBE-PORTALS-HOST-0A -m comment --comment default/dns:dns -p udp -m udp --dport 53 -d 10.0.0.10/32 -j DNAT --to-destination 192.168.1.5:40001
COMMIT
`,
    filter: `*filter
-D${accept('default/dns:dns', 40001, 'udp').slice(2)}COMMIT
`,
  },
  {
    name: 'change: a NodePort is added, the ClusterIP rules and the ACCEPT stay in place',
    prev: [web, dns],
    next: [webNodePort, dns],
    nat: `*nat
-A KUBE-NODEPORT-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -j REDIRECT --to-ports 40002
-A KUBE-NODEPORT-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -j DNAT --to-destination 192.168.1.5:40002
COMMIT
`,
    filter: '',
  },
  {
    name: 'change: a new proxy port replaces every rule of that service port',
    prev: [dns, web],
    next: [dns, { ...web, proxyPort: 40099 }],
    nat: `*nat
-D KUBE-PORTALS-CONTAINER-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-D KUBE-PORTALS-HOST-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-CONTAINER-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40099
-A KUBE-PORTALS-HOST-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40099
COMMIT
`,
    filter: `*filter
-D${accept('default/web:http', 40002).slice(2)}${accept('default/web:http', 40099)}COMMIT
`,
  },
  {
    name: 'change: a new ClusterIP moves the rules to the shard of the new IP',
    prev: [dns, web],
    next: [dns, { ...web, servicePort: { ...web.servicePort, clusterIPs: ['10.0.0.63'] } }],
    nat: `*nat
-D KUBE-PORTALS-CONTAINER-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-D KUBE-PORTALS-HOST-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-CONTAINER-1F -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.63/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST-1F -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.63/32 -j DNAT --to-destination 192.168.1.5:40002
COMMIT
`,
    filter: '',
  },
  {
    name: 'unchanged (new objects, same values): nothing',
    prev: [dns, web],
    next: [{ ...dns }, { ...web, servicePort: { ...web.servicePort } }],
    nat: '',
    filter: '',
  },
];

for (const c of deltaCases) {
  test(`renderDelta: ${c.name}`, () => {
    const got = renderDelta(c.prev, c.next, v4);
    assert.equal(got.nat, c.nat);
    assert.equal(got.filter, c.filter);
    // Maps work as well as arrays.
    const asMap = (ps: PortalSpec[]) => new Map(ps.map((p) => [p.servicePort.key, p]));
    assert.deepEqual(renderDelta(asMap(c.prev), asMap(c.next), v4), got);
  });
}

/**
 * Each chain's rules per service port (the comment without `/local` and kube-proxy's wording), in
 * order: what a delta must get right. The order between service ports does not matter.
 */
function perServicePort(model: Map<string, string[]>): Map<string, string[]> {
  const out = new Map<string, string[]>();
  for (const [chain, rules] of model)
    for (const rule of rules) {
      const name = /--comment "?([^ "]+?)(\/local)?[ "]/.exec(rule)?.[1] ?? '';
      const key = `${chain} ${name}`;
      out.set(key, [...(out.get(key) ?? []), rule]);
    }
  return new Map([...out].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
}

test('renderDelta: full(prev) + delta = full(next) over random changes at scale, rule order within each service port kept', () => {
  let seed = 42;
  const rand = (n: number) => {
    seed = (seed * 1103515245 + 12345) % 2 ** 31;
    return seed % n;
  };
  let prev = manyPortals(500);
  const ctx = { ...pods, nodePortAddresses: ['10.0.0.0/8'], localAddresses: ['10.0.0.1', '10.0.0.2'] };
  // What the kernel would hold, rule order included: deltas applied one after the other.
  const ordered = new Map<string, string[]>();
  apply(ordered, restoreText(renderRestoreInput({ ...ctx, portals: prev })));
  const bool = () => rand(2) === 1;
  for (let round = 0; round < 40; round++) {
    const next = [...prev];
    for (let k = 0; k < 5; k++) {
      const i = rand(next.length);
      const p = next[i]!;
      const choice = rand(6);
      if (choice === 0) next.splice(i, 1);
      else if (choice === 1) next[i] = { ...p, proxyPort: 1 + rand(65535) };
      else if (choice === 2)
        next[i] = {
          ...p,
          servicePort: {
            ...p.servicePort,
            externalIPs: [`203.0.113.${rand(255)}`],
            nodePort: 30000 + rand(100),
          },
        };
      else if (choice === 3)
        // Endpoints come and go (0↔N, local ones too).
        next[i] = {
          ...p,
          endpoints: { ...p.endpoints, IPv4: { any: bool(), cluster: bool(), local: bool() } },
        };
      else if (choice === 4)
        // An ETP Local LoadBalancer with ranges around and inside the pod CIDR.
        next[i] = {
          ...p,
          localProxyPort: 1 + rand(65535),
          servicePort: {
            ...p.servicePort,
            loadBalancerIPs: [`198.51.100.${rand(255)}`],
            loadBalancerSourceRanges: [['10.0.0.0/8'], ['10.244.1.0/24', '203.0.113.0/24'], []][rand(3)]!,
            externalPolicyLocal: true,
            externallyAccessible: true,
            healthCheckNodePort: rand(2) * (32000 + rand(100)),
          },
        };
      else
        next.push(
          portal('added', `s${round}-${k}`, 'p', {
            clusterIPs: [`10.99.${round}.${k}`],
            proxyPort: 1 + rand(65535),
          }),
        );
    }
    const model = modelOf(restoreText(renderRestoreInput({ ...ctx, portals: prev })));
    const delta = restoreText(renderDelta(prev, next, ctx));
    assert.ok(delta.split('\n').length < 80, `round ${round}: delta of ${delta.split('\n').length} lines`);
    assertDeltaTouchesNoDispatch(delta, `round ${round}`);
    apply(model, delta);
    for (const [k, rules] of model) model.set(k, [...rules].sort());
    const full = restoreText(renderRestoreInput({ ...ctx, portals: next }));
    assert.deepEqual(model, modelOf(full), `round ${round}`);
    apply(ordered, delta);
    const wanted = new Map<string, string[]>();
    apply(wanted, full);
    assert.deepEqual(perServicePort(ordered), perServicePort(wanted), `round ${round}: order`);
    prev = next;
  }
});

const policyDeltas: {
  name: string;
  ctx: RuleContext;
  prev: PortalSpec[];
  next: PortalSpec[];
  want: string;
}[] = [
  {
    name: 'endpoints 0 → N: the NAT rules appended, the REJECTs deleted, the ACCEPT untouched',
    ctx: v4,
    prev: [{ ...webNodePort, endpoints: { IPv4: NONE, IPv6: NONE } }],
    next: [webNodePort],
    want: `*nat
-A KUBE-PORTALS-CONTAINER-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-NODEPORT-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -j REDIRECT --to-ports 40002
-A KUBE-NODEPORT-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -j DNAT --to-destination 192.168.1.5:40002
COMMIT
*filter
-D KUBE-SERVICES -m comment --comment "default/web:http has no endpoints" -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REJECT
-D KUBE-EXTERNAL-SERVICES -m comment --comment "default/web:http has no endpoints" -p tcp -m tcp --dport 30080 -m addrtype --dst-type LOCAL -j REJECT
COMMIT
`,
  },
  {
    name: 'endpoints N → 0: the NAT rules deleted, REJECTs appended',
    ctx: v4,
    prev: [webNodePort],
    next: [{ ...webNodePort, endpoints: { IPv4: NONE, IPv6: NONE } }],
    want: `*nat
-D KUBE-PORTALS-CONTAINER-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-D KUBE-PORTALS-HOST-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
-D KUBE-NODEPORT-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -j REDIRECT --to-ports 40002
-D KUBE-NODEPORT-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -j DNAT --to-destination 192.168.1.5:40002
COMMIT
*filter
-A KUBE-SERVICES -m comment --comment "default/web:http has no endpoints" -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REJECT
-A KUBE-EXTERNAL-SERVICES -m comment --comment "default/web:http has no endpoints" -p tcp -m tcp --dport 30080 -m addrtype --dst-type LOCAL -j REJECT
COMMIT
`,
  },
  {
    name: 'ETP Local, the last local endpoint goes: the catch-all deleted, the pod rule before it kept, a DROP',
    ctx: pods,
    prev: [etpLocal({ nodePort: 0, healthCheckNodePort: 0 })],
    next: [etpLocal({ nodePort: 0, healthCheckNodePort: 0, endpoints: { local: false } })],
    want: `*nat
-D KUBE-PORTALS-CONTAINER-01 -m comment --comment default/lb:http/local -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -j REDIRECT --to-ports 40003
COMMIT
*filter
-A KUBE-EXTERNAL-SERVICES -m comment --comment "default/lb:http has no local endpoints" -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -j DROP
COMMIT
`,
  },
  {
    // A multiset difference would delete the pod rule and append the new one after the unchanged
    // catch-all: pods would reach the local list. From the first rule that differs, all are replaced.
    name: 'ETP Local, a new cluster proxy port: the pod rule and the catch-all after it replaced in order',
    ctx: pods,
    prev: [etpLocal({ nodePort: 0, healthCheckNodePort: 0, clusterIPs: ['10.0.0.1'] })],
    next: [etpLocal({ nodePort: 0, healthCheckNodePort: 0, clusterIPs: ['10.0.0.1'], proxyPort: 40004 })],
    want: `*nat
-D KUBE-PORTALS-CONTAINER-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 10.0.0.1/32 -j REDIRECT --to-ports 40002
-D KUBE-PORTALS-CONTAINER-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 10.244.0.0/16 -j REDIRECT --to-ports 40002
-D KUBE-PORTALS-CONTAINER-01 -m comment --comment default/lb:http/local -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -j REDIRECT --to-ports 40003
-D KUBE-PORTALS-HOST-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 10.0.0.1/32 -j DNAT --to-destination 192.168.1.5:40002
-D KUBE-PORTALS-HOST-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-CONTAINER-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 10.0.0.1/32 -j REDIRECT --to-ports 40004
-A KUBE-PORTALS-CONTAINER-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 10.244.0.0/16 -j REDIRECT --to-ports 40004
-A KUBE-PORTALS-CONTAINER-01 -m comment --comment default/lb:http/local -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -j REDIRECT --to-ports 40003
-A KUBE-PORTALS-HOST-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 10.0.0.1/32 -j DNAT --to-destination 192.168.1.5:40004
-A KUBE-PORTALS-HOST-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -j DNAT --to-destination 192.168.1.5:40004
COMMIT
*filter
-D KUBE-NODEPORT-NON-LOCAL -m comment --comment default/lb:http -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40002 -j ACCEPT
-D KUBE-NODEPORT-NON-LOCAL -m comment --comment default/lb:http/local -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40003 -j ACCEPT
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/lb:http -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40004 -j ACCEPT
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/lb:http/local -p tcp -m conntrack --ctstate DNAT --ctreplsrcport 40003 -j ACCEPT
COMMIT
`,
  },
  {
    name: 'source ranges change: the firewall stays, the LB IP rules follow',
    ctx: v4,
    prev: [
      portal('default', 'lb', 'http', {
        clusterIPs: ['10.0.0.20'],
        loadBalancerIPs: ['198.51.100.1'],
        loadBalancerSourceRanges: ['203.0.113.0/24'],
        proxyPort: 40002,
      }),
    ],
    next: [
      portal('default', 'lb', 'http', {
        clusterIPs: ['10.0.0.20'],
        loadBalancerIPs: ['198.51.100.1'],
        loadBalancerSourceRanges: ['198.18.0.0/15'],
        proxyPort: 40002,
      }),
    ],
    want: `*nat
-D KUBE-PORTALS-CONTAINER-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 203.0.113.0/24 -j REDIRECT --to-ports 40002
-D KUBE-PORTALS-HOST-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 203.0.113.0/24 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-CONTAINER-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 198.18.0.0/15 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST-01 -m comment --comment default/lb:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -s 198.18.0.0/15 -j DNAT --to-destination 192.168.1.5:40002
COMMIT
`,
  },
];

for (const c of policyDeltas) {
  test(`renderDelta: ${c.name}`, () => {
    const got = renderDelta(c.prev, c.next, c.ctx);
    assert.equal(restoreText(got), c.want);
    // Applied to the rules in place, rule order included, it gives what a full render would.
    const model = new Map<string, string[]>();
    apply(model, restoreText(renderRestoreInput({ ...c.ctx, portals: c.prev })));
    apply(model, restoreText(got));
    const want = new Map<string, string[]>();
    apply(want, restoreText(renderRestoreInput({ ...c.ctx, portals: c.next })));
    assert.deepEqual(perServicePort(model), perServicePort(want));
  });
}

test('renderDelta: every field the rules read is compared (a change of it alone is a delta)', () => {
  const base = etpLocal({ loadBalancerSourceRanges: ['10.0.0.0/8'] });
  const sp = base.servicePort;
  const changes: [string, PortalSpec][] = [
    ['localProxyPort', { ...base, localProxyPort: 40009 }],
    [
      'endpoints.IPv4.any',
      {
        ...base,
        endpoints: {
          ...base.endpoints,
          IPv4: { ...base.endpoints.IPv4, any: false, cluster: false, local: false },
        },
      },
    ],
    [
      'endpoints.IPv4.cluster',
      { ...base, endpoints: { ...base.endpoints, IPv4: { ...base.endpoints.IPv4, cluster: false } } },
    ],
    [
      'endpoints.IPv4.local',
      { ...base, endpoints: { ...base.endpoints, IPv4: { ...base.endpoints.IPv4, local: false } } },
    ],
    [
      'loadBalancerSourceRanges',
      { ...base, servicePort: { ...sp, loadBalancerSourceRanges: ['10.1.0.0/16'] } },
    ],
    ['externalPolicyLocal', { ...base, servicePort: { ...sp, externalPolicyLocal: false } }],
    ['internalPolicyLocal', { ...base, servicePort: { ...sp, internalPolicyLocal: true } }],
    ['healthCheckNodePort', { ...base, servicePort: { ...sp, healthCheckNodePort: 32001 } }],
  ];
  for (const [what, next] of changes)
    assert.notEqual(restoreText(renderDelta([base], [next], pods)), '', what);
  // IPv6 flags matter to the IPv6 rules.
  const six = portal('default', 'six', 'p', { clusterIPs: ['fd00::20'] });
  assert.notEqual(
    restoreText(renderDelta([six], [{ ...six, endpoints: { ...six.endpoints, IPv6: NONE } }], v6)),
    '',
  );
});

test('renderRestoreInput with a listener port range: one ACCEPT per protocol for the range after the RETURN, none per listener; deltas leave the filter table alone', () => {
  const ctx: RuleContext = { ...v4, listenerPorts: { base: 40000, size: 64 } };
  const a = portal('default', 'a', 'http', { clusterIPs: ['10.96.0.1'], proxyPort: 40002 });
  const b = portal('default', 'b', 'http', { clusterIPs: ['10.96.0.2'], proxyPort: 40063 });
  const outside = portal('default', 'c', 'http', { clusterIPs: ['10.96.0.3'], proxyPort: 50000 });
  const range = (proto: string) =>
    `-A KUBE-NODEPORT-NON-LOCAL -m comment --comment "kube-userspace-proxy listener ports" -p ${proto} -m conntrack --ctstate DNAT --ctreplsrcport 40000:40063 -j ACCEPT\n`;
  // A port outside the range (none is handed out there) keeps its own ACCEPT.
  assert.equal(
    renderRestoreInput({ ...ctx, portals: [a, b, outside] }).filter,
    filterOf(range('tcp'), range('udp'), accept('default/c:http', 50000)),
  );
  // Without a range (the kernel picks the ports): one ACCEPT per listener, as before.
  assert.equal(
    renderRestoreInput({ ...v4, portals: [a, b] }).filter,
    filterOf(accept('default/a:http', 40002), accept('default/b:http', 40063)),
  );
  // Adding, moving and removing listeners inside the range: nothing for the filter table.
  assert.equal(renderDelta([a], [a, b], ctx).filter, '');
  assert.equal(renderDelta([a, b], [{ ...a, proxyPort: 40010 }, b], ctx).filter, '');
  assert.equal(renderDelta([a, b], [b], ctx).filter, '');
  assert.notEqual(renderDelta([a, b], [b], ctx).nat, '');
  // One port: no `:`.
  assert.match(
    renderRestoreInput({ ...v4, listenerPorts: { base: 40000, size: 1 }, portals: [] }).filter,
    /--ctreplsrcport 40000 -j ACCEPT/,
  );
  // Another range renders other rules: a full render, not a delta.
  assert.ok(!sameContext(ctx, { ...ctx, listenerPorts: { base: 40000, size: 65 } }));
  assert.ok(!sameContext(ctx, v4));
  assert.ok(sameContext(ctx, { ...ctx, listenerPorts: { base: 40000, size: 64 } }));
});

test('sameContext: node addresses outside --nodeport-addresses do not force a full render', () => {
  const a = { ...v4, nodePortAddresses: ['192.168.1.0/24'], localAddresses: ['192.168.1.5', '10.0.0.1'] };
  assert.ok(sameContext(a, { ...a, localAddresses: ['10.0.0.2', '192.168.1.5'] }));
  assert.ok(!sameContext(a, { ...a, localAddresses: ['192.168.1.6'] }));
  assert.ok(sameContext(v4, { ...v4, localAddresses: ['10.0.0.1'] }));
  assert.ok(!sameContext(v4, { ...v4, hostIP: '192.168.1.6' }));
  assert.ok(!sameContext(v4, { ...v4, bindAddress: '192.168.1.5' }));
  // The local detector decides the pod short-circuit rules: a change of it is a full render.
  assert.ok(!sameContext(v4, pods));
  assert.ok(!sameContext(pods, cbr));
  assert.ok(sameContext(pods, { ...pods, localDetector: { ...pods.localDetector! } }));
});

test('every chain we render is one cleanup removes', () => {
  const text = restoreText(renderRestoreInput({ ...v4, portals: [webNodePort] }, JUMPS));
  const declared = text
    .split('\n')
    .filter((l) => l.startsWith(':'))
    .map((l) => l.slice(1).split(' ')[0]);
  assert.deepEqual(declared.sort(), ALL_CHAINS.map((c) => c.chain).sort());
});

test('every chain we render is ours by name in its table, and so are shard chains of another shard count', () => {
  for (const { chain, table } of ALL_CHAINS) {
    assert.ok(isOurChain(chain, table), chain);
    assert.ok(isOurChain(chain), chain);
  }
  for (const name of ['KUBE-PORTALS-CONTAINER-3F', 'KUBE-PORTALS-HOST-20', 'KUBE-PORTALS-HOST-FF'])
    assert.ok(isOurChain(name, 'nat') && !isOurChain(name, 'filter'), name);
  for (const name of ['KUBE-SERVICES', 'KUBE-EXTERNAL-SERVICES', 'KUBE-PROXY-FIREWALL', 'KUBE-NODEPORTS'])
    assert.ok(isOurChain(name, 'filter') && !isOurChain(name, 'nat'), `${name}: ours in filter only`);
  // An iptables-mode kube-proxy's nat chains (and anyone else's) are never ours.
  for (const name of ['KUBE-SVC-ABC', 'KUBE-POSTROUTING', 'KUBE-MARK-MASQ', 'KUBE-FORWARD', 'KUBE-FIREWALL'])
    assert.ok(!isOurChain(name, 'nat') && !isOurChain(name, 'filter') && !isOurChain(name), name);
  for (const name of ['KUBE-PORTALS-CONTAINERX', 'KUBE-PORTALS-HOST-', 'DOCKER', 'OUTPUT'])
    assert.ok(!isOurChain(name), name);
});

test('portalShard: the lowest 5 bits of an IPv4 destination', () => {
  assert.equal(PORTAL_SHARDS, 32);
  const cases: [string, number][] = [
    ['10.0.0.20', 20],
    ['10.0.0.63', 31],
    ['10.0.0.32', 0],
    ['10.0.0.0', 0],
    ['10.0.0.10', 10],
    ['192.168.1.255', 31],
    ['10.96.200.33', 1],
  ];
  for (const [ip, shard] of cases) assert.equal(portalShard(ip), shard, ip);
});

test('portalShard: the lowest 5 bits of an IPv6 destination, whatever its spelling', () => {
  const cases: [string, number][] = [
    ['fd00::1f', 31],
    ['fd00::20', 0],
    ['fd00::', 0],
    ['::', 0],
    ['::ffff:10.0.0.5', 5],
    ['::ffff:10.0.0.37', 5],
    ['fd00:96::7b', 27],
    ['FD00:96::7B', 27],
    ['fd00:96:0:0:0:0:0:3a', 26],
    ['2001:db8::a', 10],
    ['2001:db8::1:0', 0],
  ];
  for (const [ip, shard] of cases) assert.equal(portalShard(ip), shard, ip);
});

test('shard chain names: two upper-case hex digits, at most 28 characters (iptables chain name limit)', () => {
  assert.equal(portalShardChain(KUBE_PORTALS_CONTAINER, 10), 'KUBE-PORTALS-CONTAINER-0A');
  assert.equal(portalShardChain(KUBE_PORTALS_CONTAINER, 0), 'KUBE-PORTALS-CONTAINER-00');
  assert.equal(portalShardChain(KUBE_PORTALS_HOST, 31), 'KUBE-PORTALS-HOST-1F');
  assert.equal(portalShardChain(KUBE_PORTALS_HOST, 20), 'KUBE-PORTALS-HOST-14');
  const shards = CHAINS.nat.filter((c) => /^KUBE-PORTALS-(CONTAINER|HOST)-/.test(c));
  assert.deepEqual(shards, [
    ...SHARD_NUMBERS.map((k) => `KUBE-PORTALS-CONTAINER-${hex2(k)}`),
    ...SHARD_NUMBERS.map((k) => `KUBE-PORTALS-HOST-${hex2(k)}`),
  ]);
  for (const c of [...CHAINS.nat, ...CHAINS.filter]) {
    assert.ok(c.length <= 28, `${c}: ${c.length} characters`);
    assert.match(c, /^[A-Z0-9-]+$/);
  }
});

test('dispatchRules: one rule per shard and portal chain, for both families', () => {
  const want = (family: IPFamily) =>
    dispatchLines(family)
      .split('\n')
      .filter((l) => l !== '')
      .map((l) => {
        const [, chain, ...spec] = l.split(' ');
        return { table: 'nat', chain, spec: spec.join(' ') };
      });
  assert.deepEqual(dispatchRules('IPv4'), want('IPv4'));
  assert.deepEqual(dispatchRules('IPv6'), want('IPv6'));
  assert.deepEqual(dispatchRules('IPv4')[20], {
    table: 'nat',
    chain: 'KUBE-PORTALS-CONTAINER',
    spec: '-d 0.0.0.20/0.0.0.31 -j KUBE-PORTALS-CONTAINER-14',
  });
  assert.deepEqual(dispatchRules('IPv6')[32 + 26], {
    table: 'nat',
    chain: 'KUBE-PORTALS-HOST',
    spec: '-d ::1a/::1f -j KUBE-PORTALS-HOST-1A',
  });
});

/** An address as a number (IPv4: 32 bits, IPv6: 128 bits, `::`, and a dotted IPv4 tail), parsed here. */
function ipBits(ip: string): bigint {
  if (isIP(ip) === 4) return ip.split('.').reduce((a, o) => (a << 8n) | BigInt(Number(o)), 0n);
  let s = ip;
  const tail = /(\d+\.\d+\.\d+\.\d+)$/.exec(s)?.[1];
  if (tail !== undefined) {
    const n = ipBits(tail);
    s = `${s.slice(0, -tail.length)}${(n >> 16n).toString(16)}:${(n & 0xffffn).toString(16)}`;
  }
  const [head = '', rest] = s.split('::');
  const h = head === '' ? [] : head.split(':');
  const t = rest === undefined || rest === '' ? [] : rest.split(':');
  const groups = rest === undefined ? h : [...h, ...Array<string>(8 - h.length - t.length).fill('0'), ...t];
  assert.equal(groups.length, 8, ip);
  return groups.reduce((a, g) => (a << 16n) | BigInt(`0x${g}`), 0n);
}

/** The target of the first dispatch rule of `chain` whose `-d addr/mask` matches `ip`, as the kernel does. */
function dispatchTarget(family: IPFamily, chain: string, ip: string): string[] {
  const targets: string[] = [];
  for (const r of dispatchRules(family)) {
    if (r.chain !== chain) continue;
    const m = /^-d (\S+)\/(\S+) -j (\S+)$/.exec(r.spec);
    assert.ok(m, r.spec);
    if ((ipBits(ip) & ipBits(m[2]!)) === ipBits(m[1]!)) targets.push(m[3]!);
  }
  return targets;
}

test('each destination matches exactly one dispatch rule, and it leads to the chain holding its rules', () => {
  const cases: [IPFamily, RuleContext, string[]][] = [
    [
      'IPv4',
      v4,
      [...Array(256).keys()].map((i) => `10.${i}.${(i * 7) & 255}.${i}`).concat(['203.0.113.7', '0.0.0.0']),
    ],
    [
      'IPv6',
      v6,
      [...Array(256).keys()]
        .map((i) => `fd00:96::${i.toString(16)}`)
        .concat(['fd00::', '2001:db8::1:ff3f', '::ffff:10.0.0.37', 'fd00:1:2:3:4:5:6:7']),
    ],
  ];
  for (const [family, ctx, ips] of cases) {
    for (const ip of ips) {
      // The IP as a ClusterIP, and as the LB IP of another service port.
      const other = family === 'IPv6' ? 'fd00:ffff::1' : '10.255.255.1';
      const rules = [
        ...portalRules(portal('default', 'x', 'p', { clusterIPs: [ip], proxyPort: 40000 }), ctx),
        ...portalRules(
          portal('default', 'y', 'p', { clusterIPs: [other], loadBalancerIPs: [ip], proxyPort: 40000 }),
          ctx,
        ).filter((r) => r.spec.includes(`-d ${ip}/`)),
      ].filter((r) => r.table === 'nat');
      assert.equal(rules.length, 4, ip);
      for (const base of [KUBE_PORTALS_CONTAINER, KUBE_PORTALS_HOST]) {
        const reached = dispatchTarget(family, base, ip);
        assert.equal(reached.length, 1, `${ip}: ${reached}`);
        const placed = rules.filter((r) => r.chain.startsWith(`${base}-`)).map((r) => r.chain);
        assert.deepEqual(placed, [reached[0], reached[0]], ip);
      }
    }
  }
});

test('two services in different shards go to different chains, and to no base portal chain', () => {
  const natChains = (rules: Rule[]) => new Set(rules.filter((r) => r.table === 'nat').map((r) => r.chain));
  const chains = (p: PortalSpec) => natChains(portalRules(p, v4));
  assert.deepEqual(chains(web), new Set(['KUBE-PORTALS-CONTAINER-14', 'KUBE-PORTALS-HOST-14']));
  assert.deepEqual(chains(dns), new Set(['KUBE-PORTALS-CONTAINER-0A', 'KUBE-PORTALS-HOST-0A']));
  const six = portal('default', 'six', 'p', { clusterIPs: ['fd00::1f'] });
  assert.deepEqual(
    natChains(portalRules(six, v6)),
    new Set(['KUBE-PORTALS-CONTAINER-1F', 'KUBE-PORTALS-HOST-1F']),
  );
});

const SHARD_OR_NODEPORT =
  /^(KUBE-PORTALS-(CONTAINER|HOST)-[0-9A-F]{2}|KUBE-NODEPORT-(CONTAINER|HOST|NON-LOCAL)|KUBE-(EXTERNAL-)?SERVICES|KUBE-PROXY-FIREWALL|KUBE-NODEPORTS)$/;

/** A delta names shard and NodePort chains only: never a base portal chain, a dispatch rule or a `:` line. */
function assertDeltaTouchesNoDispatch(delta: string, what: string): void {
  for (const line of delta.split('\n')) {
    if (line === '' || line === 'COMMIT' || line === '*nat' || line === '*filter') continue;
    const [op, chain] = line.split(' ');
    assert.ok(op === '-A' || op === '-D', `${what}: ${line}`);
    assert.match(chain ?? '', SHARD_OR_NODEPORT, `${what}: ${line}`);
    assert.doesNotMatch(line, /-j KUBE-|\/0\.0\.0\.31|\/::1f/, `${what}: ${line}`);
  }
}

test('a delta only names shard chains and never the dispatch rules, in both families', () => {
  const before = [
    portal('default', 'web', 'http', {
      clusterIPs: ['10.0.0.20', 'fd00:96::3a'],
      externalIPs: ['203.0.113.7', '2001:db8::7'],
      loadBalancerIPs: ['198.51.100.1', '2001:db8::1f'],
      nodePort: 30080,
      proxyPort: 40002,
    }),
    dns,
  ];
  const after = [{ ...before[0]!, proxyPort: 40099 }];
  for (const ctx of [v4, v6, { ...v4, bindAddress: '192.168.1.9' }]) {
    for (const [a, b] of [
      [before, after],
      [after, before],
      [[], before],
      [before, []],
    ]) {
      const delta = restoreText(renderDelta(a!, b!, ctx));
      assert.notEqual(delta, '');
      assertDeltaTouchesNoDispatch(delta, `${ctx.family} ${ctx.bindAddress}`);
    }
  }
  // The removal of every service deletes its portal rules from the shard chains, nothing else.
  assert.equal(
    renderDelta([web], [], v4).nat,
    `*nat
-D KUBE-PORTALS-CONTAINER-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-D KUBE-PORTALS-HOST-14 -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
COMMIT
`,
  );
});

test('PROXY protocol: external destinations go to their own listeners, the ClusterIP stays on the service port', () => {
  const spec = portal('default', 'web', 'http', {
    clusterIPs: ['10.0.0.20'],
    nodePort: 30080,
    externalIPs: ['203.0.113.7'],
    loadBalancerIPs: ['198.51.100.10'],
    proxyPort: 40000,
    portalPorts: new Map([
      ['203.0.113.7', { proxyPort: 40010, localProxyPort: 0 }],
      ['198.51.100.10', { proxyPort: 40020, localProxyPort: 0 }],
      ['node', { proxyPort: 40030, localProxyPort: 0 }],
    ]),
  });
  const lines = portalRules(spec, v4).map((r) => `-A ${r.chain} ${r.spec}`);
  const nat = (dst: string) => lines.filter((l) => l.includes(dst) && /REDIRECT|DNAT/.test(l));
  for (const l of nat('-d 10.0.0.20/32'))
    assert.match(l, /--comment default\/web:http .*(--to-ports 40000|:40000)$/);
  for (const l of nat('-d 203.0.113.7/32'))
    assert.match(l, /--comment default\/web:http\/to\/203\.0\.113\.7 .*(--to-ports 40010|:40010)$/);
  for (const l of nat('-d 198.51.100.10/32'))
    assert.match(l, /--comment default\/web:http\/to\/198\.51\.100\.10 .*(--to-ports 40020|:40020)$/);
  const nodePort = lines.filter((l) => l.includes('--dport 30080') && /REDIRECT|DNAT/.test(l));
  assert.ok(nodePort.length >= 2, 'container and host side');
  for (const l of nodePort)
    assert.match(l, /--comment default\/web:http\/to\/node .*(--to-ports 40030|:40030)$/);
  assert.equal(nat('-d 203.0.113.7/32').length, 2, 'container and host side');
  // Every listener is accepted by the filter rules (hosts whose INPUT policy is DROP).
  for (const port of [40000, 40010, 40020, 40030])
    assert.ok(
      lines.some((l) => l.includes(`--ctreplsrcport ${port} -j ACCEPT`)),
      `ACCEPT for the listener on ${port}`,
    );
  // Without portalPorts the same service port renders today's rules: every destination on 40000.
  const plain = portalRules({ ...spec, portalPorts: new Map() }, v4).map((r) => r.spec);
  assert.ok(plain.every((l) => !/4001\d|4002\d|4003\d|\/to\//.test(l)));
});
