// End-to-end proof of the Kubernetes semantics of issue 13 (traffic policies, rejects, source ranges, UDP
// sessions of removed endpoints, node hints, address families, `primary` NodePorts, hosts whose INPUT
// policy is DROP): the real proxy CLI in a node namespace, real iptables, pods and clients in namespaces.
// Locality is only a label here: every pod sits on the node's bridge, and slices say `nodeName: node-b`
// for the "remote" one.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { DebugServicePort } from '../../src/server/debug.ts';
import {
  type Agent,
  createManifest,
  createProxyCluster,
  eventually,
  type ProxyCluster,
  ProxyProcess,
} from '../helpers/cluster-proxy.ts';
import { createSandbox, requireRootOrSkip } from '../helpers/netns.ts';

const NODE = 'node-a';
const OTHER_NODE = 'node-b';
const CLUSTER_CIDR = '10.244.0.0/16';
const BACKEND_TCP = 8080;
const BACKEND_UDP = 5353;
/** pod0 is on this node (node-a), pod1 is labelled remote (node-b), pod2 is only a client. */
const LOCAL = 0;
const REMOTE = 1;
const CLIENT = 2;
/** A second address of the outside namespace, outside `loadBalancerSourceRanges`. */
const DENIED_SOURCE = '192.168.50.100';
/** A time after which an expected drop counts as dropped (a refusal or an answer comes in < 10 ms here). */
const DROP_MS = 500;
/** How long after a manifest change its effect must be seen: a manifest reload plus one sync. */
const ONE_SYNC_MS = 1500;

const IP = {
  etpLocal: '10.96.1.10',
  etpRemote: '10.96.1.11',
  itp: '10.96.1.12',
  empty: '10.96.1.13',
  ranges: '10.96.1.14',
  udp: '10.96.1.15',
  near: '10.96.1.16',
  dual: '10.96.1.17',
  dual6: 'fd00:96::1:17',
} as const;
const LB = { etpLocal: '198.51.100.10', etpRemote: '198.51.100.11', ranges: '198.51.100.14' } as const;
const NODE_PORT = { etpLocal: 30110, etpRemote: 30111, itp: 30112, empty: 30113, ranges: 30114 } as const;
const HEALTH_PORT = { etpLocal: 32110, etpRemote: 32111 } as const;

type Port = { name: string; port: number; protocol?: 'TCP' | 'UDP'; nodePort?: number };

/** A Service as the API has it (targetPort from the protocol), `spec`/`status` merged over the defaults. */
function svc(name: string, clusterIPs: string[], ports: Port[], spec: object = {}, status?: object) {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name, namespace: 'default' },
    spec: {
      type: 'ClusterIP',
      clusterIP: clusterIPs[0],
      clusterIPs,
      ipFamilies: clusterIPs.map((ip) => (ip.includes(':') ? 'IPv6' : 'IPv4')),
      ipFamilyPolicy: clusterIPs.length > 1 ? 'RequireDualStack' : 'SingleStack',
      ports: ports.map((p) => ({
        protocol: 'TCP',
        targetPort: p.protocol === 'UDP' ? BACKEND_UDP : BACKEND_TCP,
        ...p,
      })),
      ...spec,
    },
    ...(status ? { status } : {}),
  };
}

const lbStatus = (ip: string) => ({ loadBalancer: { ingress: [{ ip }] } });

type Ep = { pod: number; node?: string; forNodes?: string[] };

