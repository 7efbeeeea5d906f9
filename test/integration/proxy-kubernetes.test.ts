// The whole proxy (--no-iptables) on the Kubernetes source, against the stand-in API server, with real
// loopback traffic: objects flow through to traffic, the API server can be down at start, and
// health check node ports answer.
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { test } from 'node:test';
import type { Config } from '../../src/config/config.ts';
import { DEFAULT_CONFIG } from '../../src/config/config.ts';
import { createLogger } from '../../src/lib/log.ts';
import { ProxyServer } from '../../src/proxy-server.ts';
import { makeEndpointSlice, makeService, startFakeApiServer } from '../helpers/fake-apiserver.ts';
import { request, waitFor } from '../helpers/servers.ts';

async function setup(
  t: { after(fn: () => unknown): void },
  options: { down?: boolean; minSyncPeriodMs?: number; master?: boolean } = {},
) {
  // --master alone: no kubeconfig, so no token (kube-proxy's `--master http://127.0.0.1:8080`).
  const api = await startFakeApiServer(options.master ? {} : { token: 'secret-token' });
  t.after(() => api.close());
  const dir = await mkdtemp(join(tmpdir(), 'kup-kube-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const kubeconfig = await api.writeKubeconfig(dir);
  if (options.down) await api.stop();
  const logs: string[] = [];
  const destination = new Writable({
    write(chunk, _e, cb) {
      logs.push(String(chunk));
      cb();
    },
  });
  const config: Config = {
    ...DEFAULT_CONFIG,
    // In this process: one relaying process (the worker mode has tests of its own).
    workers: 1,
    ...(options.master ? { master: api.url } : { kubeconfig }),
    iptables: false,
    hostnameOverride: 'node-1',
    bindAddress: '127.0.0.1',
    healthzBindAddress: '127.0.0.1:0',
    metricsBindAddress: '127.0.0.1:0',
    iptablesMinSyncPeriodMs: options.minSyncPeriodMs ?? 0,
  };
  const server = new ProxyServer(config, { log: createLogger({ level: 'debug', destination }) });
  await server.start();
  t.after(() => server.close());
  const healthz = async () => {
    const res = await fetch(`http://127.0.0.1:${server.healthServer!.port}/healthz`);
    return res.status;
  };
  return { api, server, logs, healthz };
}

async function pod(t: { after(fn: () => unknown): void }, host: string, port = 0) {
  const server = net.createServer((s) => s.end(host));
  await new Promise<void>((resolve) => server.listen({ host, port }, () => resolve()));
  t.after(() => new Promise((r) => server.close(r)));
  return (server.address() as net.AddressInfo).port;
}

function proxyPort(server: ProxyServer, key: string) {
  return server.proxier.get(key as never)?.proxyPort;
}

test('endpoint changes take effect at once, not after --iptables-min-sync-period', async (t) => {
  // 30 s between syncs: only the endpoint fast path can apply these in time. The runner's burst of 2
  // is spent by the first sync and the Service; every endpoint change after that would wait 30 s.
  const { api, server } = await setup(t, { minSyncPeriodMs: 30_000 });
  const port = await pod(t, '127.0.0.11');
  await pod(t, '127.0.0.12', port);
  await pod(t, '127.0.0.13', port);
  const ports = [{ name: 'http', protocol: 'TCP', port }];
  api.create(
    makeService('shop', 'web', { ports: [{ name: 'http', protocol: 'TCP', port: 80, targetPort: port }] }),
  );
  api.create(makeEndpointSlice('shop', 'web-abc', 'web', ['127.0.0.11'], ports));
  const key = 'shop/web:http/TCP';
  await waitFor(() => proxyPort(server, key) !== undefined, 5000, 'the service port to open');
  const syncs = server.proxier.lastSyncMs;
  for (const ip of ['127.0.0.12', '127.0.0.13', '127.0.0.11', '127.0.0.12']) {
    const started = Date.now();
    api.update(makeEndpointSlice('shop', 'web-abc', 'web', [ip], ports));
    await waitFor(
      () => server.proxier.get(key as never)?.endpoints[0]?.ip === ip,
      2000,
      `endpoint ${ip} in the balancer`,
    );
    assert.equal(await request(proxyPort(server, key)!), ip);
    assert.ok(Date.now() - started < 2000);
  }
  // Applied without a sync.
  assert.equal(server.proxier.lastSyncMs, syncs);
  const metrics = await (await fetch(`http://127.0.0.1:${server.metricsServer!.port}/metrics`)).text();
  assert.match(metrics, /kubeproxy_sync_proxy_rules_endpoint_changes_total [5-9]/);
});

test('Services and EndpointSlices from the API server flow through to traffic', async (t) => {
  const { api, server, healthz } = await setup(t);
  const port = await pod(t, '127.0.0.11');
  await pod(t, '127.0.0.12', port);
  api.create(
    makeService('shop', 'web', { ports: [{ name: 'http', protocol: 'TCP', port: 80, targetPort: port }] }),
  );
  api.create(
    makeEndpointSlice('shop', 'web-abc', 'web', ['127.0.0.11'], [{ name: 'http', protocol: 'TCP', port }]),
  );
  const key = 'shop/web:http/TCP';
  await waitFor(() => proxyPort(server, key) !== undefined, 5000, 'the service port to open');
  assert.equal(await request(proxyPort(server, key)!), '127.0.0.11');
  assert.equal(await healthz(), 200);
  // An endpoint change takes effect without moving the listener.
  const before = proxyPort(server, key);
  api.update(
    makeEndpointSlice('shop', 'web-abc', 'web', ['127.0.0.12'], [{ name: 'http', protocol: 'TCP', port }]),
  );
  await waitFor(
    async () => (await request(proxyPort(server, key)!)) === '127.0.0.12',
    5000,
    'the new endpoint',
  );
  assert.equal(proxyPort(server, key), before);
  // Headless and other proxies' services never arrive.
  api.create(makeService('shop', 'headless', { clusterIP: 'None' }));
  api.create(
    makeService('shop', 'other', {}, { labels: { 'service.kubernetes.io/service-proxy-name': 'foo' } }),
  );
  // Deleting the Service closes its listener.
  api.remove('Service', 'shop', 'web');
  await waitFor(() => proxyPort(server, key) === undefined, 5000, 'the service port to close');
  assert.equal(server.proxier.status().length, 0);
  // Every request carried the bearer token.
  assert.ok(api.requests.length > 0);
  for (const r of api.requests) assert.equal(r.headers['authorization'], 'Bearer secret-token');
});

test('--master alone, no kubeconfig: listed from the API server and served', async (t) => {
  const { api, server } = await setup(t, { master: true });
  const port = await pod(t, '127.0.0.11');
  api.create(
    makeService('shop', 'web', { ports: [{ name: 'http', protocol: 'TCP', port: 80, targetPort: port }] }),
  );
  api.create(
    makeEndpointSlice('shop', 'web-abc', 'web', ['127.0.0.11'], [{ name: 'http', protocol: 'TCP', port }]),
  );
  const key = 'shop/web:http/TCP';
  await waitFor(() => proxyPort(server, key) !== undefined, 5000, 'the service port to open');
  assert.equal(await request(proxyPort(server, key)!), '127.0.0.11');
  assert.ok(api.requests.length > 0);
  for (const r of api.requests)
    assert.equal(r.headers['user-agent']?.startsWith('kube-userspace-proxy/'), true);
});

test('API server down at start: the proxy waits, health says not ready, then it serves', async (t) => {
  const { api, server, healthz } = await setup(t, { down: true });
  const port = await pod(t, '127.0.0.11');
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(await healthz(), 503);
  assert.equal(server.state.isInitialized, false);
  await api.restart();
  api.create(
    makeService('shop', 'web', { ports: [{ name: 'http', protocol: 'TCP', port: 80, targetPort: port }] }),
  );
  api.create(
    makeEndpointSlice('shop', 'web-abc', 'web', ['127.0.0.11'], [{ name: 'http', protocol: 'TCP', port }]),
  );
  const key = 'shop/web:http/TCP';
  await waitFor(() => proxyPort(server, key) !== undefined, 15_000, 'serving after the API server came back');
  assert.equal(await request(proxyPort(server, key)!), '127.0.0.11');
  await waitFor(async () => (await healthz()) === 200, 5000, 'healthy');
});

test('a health check node port answers with the local endpoint count', async (t) => {
  const { api } = await setup(t);
  const hcPort = await freePort();
  const svc = (count: 'local' | 'none') =>
    makeEndpointSlice(
      'shop',
      'lb-1',
      'lb',
      count === 'local'
        ? [
            { addresses: ['127.0.0.11'], nodeName: 'node-1' },
            { addresses: ['127.0.0.12'], nodeName: 'node-1' },
            { addresses: ['127.0.0.13'], nodeName: 'node-2' },
          ]
        : [{ addresses: ['127.0.0.13'], nodeName: 'node-2' }],
      [{ name: 'http', protocol: 'TCP', port: 8080 }],
    );
  api.create(
    makeService('shop', 'lb', {
      type: 'LoadBalancer',
      externalTrafficPolicy: 'Local',
      healthCheckNodePort: hcPort,
      ports: [{ name: 'http', protocol: 'TCP', port: 80, targetPort: 8080 }],
    }),
  );
  api.create(svc('local'));
  let body: { localEndpoints?: number; service?: { namespace: string; name: string } } = {};
  await waitFor(
    async () => {
      try {
        const res = await fetch(`http://127.0.0.1:${hcPort}/`);
        body = (await res.json()) as typeof body;
        return res.status === 200 && body.localEndpoints === 2;
      } catch {
        return false;
      }
    },
    5000,
    'the health check node port',
  );
  assert.deepEqual(body.service, { namespace: 'shop', name: 'lb' });
  api.update(svc('none'));
  await waitFor(
    async () => (await fetch(`http://127.0.0.1:${hcPort}/`)).status === 503,
    5000,
    '503 with no local endpoints',
  );
});

function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen({ host: '127.0.0.1', port: 0 }, () => {
      const { port } = s.address() as net.AddressInfo;
      s.close(() => resolve(port));
    });
  });
}
