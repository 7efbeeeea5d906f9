// Operability of a running proxy: metric names present and moving with traffic, /healthz turning red when
// syncs stall and green again, /livez, /proxyMode and /configz.
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import type { Config } from '../../src/config/config.ts';
import { DEFAULT_CONFIG } from '../../src/config/config.ts';
import { silentLogger } from '../../src/lib/log.ts';
import type { Iptables } from '../../src/netfilter/iptables.ts';
import { ProxyServer } from '../../src/proxy-server.ts';
import { fakeHostInfo } from '../helpers/host-info.ts';
import { service, slice, startManifestProxy, toYaml } from '../helpers/manifests.ts';
import { request, waitFor } from '../helpers/servers.ts';

async function start(t: { after(fn: () => unknown): void }, overrides: Partial<Config>, iptables?: Iptables) {
  const pod = net.createServer((s) => s.end('pod'));
  await new Promise<void>((r) => pod.listen({ host: '127.0.0.11', port: 0 }, () => r()));
  t.after(() => new Promise((r) => pod.close(r)));
  const podPort = (pod.address() as net.AddressInfo).port;
  const dir = await mkdtemp(join(tmpdir(), 'kup-ops-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const file = join(dir, 'm.yaml');
  const objects = (name: string) => [
    service(name, '10.96.0.1', [{ name: 'http', port: 80, targetPort: podPort }]),
    slice(name, `${name}-1`, [{ ip: '127.0.0.11' }], [{ name: 'http', port: podPort }]),
  ];
  await writeFile(file, toYaml(objects('web')));
  const config: Config = {
    ...DEFAULT_CONFIG,
    // In this process: one relaying process (the worker mode has tests of its own).
    workers: 1,
    manifest: file,
    iptables: iptables !== undefined,
    hostnameOverride: 'node-1',
    bindAddress: '0.0.0.0',
    healthzBindAddress: '127.0.0.1:0',
    metricsBindAddress: '127.0.0.1:0',
    iptablesMinSyncPeriodMs: 0,
    ...overrides,
  };
  const server = new ProxyServer(config, { log: silentLogger(), iptables, hostInfo: fakeHostInfo });
  await server.start();
  t.after(() => server.close());
  const get = async (srv: 'health' | 'metrics', path: string) => {
    const port = srv === 'health' ? server.healthServer!.port : server.metricsServer!.port;
    const res = await fetch(`http://127.0.0.1:${port}${path}`);
    return { status: res.status, text: await res.text() };
  };
  const write = async (name: string) => writeFile(file, toYaml([...objects('web'), ...objects(name)]));
  return { server, get, write };
}

function metricValue(text: string, name: string, labels: string): number {
  const line = text.split('\n').find((l) => l.startsWith(`${name}{`) && l.includes(labels));
  return line === undefined ? Number.NaN : Number(line.slice(line.lastIndexOf(' ') + 1));
}

test('metrics: kube-proxy names present, per service port counters move with traffic', async (t) => {
  const { server, get } = await start(t, {});
  const key = 'default/web:http/TCP';
  await waitFor(() => server.proxier.get(key as never) !== undefined, 3000, 'open');
  const before = (await get('metrics', '/metrics')).text;
  for (const name of [
    'kubeproxy_sync_proxy_rules_duration_seconds',
    'kubeproxy_sync_proxy_rules_last_timestamp_seconds',
    'kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds',
    'kubeproxy_network_programming_duration_seconds',
    'kubeproxy_sync_proxy_rules_service_changes_total',
    'kubeproxy_sync_proxy_rules_endpoint_changes_total',
    'kubeproxy_sync_proxy_rules_iptables_restore_failures_total',
    'process_cpu_seconds_total',
    'kup_service_connections_total',
    'kup_service_connections_active',
    'kup_service_bytes_total',
  ]) {
    assert.ok(before.includes(`# TYPE ${name} `), `${name} is exported`);
  }
  const labels = 'service="default/web:http",protocol="TCP"';
  assert.equal(metricValue(before, 'kup_service_connections_total', labels), 0);
  const port = server.proxier.get(key as never)!.proxyPort;
  for (let i = 0; i < 5; i++) assert.equal(await request(port, { host: '127.0.0.1' }), 'pod');
  await waitFor(() => server.proxier.activeConnections() === 0, 2000, 'connections to close');
  const after = (await get('metrics', '/metrics')).text;
  assert.equal(metricValue(after, 'kup_service_connections_total', labels), 5);
  assert.equal(metricValue(after, 'kup_service_bytes_total', `${labels},direction="to_client"`), 15);
  assert.ok(metricValue(after, 'kup_service_endpoint_picks_total', labels) === 5);
  assert.equal((await get('metrics', '/proxyMode')).text, 'userspace');
  // Tracing is on by default: the connections are in the table with their endpoint and close reason.
  const table = JSON.parse((await get('metrics', '/debug/connections?service=default/web')).text);
  assert.equal(table.recent.length, 5);
  assert.equal(table.recent[0].service, 'default/web:http');
  assert.match(table.recent[0].endpoint, /^127\.0\.0\.11:\d+$/);
  const configz = JSON.parse((await get('metrics', '/configz')).text);
  assert.equal(configz['kubeproxy.config.k8s.io'].kind, 'KubeProxyConfiguration');
  assert.equal(configz['kubeproxy.config.k8s.io'].iptables.syncPeriod, '30s');
});

test('/healthz turns unhealthy when syncs stall, and healthy again when they resume; /livez as well', async (t) => {
  let hold: Promise<void> | undefined;
  let release: () => void = () => {};
  const iptables: Iptables = {
    restore: async () => {
      await hold;
    },
    save: async () => '',
    missingJumps: async () => [],
    cleanup: async () => {},
    flushConntrackUDP: async () => {},
  };
  const { server, get, write } = await start(t, { iptablesSyncPeriodMs: 300 }, iptables);
  await waitFor(
    async () => (await get('health', '/healthz')).status === 200,
    3000,
    'healthy after the first sync',
  );
  const body = JSON.parse((await get('health', '/healthz')).text);
  assert.ok(body.lastUpdated && body.currentTime);
  // Rule programming hangs; a change is queued and not applied within 2 × the sync period.
  hold = new Promise<void>((r) => {
    release = r;
  });
  await write('api');
  await waitFor(async () => (await get('health', '/healthz')).status === 503, 3000, '/healthz to turn red');
  assert.equal((await get('health', '/livez')).status, 503);
  release();
  hold = undefined;
  await waitFor(async () => (await get('health', '/healthz')).status === 200, 3000, '/healthz to turn green');
  assert.equal((await get('health', '/livez')).status, 200);
  await waitFor(
    () => server.proxier.get('default/api:http/TCP' as never) !== undefined,
    3000,
    'the queued change',
  );
});

test('an endpoint-only change does not touch iptables; a service change does', async (t) => {
  const restores: string[] = [];
  const iptables: Iptables = {
    restore: async (_family, text) => {
      restores.push(text);
    },
    save: async () => '',
    missingJumps: async () => [],
    cleanup: async () => {},
    flushConntrackUDP: async () => {},
  };
  const { server, write } = await start(t, {}, iptables);
  await waitFor(
    () => server.proxier.get('default/web:http/TCP' as never) !== undefined && restores.length > 0,
    3000,
    'first sync',
  );
  const before = restores.length;
  // Same services, one endpoint more: balancers change, rules do not.
  server.state.onEndpointSliceAdd({
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: { name: 'web-2', namespace: 'default', labels: { 'kubernetes.io/service-name': 'web' } },
    addressType: 'IPv4',
    ports: [{ name: 'http', protocol: 'TCP', port: 8080 }],
    endpoints: [{ addresses: ['127.0.0.12'] }],
  });
  await waitFor(
    () => server.proxier.get('default/web:http/TCP' as never)?.endpoints.length === 2,
    3000,
    'endpoint change',
  );
  assert.equal(restores.length, before, 'no restore for an endpoint change');
  await write('api');
  await waitFor(() => restores.length > before, 3000, 'a restore for a new service');
});

test('healthz: a change queued while a sync runs is not marked applied by that sync', async (t) => {
  // Health timeout = 2 x sync period = 400 ms.
  const proxy = await startManifestProxy(
    [service('a', '10.96.0.1', [{ name: 'http', port: 80, targetPort: 9 }])],
    { iptablesSyncPeriodMs: 200 },
  );
  t.after(() => proxy.close());
  const server = proxy.server;
  await waitFor(() => server.health.lastUpdatedMs > 0, 3000, 'the first sync');
  // The next sync is held after its checkout; every sync after it fails (say iptables-restore breaks).
  const proxier = server.proxier;
  const original = proxier.sync.bind(proxier);
  let calls = 0;
  let holding = false;
  let release: () => void = () => {};
  const held = new Promise<void>((r) => {
    release = r;
  });
  proxier.sync = async () => {
    if (++calls > 1) throw new Error('sync keeps failing');
    const result = original();
    holding = true;
    await held;
    return result;
  };
  await waitFor(() => holding, 3000, 'a sync to start');
  const loads = server.manifest!.loads;
  await proxy.write([
    service('a', '10.96.0.1', [{ name: 'http', port: 80, targetPort: 9 }]),
    service('b', '10.96.0.2', [{ name: 'http', port: 80, targetPort: 9 }]),
  ]);
  await waitFor(() => server.manifest!.loads > loads, 3000, 'the change to be queued');
  release();
  await waitFor(() => calls >= 2, 3000, 'the failing sync');
  // Service b was never applied: /healthz must turn stale within the timeout.
  await waitFor(() => server.health.status(Date.now()).reason === 'stale', 3000, 'healthz to turn stale');
  assert.equal(proxier.get('default/b:http/TCP' as never), undefined);
});