/** One EndpointSlice of `service` (ready endpoints on `node`, default node-a), ports named as the Service's. */
function eps(
  service: string,
  endpoints: Ep[],
  ports: { name: string; protocol?: 'TCP' | 'UDP' }[],
  family: 'IPv4' | 'IPv6' = 'IPv4',
) {
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: {
      name: `${service}-${family === 'IPv4' ? 'v4' : 'v6'}`,
      namespace: 'default',
      labels: { 'kubernetes.io/service-name': service },
    },
    addressType: family,
    ports: ports.map((p) => ({
      name: p.name,
      protocol: p.protocol ?? 'TCP',
      port: p.protocol === 'UDP' ? BACKEND_UDP : BACKEND_TCP,
    })),
    endpoints: endpoints.map((e) => ({
      addresses: [family === 'IPv4' ? `10.244.0.${10 + e.pod}` : `fd00:244::${10 + e.pod}`],
      conditions: { ready: true, serving: true, terminating: false },
      nodeName: e.node ?? NODE,
      ...(e.forNodes
        ? {
            // What the EndpointSlice controller writes for PreferSameNode: node hints and zone hints.
            hints: { forNodes: e.forNodes.map((name) => ({ name })), forZones: [{ name: 'zone-a' }] },
          }
        : {}),
    })),
  };
}

const HTTP = [{ name: 'http' }];
const EMPTY_PORTS: Port[] = [
  { name: 'http', port: 80, nodePort: NODE_PORT.empty },
  { name: 'dns', port: 53, protocol: 'UDP' },
];
const emptyEndpoints = () =>
  eps('empty', [{ pod: LOCAL }], [{ name: 'http' }, { name: 'dns', protocol: 'UDP' }]);

/** Every Service of the main test; `over` replaces the objects of one Service (by name). */
function objects(over: { empty?: object[]; udp?: object[] } = {}): object[] {
  const etpLocal = { externalTrafficPolicy: 'Local' };
  return [
    // (1) externalTrafficPolicy Local, with a local and a remote endpoint, and with a remote one only.
    svc(
      'etp-local',
      [IP.etpLocal],
      [{ name: 'http', port: 80, nodePort: NODE_PORT.etpLocal }],
      { type: 'LoadBalancer', ...etpLocal, healthCheckNodePort: HEALTH_PORT.etpLocal },
      lbStatus(LB.etpLocal),
    ),
    eps('etp-local', [{ pod: LOCAL }, { pod: REMOTE, node: OTHER_NODE }], HTTP),
    svc(
      'etp-remote',
      [IP.etpRemote],
      [{ name: 'http', port: 80, nodePort: NODE_PORT.etpRemote }],
      { type: 'LoadBalancer', ...etpLocal, healthCheckNodePort: HEALTH_PORT.etpRemote },
      lbStatus(LB.etpRemote),
    ),
    eps('etp-remote', [{ pod: REMOTE, node: OTHER_NODE }], HTTP),
    // (2) internalTrafficPolicy Local with a remote endpoint only.
    svc('itp', [IP.itp], [{ name: 'http', port: 80, nodePort: NODE_PORT.itp }], {
      type: 'NodePort',
      internalTrafficPolicy: 'Local',
    }),
    eps('itp', [{ pod: REMOTE, node: OTHER_NODE }], HTTP),
    // (3) no endpoints (a subtest adds them).
    svc('empty', [IP.empty], EMPTY_PORTS, { type: 'NodePort' }),
    ...(over.empty ?? []),
    // (4) loadBalancerSourceRanges: only the outside namespace's first address.
    svc(
      'ranges',
      [IP.ranges],
      [{ name: 'http', port: 80, nodePort: NODE_PORT.ranges }],
      { type: 'LoadBalancer', loadBalancerSourceRanges: ['192.168.50.1/32'] },
      lbStatus(LB.ranges),
    ),
    eps('ranges', [{ pod: LOCAL }], HTTP),
    // (5) UDP with two endpoints (a subtest removes one).
    svc('udp', [IP.udp], [{ name: 'dns', port: 53, protocol: 'UDP' }]),
    ...(over.udp ?? [eps('udp', [{ pod: LOCAL }, { pod: REMOTE }], [{ name: 'dns', protocol: 'UDP' }])]),
    // (6) trafficDistribution PreferSameNode: node hints on every endpoint, one for this node.
    svc('near', [IP.near], [{ name: 'http', port: 80 }], { trafficDistribution: 'PreferSameNode' }),
    eps(
      'near',
      [
        { pod: LOCAL, forNodes: [NODE] },
        { pod: REMOTE, node: OTHER_NODE, forNodes: [OTHER_NODE] },
      ],
      HTTP,
    ),
    // (9) dual-stack: the IPv4 endpoint is pod0, the IPv6 one pod1.
    svc('dual', [IP.dual, IP.dual6], [{ name: 'http', port: 80 }]),
    eps('dual', [{ pod: LOCAL }], HTTP),
    eps('dual', [{ pod: REMOTE }], HTTP, 'IPv6'),
  ];
}

