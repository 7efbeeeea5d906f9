import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ALL_CHAINS, JUMPS } from '../../src/netfilter/chains.ts';
import { splitLine } from '../../src/netfilter/iptables.ts';
import {
  MAX_COMMENT_LENGTH,
  type PortalSpec,
  type RuleContext,
  renderDelta,
  renderRestoreInput,
  restoreText,
  sameContext,
  sanitizeComment,
} from '../../src/netfilter/rules.ts';
import type { ServicePortName } from '../../src/state/service-port.ts';
import { manyPortals, portal } from '../helpers/portals.ts';

const v4: RuleContext = {
  family: 'IPv4',
  bindAddress: '0.0.0.0',
  hostIP: '192.168.1.5',
  nodePortAddresses: [],
  localAddresses: [],
};
const v6: RuleContext = { ...v4, family: 'IPv6', bindAddress: '::', hostIP: 'fd00::5' };

const NAT_HEAD = `*nat
:KUBE-PORTALS-CONTAINER - [0:0]
:KUBE-PORTALS-HOST - [0:0]
:KUBE-NODEPORT-CONTAINER - [0:0]
:KUBE-NODEPORT-HOST - [0:0]
`;
const FILTER_EMPTY = `*filter
:KUBE-NODEPORT-NON-LOCAL - [0:0]
COMMIT
`;

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
    name: 'ClusterIP TCP',
    ctx: v4,
    portals: [web],
    nat: `${NAT_HEAD}-A KUBE-PORTALS-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
COMMIT
`,
    filter: FILTER_EMPTY,
  },
  {
    // The example of reference §1.3, byte for byte.
    name: 'UDP DNS',
    ctx: v4,
    portals: [dns],
    nat: `${NAT_HEAD}-A KUBE-PORTALS-CONTAINER -m comment --comment default/dns:dns -p udp -m udp --dport 53 -d 10.0.0.10/32 -j REDIRECT --to-ports 40001
-A KUBE-PORTALS-HOST -m comment --comment default/dns:dns -p udp -m udp --dport 53 -d 10.0.0.10/32 -j DNAT --to-destination 192.168.1.5:40001
COMMIT
`,
    filter: FILTER_EMPTY,
  },
  {
    name: 'externalIPs: physdev and addrtype rules, host side only for local',
    ctx: v4,
    portals: [
      portal('default', 'web', 'http', {
        clusterIPs: ['10.0.0.20'],
        externalIPs: ['203.0.113.7'],
        proxyPort: 40002,
      }),
    ],
    nat: `${NAT_HEAD}-A KUBE-PORTALS-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 203.0.113.7/32 -m physdev ! --physdev-is-in -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 203.0.113.7/32 -m addrtype --dst-type LOCAL -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 203.0.113.7/32 -m addrtype --dst-type LOCAL -j DNAT --to-destination 192.168.1.5:40002
COMMIT
`,
    filter: FILTER_EMPTY,
  },
  {
    name: 'LoadBalancer IPs like ClusterIPs',
    ctx: v4,
    portals: [
      portal('default', 'web', 'http', {
        clusterIPs: ['10.0.0.20'],
        loadBalancerIPs: ['198.51.100.1'],
        proxyPort: 40002,
      }),
    ],
    nat: `${NAT_HEAD}-A KUBE-PORTALS-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 198.51.100.1/32 -j DNAT --to-destination 192.168.1.5:40002
COMMIT
`,
    filter: FILTER_EMPTY,
  },
  {
    name: 'NodePort on every local address, ACCEPT on the proxy port',
    ctx: v4,
    portals: [webNodePort],
    nat: `${NAT_HEAD}-A KUBE-PORTALS-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-NODEPORT-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -j REDIRECT --to-ports 40002
-A KUBE-NODEPORT-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -j DNAT --to-destination 192.168.1.5:40002
COMMIT
`,
    filter: `*filter
:KUBE-NODEPORT-NON-LOCAL - [0:0]
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/web:http -p tcp -m tcp --dport 40002 -m state --state NEW -j ACCEPT
COMMIT
`,
  },
  {
    name: 'NodePort with --nodeport-addresses: one rule per local address inside the CIDRs',
    ctx: {
      ...v4,
      nodePortAddresses: ['192.168.1.0/24', 'fd00::/64'],
      localAddresses: ['192.168.1.5', '10.1.0.1', '192.168.1.6', 'fd00::5', '127.0.0.1'],
    },
    portals: [webNodePort],
    nat: `${NAT_HEAD}-A KUBE-PORTALS-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-NODEPORT-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -d 192.168.1.5/32 -j REDIRECT --to-ports 40002
-A KUBE-NODEPORT-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -d 192.168.1.6/32 -j REDIRECT --to-ports 40002
-A KUBE-NODEPORT-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -d 192.168.1.5/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-NODEPORT-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -d 192.168.1.6/32 -j DNAT --to-destination 192.168.1.5:40002
COMMIT
`,
    filter: `*filter
:KUBE-NODEPORT-NON-LOCAL - [0:0]
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/web:http -p tcp -m tcp --dport 40002 -m state --state NEW -j ACCEPT
COMMIT
`,
  },
  {
    name: 'NodePort with --nodeport-addresses matching no local address: no NodePort rules',
    ctx: { ...v4, nodePortAddresses: ['172.16.0.0/12'], localAddresses: ['192.168.1.5'] },
    portals: [webNodePort],
    nat: `${NAT_HEAD}-A KUBE-PORTALS-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
COMMIT
`,
    filter: FILTER_EMPTY,
  },
  {
    name: 'specific bind IP: DNAT to it on both sides',
    ctx: { ...v4, bindAddress: '192.168.1.9' },
    portals: [webNodePort],
    nat: `${NAT_HEAD}-A KUBE-PORTALS-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.9:40002
-A KUBE-PORTALS-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.9:40002
-A KUBE-NODEPORT-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -j DNAT --to-destination 192.168.1.9:40002
-A KUBE-NODEPORT-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -j DNAT --to-destination 192.168.1.9:40002
COMMIT
`,
    filter: `*filter
:KUBE-NODEPORT-NON-LOCAL - [0:0]
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/web:http -p tcp -m tcp --dport 40002 -m state --state NEW -j ACCEPT
COMMIT
`,
  },
  {
    name: 'IPv6: only this family, /128, bracketed DNAT',
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
    nat: `${NAT_HEAD}-A KUBE-PORTALS-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d fd00:96::20/128 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 2001:db8::7/128 -m physdev ! --physdev-is-in -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 2001:db8::7/128 -m addrtype --dst-type LOCAL -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d fd00:96::20/128 -j DNAT --to-destination [fd00::5]:40002
-A KUBE-PORTALS-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 2001:db8::7/128 -m addrtype --dst-type LOCAL -j DNAT --to-destination [fd00::5]:40002
COMMIT
`,
    filter: FILTER_EMPTY,
  },
  {
    name: 'IPv6 with a specific bind IP',
    ctx: { ...v6, bindAddress: 'fd00::9' },
    portals: [portal('default', 'web', 'http', { clusterIPs: ['fd00:96::20'], proxyPort: 40002 })],
    nat: `${NAT_HEAD}-A KUBE-PORTALS-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d fd00:96::20/128 -j DNAT --to-destination [fd00::9]:40002
-A KUBE-PORTALS-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d fd00:96::20/128 -j DNAT --to-destination [fd00::9]:40002
COMMIT
`,
    filter: FILTER_EMPTY,
  },
  {
    name: 'no portals: chains declared (flushed) and nothing else',
    ctx: v4,
    portals: [],
    nat: `${NAT_HEAD}COMMIT
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

test('renderRestoreInput: missing jumps come after the chain lines, with positions and comments of §1.1', () => {
  const got = renderRestoreInput({ ...v4, portals: [] }, JUMPS);
  assert.equal(
    got.nat,
    `${NAT_HEAD}-I OUTPUT 1 -m comment --comment "handle ClusterIPs; NOTE: this must be before the NodePort rules" -j KUBE-PORTALS-HOST
-I PREROUTING 1 -m comment --comment "handle ClusterIPs; NOTE: this must be before the NodePort rules" -j KUBE-PORTALS-CONTAINER
-A OUTPUT -m addrtype --dst-type LOCAL -m comment --comment "handle service NodePorts; NOTE: this must be the last rule in the chain" -j KUBE-NODEPORT-HOST
-A PREROUTING -m addrtype --dst-type LOCAL -m comment --comment "handle service NodePorts; NOTE: this must be the last rule in the chain" -j KUBE-NODEPORT-CONTAINER
COMMIT
`,
  );
  assert.equal(
    got.filter,
    `*filter
:KUBE-NODEPORT-NON-LOCAL - [0:0]
-I INPUT 1 -m comment --comment "Ensure that non-local NodePort traffic can flow" -j KUBE-NODEPORT-NON-LOCAL
COMMIT
`,
  );
  const onlyOne = renderRestoreInput(
    { ...v4, portals: [] },
    JUMPS.filter((j) => j.table === 'filter'),
  );
  assert.equal(onlyOne.nat, `${NAT_HEAD}COMMIT\n`);
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
const TARGETS = new Set(['REDIRECT', 'DNAT', 'ACCEPT']);

test('no rule jumps to or is appended to an undeclared chain', () => {
  const ctxs = [v4, v6, { ...v4, bindAddress: '192.168.1.9' }];
  const portals = [...manyPortals(50), dns, webNodePort];
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

test('hostile names change nothing but their own comment', () => {
  const benign = portal('default', 'benign', 'p', {
    clusterIPs: ['10.0.0.50'],
    externalIPs: ['203.0.113.9'],
    nodePort: 30050,
    proxyPort: 40050,
  });
  const render = (p: PortalSpec) =>
    restoreText(renderRestoreInput({ ...v4, portals: [p] }, JUMPS)).split('\n');
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
        if (k === at + 1 && w[k] === 'default/benign:p') {
          assert.ok(
            g[k]!.length <= MAX_COMMENT_LENGTH && g[k]!.length > 0,
            `${JSON.stringify(name)}: ${g[k]}`,
          );
          assert.match(g[k]!, /^[A-Za-z0-9._:/-]+$/);
        } else assert.equal(g[k], w[k], `${JSON.stringify(name)}: line ${i}`);
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
  assert.equal(text.nat.split('\n').filter((l) => l.startsWith('-A')).length, 2);
  assert.ok(text.nat.includes('-d 10.0.0.2/32'));
  assert.equal(text.filter, FILTER_EMPTY);
  assert.equal(renderRestoreInput({ ...v4, portals: [{ ...p, proxyPort: 0 }] }).nat, `${NAT_HEAD}COMMIT\n`);
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
-A KUBE-PORTALS-CONTAINER -m comment --comment default/dns:dns -p udp -m udp --dport 53 -d 10.0.0.10/32 -j REDIRECT --to-ports 40001
-A KUBE-PORTALS-HOST -m comment --comment default/dns:dns -p udp -m udp --dport 53 -d 10.0.0.10/32 -j DNAT --to-destination 192.168.1.5:40001
COMMIT
`,
    filter: '',
  },
  {
    name: 'remove',
    prev: [web, dns],
    next: [web],
    nat: `*nat
-D KUBE-PORTALS-CONTAINER -m comment --comment default/dns:dns -p udp -m udp --dport 53 -d 10.0.0.10/32 -j REDIRECT --to-ports 40001
-D KUBE-PORTALS-HOST -m comment --comment default/dns:dns -p udp -m udp --dport 53 -d 10.0.0.10/32 -j DNAT --to-destination 192.168.1.5:40001
COMMIT
`,
    filter: '',
  },
  {
    name: 'change: a NodePort is added, the ClusterIP rules stay in place',
    prev: [web, dns],
    next: [webNodePort, dns],
    nat: `*nat
-A KUBE-NODEPORT-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -j REDIRECT --to-ports 40002
-A KUBE-NODEPORT-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 30080 -j DNAT --to-destination 192.168.1.5:40002
COMMIT
`,
    filter: `*filter
-A KUBE-NODEPORT-NON-LOCAL -m comment --comment default/web:http -p tcp -m tcp --dport 40002 -m state --state NEW -j ACCEPT
COMMIT
`,
  },
  {
    name: 'change: a new proxy port replaces every rule of that service port',
    prev: [dns, web],
    next: [dns, { ...web, proxyPort: 40099 }],
    nat: `*nat
-D KUBE-PORTALS-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40002
-D KUBE-PORTALS-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40002
-A KUBE-PORTALS-CONTAINER -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j REDIRECT --to-ports 40099
-A KUBE-PORTALS-HOST -m comment --comment default/web:http -p tcp -m tcp --dport 80 -d 10.0.0.20/32 -j DNAT --to-destination 192.168.1.5:40099
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

test('renderDelta: full(prev) + delta = full(next) over random changes at scale', () => {
  let seed = 42;
  const rand = (n: number) => {
    seed = (seed * 1103515245 + 12345) % 2 ** 31;
    return seed % n;
  };
  let prev = manyPortals(500);
  const ctx = { ...v4, nodePortAddresses: ['10.0.0.0/8'], localAddresses: ['10.0.0.1', '10.0.0.2'] };
  for (let round = 0; round < 30; round++) {
    const next = [...prev];
    for (let k = 0; k < 5; k++) {
      const i = rand(next.length);
      const p = next[i]!;
      const choice = rand(4);
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
    assert.ok(delta.split('\n').length < 60, `round ${round}: delta of ${delta.split('\n').length} lines`);
    apply(model, delta);
    for (const [k, rules] of model) model.set(k, [...rules].sort());
    assert.deepEqual(
      model,
      modelOf(restoreText(renderRestoreInput({ ...ctx, portals: next }))),
      `round ${round}`,
    );
    prev = next;
  }
});

test('sameContext: node addresses outside --nodeport-addresses do not force a full render', () => {
  const a = { ...v4, nodePortAddresses: ['192.168.1.0/24'], localAddresses: ['192.168.1.5', '10.0.0.1'] };
  assert.ok(sameContext(a, { ...a, localAddresses: ['10.0.0.2', '192.168.1.5'] }));
  assert.ok(!sameContext(a, { ...a, localAddresses: ['192.168.1.6'] }));
  assert.ok(sameContext(v4, { ...v4, localAddresses: ['10.0.0.1'] }));
  assert.ok(!sameContext(v4, { ...v4, hostIP: '192.168.1.6' }));
  assert.ok(!sameContext(v4, { ...v4, bindAddress: '192.168.1.5' }));
});

test('every chain we render is one cleanup removes', () => {
  const text = restoreText(renderRestoreInput({ ...v4, portals: [webNodePort] }, JUMPS));
  const declared = text
    .split('\n')
    .filter((l) => l.startsWith(':'))
    .map((l) => l.slice(1).split(' ')[0]);
  assert.deepEqual(declared.sort(), ALL_CHAINS.map((c) => c.chain).sort());
});
