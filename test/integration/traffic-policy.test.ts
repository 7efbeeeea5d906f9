// Traffic policies and families on the listener side (--no-iptables, real loopback sockets): a service
// port that uses both the cluster-wide and the node-local endpoint list gets a second listener for the
// local one; a dual-stack service's families keep to their own endpoints.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import net from 'node:net';
import { test } from 'node:test';
import type { Iptables } from '../../src/netfilter/iptables.ts';
import type { DebugServicePort } from '../../src/server/debug.ts';
import { fakeHostInfo } from '../helpers/host-info.ts';
import { startManifestProxy } from '../helpers/manifests.ts';
import { request, type TestServer, tcpServer, waitFor } from '../helpers/servers.ts';

const NODE = 'node-1';

type Policy = { type?: string; etp?: 'Local' | 'Cluster'; itp?: 'Local' | 'Cluster'; nodePort?: number };

function svc(name: string, port: number, p: Policy, clusterIPs = ['10.96.0.10']) {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name, namespace: 'default' },
    spec: {
      type: p.type ?? 'ClusterIP',
      clusterIP: clusterIPs[0],
      clusterIPs,
      ports: [{ name: 'http', port: 80, targetPort: port, ...(p.nodePort ? { nodePort: p.nodePort } : {}) }],
      ...(p.etp ? { externalTrafficPolicy: p.etp } : {}),
      ...(p.itp ? { internalTrafficPolicy: p.itp } : {}),
      ...(p.type === 'LoadBalancer' && p.etp === 'Local' ? { healthCheckNodePort: 32100 } : {}),
    },
  };
}

function slice(service: string, port: number, eps: { ip: string; node: string }[], family = 'IPv4') {
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: {
      name: `${service}-${family.toLowerCase()}`,
      namespace: 'default',
      labels: { 'kubernetes.io/service-name': service },
    },
    addressType: family,
    ports: [{ name: 'http', port, protocol: 'TCP' }],
    endpoints: eps.map((e) => ({ addresses: [e.ip], nodeName: e.node, conditions: { ready: true } })),
  };
}

/** "Pods" answering their own address, on one shared port (as the pods of a Deployment). */
async function pods(t: { after(fn: () => unknown): void }, hosts: string[]): Promise<number> {
  const answer = (socket: net.Socket) => socket.end((socket.localAddress ?? '').replace(/^::ffff:/, ''));
  const first = await tcpServer(hosts[0]!, answer);
  const rest: TestServer[] = [];
  for (const host of hosts.slice(1)) rest.push(await listenOn(host, first.port, answer));
  t.after(() => Promise.all([first, ...rest].map((s) => s.close())));
  return first.port;
}

async function listenOn(host: string, port: number, handler: (s: net.Socket) => void): Promise<TestServer> {
  const server = net.createServer(handler);
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen({ host, port }, () => resolve());
  });
  return { host, port, connections: 0, close: () => new Promise((r) => server.close(() => r())) };
}

/** Who answers `n` connections to `port` (from `host`). */
async function answers(port: number, n = 12, host = '127.0.0.1'): Promise<Set<string>> {
  const seen = new Set<string>();
  for (let i = 0; i < n; i++) seen.add(await request(port, { host }));
  return seen;
}

test('ETP Local: the local list gets a second listener; ClusterIP traffic keeps the cluster list', async (t) => {
  const port = await pods(t, ['127.0.0.11', '127.0.0.12']);
  const eps = [
    { ip: '127.0.0.11', node: NODE },
    { ip: '127.0.0.12', node: 'node-2' },
  ];
  const lb = (etp: 'Local' | 'Cluster') => [
    svc('lb', port, { type: 'LoadBalancer', etp, nodePort: 30080 }),
    slice('lb', port, eps),
  ];
  const proxy = await startManifestProxy(lb('Local'), { hostnameOverride: NODE });
  t.after(() => proxy.close());
  const key = 'default/lb:http/TCP' as never;
  await waitFor(() => proxy.server.proxier.get(key) !== undefined, 3000, 'lb to open');
  const status = proxy.server.proxier.get(key)!;
  assert.notEqual(status.localProxyPort, 0, 'a second listener for the local list');
  assert.notEqual(status.localProxyPort, status.proxyPort);
  assert.deepEqual([...(await answers(status.proxyPort))].sort(), ['127.0.0.11', '127.0.0.12']);
  assert.deepEqual([...(await answers(status.localProxyPort))], ['127.0.0.11'], 'local list only');
  assert.ok(proxy.server.proxier.proxyPorts().has('default/lb:http/TCP/local'), 'kept across restarts');

  // Cluster policy: one listener again; back to Local: a second one again.
  await proxy.write(lb('Cluster'));
  await waitFor(
    () => proxy.server.proxier.get(key)?.localProxyPort === 0,
    3000,
    'the local listener to close',
  );
  assert.equal(proxy.server.proxier.get(key)?.proxyPort, status.proxyPort, 'the primary listener stays');
  await proxy.write(lb('Local'));
  await waitFor(() => (proxy.server.proxier.get(key)?.localProxyPort ?? 0) !== 0, 3000, 'a local listener');
  const again = proxy.server.proxier.get(key)!;
  assert.deepEqual([...(await answers(again.localProxyPort))], ['127.0.0.11']);
});