const SERVICES = ['etp-local', 'etp-remote', 'itp', 'empty', 'ranges', 'udp', 'near', 'dual'];

/** The pod names that answered `n` TCP requests from `agent` (a failed request fails the assertion). */
async function whoAnswers(agent: Agent, host: string, port: number, n: number, what: string) {
  const names: string[] = [];
  for (let i = 0; i < n; i++) {
    const r = await agent.tcp(host, port, 1000);
    assert.ok(r.ok, `${what}, request ${i}: ${r.error} after ${r.ms} ms`);
    names.push(r.data!);
  }
  return names;
}

/** Asserts that every one of `n` requests was answered by `pod`. */
async function onlyFrom(agent: Agent, host: string, port: number, pod: string, what: string, n = 12) {
  const names = await whoAnswers(agent, host, port, n, what);
  assert.deepEqual(
    [...new Set(names)],
    [pod],
    `${what}: every request must be answered by ${pod}, got ${names.join(' ')}`,
  );
}

/** Asserts that the connect is dropped: no answer, no refusal, no reset within DROP_MS. */
async function dropped(agent: Agent, host: string, port: number, what: string, localAddress?: string) {
  const r = await agent.tcp(host, port, DROP_MS, localAddress ? { localAddress } : {});
  assert.equal(
    r.error,
    'ETIMEDOUT',
    `${what} must be dropped (connect times out), got ${r.ok ? `an answer from ${r.data}` : `${r.error} after ${r.ms} ms`}`,
  );
}

/** Asserts that a TCP connect is refused within 100 ms. */
async function refused(agent: Agent, host: string, port: number, what: string) {
  const r = await agent.tcp(host, port, 1000);
  assert.equal(
    r.error,
    'ECONNREFUSED',
    `${what} must be refused, got ${r.ok ? `an answer from ${r.data}` : r.error} after ${r.ms} ms`,
  );
  assert.ok(r.ms <= 100, `${what}: refused after ${r.ms} ms (want ≤ 100 ms)`);
}

/** Waits (up to `timeoutMs`) until `pod` answers host:port from `agent`. */
async function answeredBy(
  agent: Agent,
  host: string,
  port: number,
  pod: string,
  what: string,
  timeoutMs = 1000,
) {
  let last = '';
  await eventually(
    async () => {
      const r = await agent.tcp(host, port, 300);
      last = r.ok ? `answered by ${r.data}` : `${r.error} after ${r.ms} ms`;
      return r.data === pod;
    },
    { timeoutMs },
  ).catch(() => assert.fail(`${what}: not answered by ${pod} within ${timeoutMs} ms, last ${last}`));
}

/**
 * Waits (up to `timeoutMs`: the server opens after the sync that found the Service) until the health
 * check node port answers `status` from outside; fails with the last answer.
 */
async function healthIs(cluster: ProxyCluster, port: number, status: number, what: string, timeoutMs = 2000) {
  let last: string | undefined;
  await eventually(
    async () => {
      const r = await cluster.outsideAgent.request<{
        ok: boolean;
        status?: number;
        body?: string;
        error?: string;
      }>('get', { url: `http://${cluster.nodeIP}:${port}/healthz`, timeoutMs: 300 });
      last = r.ok ? `${r.status} ${r.body}` : r.error;
      return r.status === status;
    },
    { timeoutMs },
  ).catch(() => assert.fail(`${what}: want ${status} within ${timeoutMs} ms, last ${last}`));
}

