// The loop guard: which endpoints lead back to this proxy (its proxy ports on an address it listens on,
// its NodePorts on this host, the portals of its own service ports), table-driven; and the filter that
// leaves them out with one warning each.
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { test } from 'node:test';
import { createLogger, silentLogger } from '../../../src/lib/log.ts';
import {
  LoopGuard,
  loopReason,
  type OwnListeners,
  type OwnPortsOptions,
} from '../../../src/proxier/loop-guard.ts';
import type { Endpoint, EndpointKey } from '../../../src/state/endpoint.ts';
import type { Protocol, ServicePort, ServicePortKey } from '../../../src/state/service-port.ts';
import { ep } from '../../helpers/endpoints.ts';
import { portal } from '../../helpers/portals.ts';

const NODE_IP = '192.168.1.10';
const web = portal('default', 'web', 'http', {
  clusterIPs: ['10.96.0.10', 'fd00:96::10'],
  port: 80,
  nodePort: 30080,
  externalIPs: ['203.0.113.7'],
  loadBalancerIPs: ['198.51.100.9'],
}).servicePort;
const dns = portal('kube-system', 'dns', 'dns', {
  clusterIPs: ['10.96.0.53'],
  port: 53,
  protocol: 'UDP',
}).servicePort;

const LOCAL = new Set([NODE_IP, '127.0.0.1', '::1', 'fd00:1::10']);

/**
 * A loop guard used as the proxier uses it: each service port as placed and its listeners' ports kept,
 * what each lists, and which of them a change concerns (takeChanges() applied to the lists).
 */
class Picture {
  readonly guard: LoopGuard;
  readonly #placed = new Map<ServicePortKey, { sp: ServicePort; ports: number[] }>();
  readonly #listed = new Map<ServicePortKey, readonly Endpoint[]>();

  constructor(guard: LoopGuard) {
    this.guard = guard;
  }

  /** `sp` runs with listeners on `proxyPorts` (0: none). */
  place(sp: ServicePort, proxyPorts: number[]): void {
    const before = this.#placed.get(sp.key);
    const ports = proxyPorts.filter((p) => p !== 0);
    for (const p of before?.ports ?? [])
      if (!ports.includes(p)) this.guard.moveProxyPort(sp.protocol, p, undefined);
    for (const p of ports)
      if (!before?.ports.includes(p)) this.guard.moveProxyPort(sp.protocol, undefined, p);
    this.guard.place(sp, before?.sp);
    this.#placed.set(sp.key, { sp, ports });
  }

  remove(key: ServicePortKey): void {
    const placed = this.#placed.get(key);
    this.#placed.delete(key);
    if (placed === undefined) return;
    for (const p of placed.ports) this.guard.moveProxyPort(placed.sp.protocol, p, undefined);
    this.guard.remove(placed.sp);
  }