test('ETP Local without a local endpoint: the local listener has none, the cluster one still serves', async (t) => {
  const port = await pods(t, ['127.0.0.12']);
  const proxy = await startManifestProxy(
    [
      svc('lb', port, { type: 'LoadBalancer', etp: 'Local', nodePort: 30081 }),
      slice('lb', port, [{ ip: '127.0.0.12', node: 'node-2' }]),
    ],
    { hostnameOverride: NODE },
  );
  t.after(() => proxy.close());
  const key = 'default/lb:http/TCP' as never;
  await waitFor(() => proxy.server.proxier.get(key) !== undefined, 3000, 'lb to open');
  const status = proxy.server.proxier.get(key)!;
  assert.deepEqual(status.localEndpoints, []);
  assert.deepEqual([...(await answers(status.proxyPort, 3))], ['127.0.0.12']);
  await assert.rejects(request(status.localProxyPort), 'no endpoints: the connection is refused or reset');
  const metrics = await (await fetch(`http://${addressOf(proxy.server.metricsServer)}/metrics`)).text();
  assert.match(
    metrics,
    /^kubeproxy_sync_proxy_rules_no_local_endpoints_total\{traffic_policy="external"\} 1$/m,
  );
  assert.match(
    metrics,
    /^kubeproxy_sync_proxy_rules_no_local_endpoints_total\{traffic_policy="internal"\} 0$/m,
  );
});

test('ITP Local on a NodePort service: ClusterIP traffic gets the local list, NodePort traffic the cluster list', async (t) => {
  const port = await pods(t, ['127.0.0.11', '127.0.0.12']);
  const proxy = await startManifestProxy(
    [
      svc('np', port, { type: 'NodePort', itp: 'Local', nodePort: 30082 }),
      slice('np', port, [
        { ip: '127.0.0.11', node: NODE },
        { ip: '127.0.0.12', node: 'node-2' },
      ]),
    ],
    { hostnameOverride: NODE },
  );
  t.after(() => proxy.close());
  const key = 'default/np:http/TCP' as never;
  await waitFor(() => proxy.server.proxier.get(key) !== undefined, 3000, 'np to open');
  const status = proxy.server.proxier.get(key)!;
  // The primary listener serves external traffic (the cluster list), the second one the ClusterIP.
  assert.deepEqual([...(await answers(status.proxyPort))].sort(), ['127.0.0.11', '127.0.0.12']);
  assert.deepEqual([...(await answers(status.localProxyPort))], ['127.0.0.11']);
  const debug = (await (
    await fetch(`http://${addressOf(proxy.server.metricsServer)}/debug/services`)
  ).json()) as DebugServicePort[];
  const entry = debug.find((d) => d.service === 'default/np:http')!;
  assert.equal(entry.localProxyPort, status.localProxyPort);
  assert.deepEqual(entry.localEndpoints, ['127.0.0.11:' + port]);
});

test('ITP Local on a ClusterIP-only service: one listener, serving the local list', async (t) => {
  const port = await pods(t, ['127.0.0.11', '127.0.0.12']);
  const proxy = await startManifestProxy(
    [
      svc('in', port, { itp: 'Local' }),
      slice('in', port, [
        { ip: '127.0.0.11', node: NODE },
        { ip: '127.0.0.12', node: 'node-2' },
      ]),
    ],
    { hostnameOverride: NODE },
  );
  t.after(() => proxy.close());
  const key = 'default/in:http/TCP' as never;
  await waitFor(() => proxy.server.proxier.get(key) !== undefined, 3000, 'in to open');
  const status = proxy.server.proxier.get(key)!;
  assert.equal(status.localProxyPort, 0);
  assert.deepEqual([...(await answers(status.proxyPort))], ['127.0.0.11']);
});