const listed = (s: readonly DebugServicePort[], names: readonly string[]) =>
  names.every((n) => s.some((x) => x.service.startsWith(`default/${n}:`)));

/** Starts the proxy as node-a with the cluster CIDR, plus `args`; stopped in t.after. */
function startProxy(
  t: { after(fn: () => unknown): void },
  cluster: ProxyCluster,
  file: string,
  args: string[] = [],
) {
  const proxy = new ProxyProcess(cluster, file, [
    '--hostname-override',
    NODE,
    '--cluster-cidr',
    CLUSTER_CIDR,
    ...args,
  ]);
  t.after(() => proxy.stop());
  return proxy;
}

async function serveAll(cluster: ProxyCluster) {
  for (const [i, p] of cluster.pods.entries())
    await p.agent.serve('backend', `pod${i}`, { tcpPort: BACKEND_TCP, udpPort: BACKEND_UDP });
}

test('issue 13: traffic policies, rejects, source ranges, UDP sessions, node hints, families', {
  timeout: 150_000,
}, async (t) => {
  if (!requireRootOrSkip(t)) return;
  const sb = await createSandbox(t);
  const cluster = await createProxyCluster(sb, {
    pods: 3,
    routedToNode: [LB.etpLocal, LB.etpRemote, LB.ranges],
    forwarding: true,
  });
  await sb.addAddress(cluster.outside, 'eth0', `${DENIED_SOURCE}/24`);
  await serveAll(cluster);
  const { nodeAgent, outsideAgent, nodeIP } = cluster;
  const client = cluster.pods[CLIENT]!.agent;
  const manifest = await createManifest(t);
  await manifest.write(objects());
  const proxy = startProxy(t, cluster, manifest.file);
  await proxy.waitServices((s) => listed(s, SERVICES), 15_000, 'the first sync');
  await eventually(async () => (await client.tcp(IP.ranges, 80, 300)).ok, { what: 'the first rules' });

  await t.test(
    'externalTrafficPolicy Local: outside → NodePort and LB IP reach only the local endpoint; health check 200',
    async () => {
      await onlyFrom(outsideAgent, nodeIP, NODE_PORT.etpLocal, 'pod0', 'outside → NodePort (ETP Local)');
      await onlyFrom(outsideAgent, LB.etpLocal, 80, 'pod0', 'outside → LB IP (ETP Local)');
      await healthIs(cluster, HEALTH_PORT.etpLocal, 200, 'health check node port with a local endpoint');
      // Internal traffic keeps the cluster-wide list.
      const names = await whoAnswers(client, IP.etpLocal, 80, 12, 'pod → ClusterIP (ETP Local)');
      assert.deepEqual([...new Set(names)].sort(), ['pod0', 'pod1'], `pod → ClusterIP: ${names.join(' ')}`);
    },
  );

  await t.test(
    'externalTrafficPolicy Local, no local endpoint: outside dropped, health check 503, pods and node short-circuited',
    async () => {
      await dropped(outsideAgent, nodeIP, NODE_PORT.etpRemote, 'outside → NodePort (no local endpoint)');
      await dropped(outsideAgent, LB.etpRemote, 80, 'outside → LB IP (no local endpoint)');
      await healthIs(cluster, HEALTH_PORT.etpRemote, 503, 'health check node port without a local endpoint');
      // kube-proxy's short-circuit: traffic from the cluster CIDR and the node to external addresses.
      await onlyFrom(client, LB.etpRemote, 80, 'pod1', 'pod → LB IP (short-circuit)', 4);
      await onlyFrom(client, nodeIP, NODE_PORT.etpRemote, 'pod1', 'pod → NodePort (short-circuit)', 4);
      await onlyFrom(nodeAgent, LB.etpRemote, 80, 'pod1', 'node → LB IP (short-circuit)', 4);
    },
  );

  await t.test(
    'internalTrafficPolicy Local, remote endpoint only: NodePort from outside served, ClusterIP from a pod dropped',
    async () => {
      await onlyFrom(outsideAgent, nodeIP, NODE_PORT.itp, 'pod1', 'outside → NodePort (ITP Local)', 4);
      await dropped(client, IP.itp, 80, 'pod → ClusterIP (ITP Local, no local endpoint)');
    },
  );

  await t.test(
    'no endpoints: TCP refused within 100 ms, UDP port unreachable; served after endpoints come, refused after they go',
    async () => {
      try {
        await refused(client, IP.empty, 80, 'pod → ClusterIP (no endpoints)');
        await refused(nodeAgent, IP.empty, 80, 'node → ClusterIP (no endpoints)');
        await refused(outsideAgent, nodeIP, NODE_PORT.empty, 'outside → NodePort (no endpoints)');
        const u = await client.udpConnected(IP.empty, 53, { timeoutMs: 1000 });
        assert.equal(
          u.error,
          'ECONNREFUSED',
          `pod → UDP ClusterIP (no endpoints) must get port unreachable, got ${u.ok ? u.data : u.error} after ${u.ms} ms`,
        );

        // Each path within one sync of the change (they are checked one after another).
        const added = Date.now();
        const left = () => Math.max(300, added + ONE_SYNC_MS - Date.now());
        await manifest.write(objects({ empty: [emptyEndpoints()] }));
        await answeredBy(client, IP.empty, 80, 'pod0', 'pod → ClusterIP once endpoints exist', left());
        t.diagnostic(
          `no endpoints → endpoints: pod → ClusterIP served ${Date.now() - added} ms after the write`,
        );
        await answeredBy(nodeAgent, IP.empty, 80, 'pod0', 'node → ClusterIP once endpoints exist', left());
        await answeredBy(
          outsideAgent,
          nodeIP,
          NODE_PORT.empty,
          'pod0',
          'outside → NodePort once endpoints exist',
          left(),
        );
        let udp = '';
        await eventually(
          async () => {
            const u = await client.udpConnected(IP.empty, 53, { timeoutMs: 300, send: 'x' });
            udp = u.ok ? u.data! : u.error!;
            return udp === 'pod0:x';
          },
          { timeoutMs: left() },
        ).catch(() => assert.fail(`pod → UDP ClusterIP once endpoints exist: ${udp}`));

        const removed = Date.now();
        await manifest.write(objects());
        let again = '';
        await eventually(
          async () => {
            const r = await client.tcp(IP.empty, 80, 300);
            again = r.ok ? `answered by ${r.data}` : r.error!;
            return r.error === 'ECONNREFUSED';
          },
          { timeoutMs: ONE_SYNC_MS },
        ).catch(() => assert.fail(`pod → ClusterIP once the endpoints are gone again: ${again}`));
        t.diagnostic(`endpoints → none: refused ${Date.now() - removed} ms after the write`);
      } finally {
        await manifest.write(objects());
      }
    },
  );

  await t.test(
    'loadBalancerSourceRanges: LB IP served from an allowed source, dropped from others; the NodePort is not restricted',
    async () => {
      await onlyFrom(outsideAgent, LB.ranges, 80, 'pod0', 'outside (allowed source) → LB IP', 2);
      await dropped(outsideAgent, LB.ranges, 80, `outside from ${DENIED_SOURCE} → LB IP`, DENIED_SOURCE);
      await dropped(client, LB.ranges, 80, 'pod (not in the ranges) → LB IP');
      const r = await outsideAgent.tcp(nodeIP, NODE_PORT.ranges, 1000, { localAddress: DENIED_SOURCE });
      assert.equal(r.data, 'pod0', `outside from ${DENIED_SOURCE} → NodePort: ${r.error ?? r.data}`);
    },
  );

  await t.test(
    'UDP: a client sending every 20 ms moves to a live endpoint within one sync after its endpoint is removed',
    async () => {
      try {
        await client.udpStreamStart('udp', IP.udp, 53, 20, 20_000);
        await new Promise((r) => setTimeout(r, 300));
        // The session's endpoint, from its replies ("<pod>:<seq>"). The removed pod keeps answering,
        // like a pod in its grace period or a new pod that got its IP.
        const pinned = (await client.udpStreamPeek('udp')).replies.at(-1)!.data.split(':')[0]!;
        const other = pinned === 'pod0' ? 'pod1' : 'pod0';
        const removedAt = Date.now();
        const keep = other === 'pod0' ? LOCAL : REMOTE;
        await manifest.write(
          objects({ udp: [eps('udp', [{ pod: keep }], [{ name: 'dns', protocol: 'UDP' }])] }),
        );
        await new Promise((r) => setTimeout(r, ONE_SYNC_MS + 1000));
        const s = await client.udpStreamStop('udp');
        const from = (name: string) => s.replies.filter((r) => r.data.startsWith(`${name}:`));
        const lastPinned = from(pinned).at(-1)?.t;
        const firstOther = from(other)[0]?.t;
        let gap = 0;
        for (let i = 1; i < s.replies.length; i++) gap = Math.max(gap, s.replies[i]!.t - s.replies[i - 1]!.t);
        const rel = (x: number | undefined) => (x === undefined ? 'never' : `${x - removedAt} ms`);
        t.diagnostic(
          `UDP stream: ${s.sent} sent, ${s.replies.length} replies; session on ${pinned}: last reply ${rel(lastPinned)} ` +
            `after its removal, first from ${other} ${rel(firstOther)}; longest gap ${gap} ms`,
        );
        assert.ok(firstOther !== undefined, `no reply from the live endpoint ${other} after the removal`);
        assert.ok(
          (lastPinned ?? 0) - removedAt <= ONE_SYNC_MS,
          `${pinned} (removed) still answered ${rel(lastPinned)} after its removal`,
        );
        assert.ok(s.replies.at(-1)!.data.startsWith(`${other}:`), 'the stream ends on the live endpoint');
        assert.ok(gap <= ONE_SYNC_MS, `longest time without a reply ${gap} ms`);
      } finally {
        await client.udpStreamStop('udp').catch(() => {});
        await manifest.write(objects());
      }
    },
  );

  await t.test(
    'trafficDistribution PreferSameNode: ClusterIP traffic goes only to the endpoint for this node',
    async () => {
      await onlyFrom(client, IP.near, 80, 'pod0', 'pod → ClusterIP (node hints)');
    },
  );

  await t.test(
    'dual-stack: the IPv4 ClusterIP reaches only IPv4 endpoints, the IPv6 one only IPv6',
    async () => {
      await onlyFrom(client, IP.dual, 80, 'pod0', 'pod → IPv4 ClusterIP (pod0 is the IPv4 endpoint)');
      await onlyFrom(client, IP.dual6, 80, 'pod1', 'pod → IPv6 ClusterIP (pod1 is the IPv6 endpoint)');
    },
  );
});

