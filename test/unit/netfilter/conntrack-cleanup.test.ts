// Which UDP conntrack entries a portal change leaves stale (kube-proxy conntrack/cleanup.go, and the
// older DeletedUDPClusterIPs / NewlyActiveUDPServices logic), and how IptablesPortals runs them.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { silentLogger } from '../../../src/lib/log.ts';
import { type ConntrackDeletion, conntrackDeletions } from '../../../src/netfilter/conntrack-cleanup.ts';
import type { Iptables } from '../../../src/netfilter/iptables.ts';
import { createIptables } from '../../../src/netfilter/iptables.ts';
import { IptablesPortals } from '../../../src/netfilter/iptables-portals.ts';
import type { Netfilter } from '../../../src/netfilter/netfilter.ts';
import type { PortalSpec } from '../../../src/proxier/portal-programmer.ts';
import type { IPFamily } from '../../../src/state/service-port.ts';
import { type PortalOptions, portal } from '../../helpers/portals.ts';

const dns = (o: PortalOptions = {}) =>
  portal('kube-system', 'kube-dns', 'dns', { protocol: 'UDP', clusterIPs: ['10.96.0.10'], port: 53, ...o });
const ext = {
  nodePort: 30053,
  externalIPs: ['192.0.2.10'],
  loadBalancerIPs: ['198.51.100.10'],
} satisfies PortalOptions;
const none = { any: false, cluster: false, local: false };

/** `ip:port` / `:nodePort`, compact for the table. */
function short(d: ConntrackDeletion): string {
  return `${d.origDst ?? ''}:${d.origDstPort ?? ''}`;
}

const ALL_EXT = ['10.96.0.10:53', '192.0.2.10:53', '198.51.100.10:53', ':30053'];

const cases: {
  name: string;
  previous: PortalSpec | undefined;
  next: PortalSpec | undefined;
  family?: IPFamily;
  want: string[];
}[] = [
  { name: 'nothing before or after', previous: undefined, next: undefined, want: [] },
  { name: 'unchanged', previous: dns(ext), next: dns(ext), want: [] },
  {
    name: 'removed service port: ClusterIP, externalIP, LB IP and NodePort flows',
    previous: dns(ext),
    next: undefined,
    want: ALL_EXT,
  },
  {
    name: 'new service port with endpoints: entries made before the rules existed',
    previous: undefined,
    next: dns(ext),
    want: ALL_EXT,
  },
  {
    name: 'new service port without endpoints: nothing was NATed before or after',
    previous: undefined,
    next: dns({ ...ext, endpoints: none }),
    want: [],
  },
  {
    name: 'no endpoints → some: every destination (kube-proxy NewlyActiveUDPServices)',
    previous: dns({ ...ext, endpoints: none }),
    next: dns(ext),
    want: ALL_EXT,
  },
  {
    name: 'some endpoints → none: entries would keep reaching a listener with nothing behind it',
    previous: dns(ext),
    next: dns({ ...ext, endpoints: none }),
    want: ALL_EXT,
  },
  {
    name: 'new proxy port (a new listener): the old NAT target is gone',
    previous: dns(ext),
    next: dns({ ...ext, proxyPort: 40001 }),
    want: ALL_EXT,
  },
  {
    name: 'an externalIP removed, an LB IP added; the others untouched',
    previous: dns(ext),
    next: dns({ ...ext, externalIPs: [], loadBalancerIPs: ['198.51.100.10', '198.51.100.11'] }),
    want: ['192.0.2.10:53', '198.51.100.11:53'],
  },
  {
    name: 'NodePort changed',
    previous: dns(ext),
    next: dns({ ...ext, nodePort: 30054 }),
    want: [':30053', ':30054'],
  },
  {
    name: 'service port number changed: old and new destinations',
    previous: dns(),
    next: dns({ port: 5353 }),
    want: ['10.96.0.10:53', '10.96.0.10:5353'],
  },
  {
    name: 'TCP service ports are left alone',
    previous: dns({ ...ext, protocol: 'TCP' }),
    next: undefined,
    want: [],
  },
  {
    name: 'ETP Local, second listener appears: only the external destinations',
    previous: dns({ ...ext, externalPolicyLocal: true, endpoints: { local: false } }),
    next: dns({ ...ext, externalPolicyLocal: true, localProxyPort: 40002, endpoints: { local: true } }),
    want: ['192.0.2.10:53', '198.51.100.10:53', ':30053'],
  },
  {
    name: 'ETP Local, the local listener moves: only the external destinations',
    previous: dns({ ...ext, externalPolicyLocal: true, localProxyPort: 40002, endpoints: { local: true } }),
    next: dns({ ...ext, externalPolicyLocal: true, localProxyPort: 40003, endpoints: { local: true } }),
    want: ['192.0.2.10:53', '198.51.100.10:53', ':30053'],
  },
  {
    name: 'ITP Local, the local endpoints go: only the ClusterIP',
    previous: dns({ ...ext, internalPolicyLocal: true, localProxyPort: 40002, endpoints: { local: true } }),
    next: dns({ ...ext, internalPolicyLocal: true, localProxyPort: 40002, endpoints: { local: false } }),
    want: ['10.96.0.10:53'],
  },
  {
    name: 'ITP Local only (no second listener): the local list is served on proxyPort',
    previous: dns({ internalPolicyLocal: true, endpoints: { cluster: false, local: true } }),
    next: dns({ internalPolicyLocal: true, endpoints: { cluster: false, local: true } }),
    want: [],
  },
  {
    name: 'dual-stack: the IPv6 side only sees IPv6 destinations',
    previous: dns({ clusterIPs: ['10.96.0.10', 'fd00::10'], externalIPs: ['192.0.2.10', '2001:db8::10'] }),
    next: undefined,
    family: 'IPv6',
    want: ['fd00::10:53', '2001:db8::10:53'],
  },
  {
    name: 'dual-stack: endpoints of one family come back, the other family is untouched',
    previous: dns({ clusterIPs: ['10.96.0.10', 'fd00::10'], IPv4: none }),
    next: dns({ clusterIPs: ['10.96.0.10', 'fd00::10'] }),
    family: 'IPv6',
    want: [],
  },
  {
    name: 'single-stack IPv4: nothing in IPv6, not even its NodePort',
    previous: dns(ext),
    next: undefined,
    family: 'IPv6',
    want: [],
  },
];