test('dual-stack: IPv4 clients reach IPv4 endpoints only, IPv6 clients IPv6 endpoints only', async (t) => {
  if (!(await canListen('::1'))) {
    t.skip('no IPv6 loopback here');
    return;
  }
  const port = await pods(t, ['127.0.0.11', '::1']);
  const proxy = await startManifestProxy(
    [
      svc('dual', port, {}, ['10.96.0.20', 'fd00:96::20']),
      slice('dual', port, [{ ip: '127.0.0.11', node: NODE }]),
      slice('dual', port, [{ ip: '::1', node: NODE }], 'IPv6'),
    ],
    { hostnameOverride: NODE, bindAddress: '0.0.0.0' },
  );
  t.after(() => proxy.close());
  const key = 'default/dual:http/TCP' as never;
  await waitFor(() => proxy.server.proxier.get(key) !== undefined, 3000, 'dual to open');
  const { proxyPort } = proxy.server.proxier.get(key)!;
  assert.deepEqual([...(await answers(proxyPort, 6, '127.0.0.1'))], ['127.0.0.11']);
  assert.deepEqual([...(await answers(proxyPort, 6, '::1'))], ['::1']);
});

function addressOf(server: { port: number } | undefined): string {
  assert.ok(server, 'metrics server running');
  return `127.0.0.1:${server.port}`;
}

async function canListen(host: string): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.once('error', () => resolve(false));
    s.listen({ host, port: 0 }, () => s.close(() => resolve(true)));
  });
}

test('NodePorts are held on the service family only: no IPv4-only NodePort over IPv6, and back', async (t) => {
  if (!(await canListen('::1'))) {
    t.skip('no IPv6 loopback here');
    return;
  }
  const port = await pods(t, ['127.0.0.11', '::1']);
  const [np4, np6] = [await freePort(), await freePort()];
  const nodePortSvc = (name: string, nodePort: number, clusterIP: string) => ({
    ...svc(name, port, { type: 'NodePort', nodePort }, [clusterIP]),
  });
  const iptables: Iptables = {
    restore: async () => {},
    save: async () => '',
    missingJumps: async () => [],
    cleanup: async () => {},
    flushConntrackUDP: async () => {},
  };
  const proxy = await startManifestProxy(
    [
      nodePortSvc('v4', np4, '10.96.0.30'),
      slice('v4', port, [{ ip: '127.0.0.11', node: NODE }]),
      nodePortSvc('v6', np6, 'fd00:96::30'),
      slice('v6', port, [{ ip: '::1', node: NODE }], 'IPv6'),
    ],
    { hostnameOverride: NODE, bindAddress: '0.0.0.0', iptables: true },
    { iptables, hostInfo: fakeHostInfo },
  );
  t.after(() => proxy.close());
  await waitFor(() => proxy.server.proxier.status().length === 2, 3000, 'both to open');
  await waitFor(() => proxy.server.proxier.nodePortErrors().size === 0, 3000, 'the claims');
  assert.equal(await request(np4, { host: '127.0.0.1' }), '127.0.0.11', 'IPv4 NodePort over IPv4');
  await assert.rejects(request(np4, { host: '::1' }), /ECONNREFUSED/, 'IPv4-only NodePort over IPv6');
  assert.equal(await request(np6, { host: '::1' }), '::1', 'IPv6 NodePort over IPv6');
  await assert.rejects(request(np6, { host: '127.0.0.1' }), /ECONNREFUSED/, 'IPv6-only NodePort over IPv4');
});

/**
 * A port free on every address, below the ephemeral range: a connect to a port of that range where
 * nothing listens may draw the same port as its own and connect to itself (TCP's simultaneous open),
 * which would be an answer where the test wants ECONNREFUSED.
 */
async function freePort(): Promise<number> {
  const [low] = readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8')
    .trim()
    .split(/\s+/)
    .map(Number);
  const top = Math.max(2048, (low ?? 32768) - 1);
  for (let i = 0; i < 100; i++) {
    const port = top - Math.floor(Math.random() * Math.min(10_000, top - 1024));
    const s = net.createServer();
    const ok = await new Promise<boolean>((r) => {
      s.once('error', () => r(false));
      s.listen({ host: '::', port }, () => r(true));
    });
    if (ok) {
      await new Promise((r) => s.close(r));
      return port;
    }
  }
  throw new Error('no free port below the ephemeral range');
}