test('issue 13: host setups: --nodeport-addresses primary, a filter INPUT policy of DROP', {
  timeout: 90_000,
}, async (t) => {
  if (!requireRootOrSkip(t)) return;
  const sb = await createSandbox(t);
  const cluster = await createProxyCluster(sb, { pods: 3, forwarding: true });
  await serveAll(cluster);
  const { node, nodeIP, outsideAgent } = cluster;
  const client = cluster.pods[CLIENT]!.agent;
  const manifest = await createManifest(t);
  await manifest.write([
    {
      apiVersion: 'v1',
      kind: 'Node',
      metadata: { name: NODE },
      status: { addresses: [{ type: 'InternalIP', address: nodeIP }] },
    },
    svc(
      'web',
      [IP.etpLocal],
      [{ name: 'http', port: 80, nodePort: NODE_PORT.etpLocal }],
      { type: 'LoadBalancer', externalTrafficPolicy: 'Local', healthCheckNodePort: HEALTH_PORT.etpLocal },
      lbStatus(LB.etpLocal),
    ),
    eps('web', [{ pod: LOCAL }], HTTP),
    // No NodePort: the legacy filter rules accept only the proxy ports of NodePorts.
    svc(
      'internal',
      [IP.near],
      [
        { name: 'http', port: 80 },
        { name: 'dns', port: 53, protocol: 'UDP' },
      ],
    ),
    eps('internal', [{ pod: LOCAL }], [{ name: 'http' }, { name: 'dns', protocol: 'UDP' }]),
  ]);

  await t.test('--nodeport-addresses primary: accepted, NodePorts answer on the node IP only', async (t) => {
    const proxy = startProxy(t, cluster, manifest.file, ['--nodeport-addresses', 'primary']);
    const exited = proxy.exited.then((code) => {
      throw new Error(`the proxy exited with ${code}: ${proxy.logTail(3)}`);
    });
    await Promise.race([exited, proxy.waitServices((s) => listed(s, ['web']), 15_000, 'the first sync')]);
    await eventually(async () => (await outsideAgent.tcp(nodeIP, NODE_PORT.etpLocal, 300)).data === 'pod0', {
      what: 'outside → NodePort on the node IP',
    });
    const r = await client.tcp(cluster.bridgeIP, NODE_PORT.etpLocal, DROP_MS);
    assert.equal(r.ok, false, `NodePort on the bridge address (not a primary IP) answered ${r.data}`);
    assert.equal(await proxy.stop(), 0, proxy.logTail());
  });

  await t.test(
    'filter INPUT policy DROP: ClusterIP, NodePort and the health check node port still served',
    async (t) => {
      // A typical host firewall: loopback and replies accepted, everything else dropped.
      const ipt = (args: string[]) => sb.exec(node, 'iptables', ['-w', ...args]);
      await ipt(['-A', 'INPUT', '-i', 'lo', '-j', 'ACCEPT']);
      await ipt(['-A', 'INPUT', '-m', 'conntrack', '--ctstate', 'ESTABLISHED,RELATED', '-j', 'ACCEPT']);
      await ipt(['-P', 'INPUT', 'DROP']);
      // The firewall works: a port on the node nobody accepted is dropped.
      await cluster.nodeAgent.serve('firewalled', 'node', { tcpPort: 9000, host: '0.0.0.0' });
      await dropped(outsideAgent, nodeIP, 9000, 'outside → an unrelated port on the node (rig check)');

      const proxy = startProxy(t, cluster, manifest.file);
      await proxy.waitServices((s) => listed(s, ['web', 'internal']), 15_000, 'the first sync');
      await answeredBy(client, IP.etpLocal, 80, 'pod0', 'pod → ClusterIP of a NodePort Service', 3000);
      await answeredBy(outsideAgent, nodeIP, NODE_PORT.etpLocal, 'pod0', 'outside → NodePort');
      await healthIs(cluster, HEALTH_PORT.etpLocal, 200, 'health check node port');
      await answeredBy(client, IP.near, 80, 'pod0', 'pod → ClusterIP of a ClusterIP-only Service');
      const u = await client.udpConnected(IP.near, 53, { send: 'x', timeoutMs: 1000 });
      assert.equal(u.data, 'pod0:x', `pod → UDP ClusterIP of a ClusterIP-only Service: ${u.error}`);
    },
  );
});