  list(key: ServicePortKey, after: readonly Endpoint[] | undefined): void {
    this.guard.watch(this.#listed.get(key), after);
    if (after === undefined) this.#listed.delete(key);
    else this.#listed.set(key, after);
  }

  /** The service ports that list an endpoint the changes since the last call concern. */
  affected(): ServicePortKey[] {
    const concerns = this.guard.takeChanges();
    if (concerns === undefined) return [];
    return [...this.#listed].filter(([, list]) => list.some(concerns)).map(([key]) => key);
  }
}

/** A guard with the picture of `servicePorts`, placed as the proxier places them. */
function guardOf(
  servicePorts: { servicePort: ServicePort; proxyPorts: number[] }[],
  options: OwnPortsOptions & { bindHost: string; localAddresses: ReadonlySet<string> },
  guard = new LoopGuard(silentLogger(), options),
): Picture {
  guard.setHost(options.bindHost, options.localAddresses);
  const picture = new Picture(guard);
  for (const { servicePort, proxyPorts } of servicePorts) picture.place(servicePort, proxyPorts);
  return picture;
}

type Own = { bindHost?: string; nodePorts?: boolean; portals?: boolean };

function guard(o: Own = {}, log = silentLogger()): LoopGuard {
  const options = {
    bindHost: o.bindHost ?? '::',
    localAddresses: LOCAL,
    nodePorts: o.nodePorts ?? true,
    portals: o.portals ?? true,
  };
  return guardOf(
    [
      { servicePort: web, proxyPorts: [40001, 40002] },
      { servicePort: dns, proxyPorts: [40003, 0] },
    ],
    options,
    new LoopGuard(log, options),
  ).guard;
}

function own(o: Own = {}): OwnListeners {
  return guard(o).own;
}

const cases: {
  name: string;
  ip: string;
  port: number;
  protocol?: Protocol;
  own?: OwnListeners;
  want: ReturnType<typeof loopReason>;
}[] = [
  { name: 'our proxy port on loopback', ip: '127.0.0.1', port: 40001, want: 'proxy-port' },
  { name: 'our proxy port on any 127/8 address', ip: '127.3.4.5', port: 40001, want: 'proxy-port' },
  { name: 'the local-list proxy port too', ip: '127.0.0.1', port: 40002, want: 'proxy-port' },
  { name: 'our proxy port on the node IP', ip: NODE_IP, port: 40001, want: 'proxy-port' },
  { name: 'our proxy port on IPv6 loopback', ip: '::1', port: 40001, want: 'proxy-port' },
  { name: 'our proxy port on the unspecified address', ip: '0.0.0.0', port: 40001, want: 'proxy-port' },
  { name: 'the same port on a pod', ip: '10.244.1.5', port: 40001, want: undefined },
  { name: 'a UDP proxy port is not a TCP loop', ip: '127.0.0.1', port: 40003, want: undefined },
  {
    name: 'a UDP proxy port is a UDP loop',
    ip: '127.0.0.1',
    port: 40003,
    protocol: 'UDP',
    want: 'proxy-port',
  },
  {
    name: 'bound on one address: another local address is not us',
    ip: NODE_IP,
    port: 40001,
    own: own({ bindHost: '127.0.0.1' }),
    want: undefined,
  },
  {
    name: 'bound on one address: that address is us',
    ip: '127.0.0.1',
    port: 40001,
    own: own({ bindHost: '127.0.0.1' }),
    want: 'proxy-port',
  },
  {
    name: 'bound on 0.0.0.0: an IPv6 address is not us',
    ip: '::1',
    port: 40001,
    own: own({ bindHost: '0.0.0.0' }),
    want: undefined,
  },
  { name: 'our NodePort on the node IP', ip: NODE_IP, port: 30080, want: 'node-port' },
  { name: 'our NodePort on loopback', ip: '127.0.0.1', port: 30080, want: 'node-port' },
  { name: 'a NodePort of another node', ip: '192.168.1.11', port: 30080, want: undefined },
  {
    name: 'NodePorts not served (--no-iptables)',
    ip: NODE_IP,
    port: 30080,
    own: own({ nodePorts: false }),
    want: undefined,
  },
  { name: 'our ClusterIP and port', ip: '10.96.0.10', port: 80, want: 'portal' },
  { name: 'our IPv6 ClusterIP and port', ip: 'fd00:96::10', port: 80, want: 'portal' },
  { name: 'our external IP and port', ip: '203.0.113.7', port: 80, want: 'portal' },
  { name: 'our LB IP and port', ip: '198.51.100.9', port: 80, want: 'portal' },
  { name: 'our ClusterIP on another port', ip: '10.96.0.10', port: 8080, want: undefined },
  { name: 'a TCP portal is not a UDP loop', ip: '10.96.0.10', port: 80, protocol: 'UDP', want: undefined },
  { name: 'our UDP ClusterIP', ip: '10.96.0.53', port: 53, protocol: 'UDP', want: 'portal' },
  {
    name: 'no rules (--no-iptables): a ClusterIP is nobody',
    ip: '10.96.0.10',
    port: 80,
    own: own({ portals: false }),
    want: undefined,
  },
];

for (const c of cases)
  test(`loopReason: ${c.name}`, () => {
    assert.equal(loopReason(ep(c.ip, c.port), c.protocol ?? 'TCP', c.own ?? own()), c.want);
  });

test('LoopGuard: the picture is counted per service port; only who lists a port or portal that came or went is affected', () => {
  const options = { bindHost: '::', localAddresses: LOCAL, nodePorts: true, portals: true };
  const g = guardOf([{ servicePort: web, proxyPorts: [40001, 40002] }], options);
  const api = portal('default', 'api', 'http', { clusterIPs: ['10.96.0.11'], port: 80 }).servicePort;
  const other = portal('default', 'other', 'http', { clusterIPs: ['10.96.0.12'], port: 80 }).servicePort;
  const dup = portal('default', 'dup', 'http', { clusterIPs: ['10.96.0.10'], port: 80 }).servicePort;
  // api lists our proxy port 40005 on loopback and web's ClusterIP; other lists pods only.
  g.list(api.key, [ep('127.0.0.1', 40005), ep('10.96.0.10', 80), ep('10.244.1.5', 8080)]);
  g.list(other.key, [ep('10.244.1.6', 8080)]);
  assert.deepEqual(g.affected(), [api.key], "web's ports and ClusterIP came: api lists the ClusterIP");
  assert.deepEqual(g.affected(), [], 'told once');

  const cases: { name: string; change: () => void; affected: string[]; has: boolean }[] = [
    {
      name: 'a second service port on the same proxy port: nothing came',
      change: () => g.place(other, [40005]),
      affected: [api.key],
      has: true,
    },
    {
      name: 'the same again: nothing came or went',
      change: () => g.place(other, [40005]),
      affected: [],
      has: true,
    },
    {
      name: 'a port and a ClusterIP web holds too: they stay',
      change: () => g.place(dup, [40001]),
      affected: [],
      has: true,
    },
    {
      name: 'other stops: 40005 goes',
      change: () => g.remove(other.key),
      affected: [api.key],
      has: false,
    },
    {
      name: 'api no longer lists 40005; it comes back: nobody is affected',
      change: () => {
        g.list(api.key, [ep('10.96.0.10', 80)]);
        g.place(other, [40005]);
      },
      affected: [],
      has: true,
    },
  ];
  for (const c of cases) {
    c.change();
    assert.deepEqual(g.affected(), c.affected, c.name);
    assert.equal(g.guard.own.proxyPorts.TCP.has(40005), c.has, c.name);
  }
  g.remove(dup.key);
  assert.ok(g.guard.own.proxyPorts.TCP.has(40001), 'web still holds 40001');
  assert.ok(g.guard.own.portals.TCP.has('10.96.0.10:80'));
  g.remove(web.key);
  assert.ok(!g.guard.own.proxyPorts.TCP.has(40001));
  assert.ok(!g.guard.own.portals.TCP.has('10.96.0.10:80'));
  assert.deepEqual(g.affected(), [api.key], "web's ClusterIP went");
  g.place(portal('default', 'far', 'http', { clusterIPs: ['10.96.0.13'], port: 81 }).servicePort, [40009]);
  assert.equal(g.guard.takeChanges(), undefined, 'no endpoint is listed on 40009 or 81: no list to look at');

  assert.equal(g.guard.setHost('::', new Set(LOCAL)), false, 'the same addresses');
  assert.equal(g.guard.setHost('::', new Set(['192.168.1.99'])), true, 'a node address changed');
  assert.equal(g.guard.setHost('0.0.0.0', new Set(['192.168.1.99'])), true, 'where we listen changed');
});

function recording() {
  const lines: Record<string, unknown>[] = [];
  const log = createLogger({
    destination: new Writable({
      write(chunk, _e, cb) {
        lines.push(JSON.parse(String(chunk)) as Record<string, unknown>);
        cb();
      },
    }),
  });
  return { lines, log };
}

test('filter: the same array when nothing loops; otherwise a copy without them, one warning each', () => {
  const { lines, log } = recording();
  const pods = [ep('10.244.1.5', 8080), ep('10.244.2.6', 8080)];
  const refused = new Set<EndpointKey>();
  const empty = new LoopGuard(log, { nodePorts: true, portals: true });
  assert.equal(empty.filter(web, pods, refused), pods, 'nothing to filter before any picture');
  const g = guard({}, log);
  assert.equal(g.filter(web, pods, refused), pods, 'no allocation when nothing loops');

  // Hostile: the Service names the proxy's own port and its own ClusterIP as endpoints.
  const hostile = [ep('127.0.0.1', 40001), ...pods, ep('10.96.0.10', 80)];
  for (let i = 0; i < 3; i++) {
    assert.deepEqual(g.filter(web, hostile, refused), pods);
  }
  assert.deepEqual([...refused].sort(), ['10.96.0.10:80', '127.0.0.1:40001']);
  const warnings = lines.filter(
    (l) => l.msg === 'Endpoint leads back to this proxy (a forwarding loop), left out',
  );
  assert.deepEqual(
    warnings.map((w) => [w.service, w.endpoint, w.reason]),
    [
      ['default/web:http/TCP', '127.0.0.1:40001', 'proxy-port'],
      ['default/web:http/TCP', '10.96.0.10:80', 'portal'],
    ],
    'one warning per endpoint, however often the list is applied',
  );
});