for (const c of cases) {
  test(`conntrackDeletions: ${c.name}`, () => {
    const family = c.family ?? 'IPv4';
    const got = conntrackDeletions(c.previous, c.next, family);
    assert.deepEqual(got.map(short), c.want);
    for (const d of got) assert.deepEqual([d.family, d.protocol], [family, 'udp']);
  });
}

test('flushConntrackUDP with a filter: -p before the port, -f ipv6 for IPv6', async () => {
  const calls: string[] = [];
  const ipt = createIptables(async (cmd, args) => {
    calls.push([cmd, ...args].join(' '));
    return {
      code: 1,
      stdout: '',
      stderr: 'conntrack v1.4.8 (conntrack-tools): 0 flow entries have been deleted.\n',
    };
  });
  await ipt.flushConntrackUDP({ family: 'IPv4', protocol: 'udp', origDst: '10.96.0.10', origDstPort: 53 });
  await ipt.flushConntrackUDP({ family: 'IPv4', protocol: 'udp', origDstPort: 30053 });
  await ipt.flushConntrackUDP({ family: 'IPv6', protocol: 'udp', origDstPort: 30053 });
  await ipt.flushConntrackUDP('fd00::10');
  assert.deepEqual(calls, [
    'conntrack -D --orig-dst 10.96.0.10 -p udp --orig-port-dst 53',
    'conntrack -D -p udp --orig-port-dst 30053',
    'conntrack -D -p udp --orig-port-dst 30053 -f ipv6',
    'conntrack -D --orig-dst fd00::10 -p udp -f ipv6',
  ]);
});

/** IptablesPortals over a Netfilter that accepts everything and an Iptables that records conntrack. */
function programmer(families: IPFamily[] = ['IPv4']) {
  const flushed: string[] = [];
  let fail = false;
  const netfilter = {
    sync: async () => {
      if (fail) throw new Error('restore failed');
    },
    update: async () => {
      if (fail) throw new Error('restore failed');
    },
  } as unknown as Netfilter;
  const iptables = {
    flushConntrackUDP: async (f: string | ConntrackDeletion) => {
      flushed.push(typeof f === 'string' ? f : `${f.family} ${short(f)}`);
    },
  } as unknown as Iptables;
  const portals = new IptablesPortals({
    netfilter,
    iptables,
    families,
    log: silentLogger(),
    hostInfo: () => ({ route4: '', route6: '', interfaces: {} }),
  });
  const take = () => flushed.splice(0);
  return { portals, take, failNext: (v: boolean) => (fail = v) };
}

test('IptablesPortals: deletions follow what was last programmed, through sync and update', async () => {
  const { portals, take, failNext } = programmer(['IPv4', 'IPv6']);
  const web = portal('default', 'web', 'http', { clusterIPs: ['10.96.0.1'] });
  const a = dns({ ...ext, endpoints: none });
  const opts = { full: true, initial: false };
  // The proxier's first sync: what made the entries in place is unknown, nothing is deleted.
  await portals.sync([web, dns(ext)], { full: true, initial: true });
  assert.deepEqual(take(), []);
  // The DNS service port loses its endpoints: every destination's entries go; TCP is ignored.
  await portals.sync([web, a], opts);
  assert.deepEqual(
    take(),
    ALL_EXT.map((d) => `IPv4 ${d}`),
  );
  // Endpoints arrive (a delta): every IPv4 destination; no IPv6 ClusterIP, nothing there.
  const b = dns(ext);
  await portals.update(new Map([[b.servicePort.key, b]]), () => [web, b], { initial: false });
  assert.deepEqual(
    take(),
    ALL_EXT.map((d) => `IPv4 ${d}`),
  );
  // A periodic full sync of the same state deletes nothing.
  await portals.sync([web, b], { full: false, initial: false });
  assert.deepEqual(take(), []);
  // A failed restore deletes nothing and forgets nothing: the old rules still serve.
  failNext(true);
  await assert.rejects(portals.sync([web], opts));
  assert.deepEqual(take(), []);
  failNext(false);
  // Missing from a sync: removed.
  await portals.sync([web], opts);
  assert.deepEqual(
    take(),
    ALL_EXT.map((d) => `IPv4 ${d}`),
  );
  await portals.sync([web], opts);
  assert.deepEqual(take(), []);
});
