// What the proxy shows and to whom: the health server answers health and nothing else; metrics, debug and
// config are on the metrics server, which listens on loopback by default; the API token never reaches
// the logs, not even when the API server refuses it.
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { test } from 'node:test';
import { DEFAULT_CONFIG } from '../../src/config/config.ts';
import { createLogger } from '../../src/lib/log.ts';
import { ProxyServer } from '../../src/proxy-server.ts';
import { startFakeApiServer } from '../helpers/fake-apiserver.ts';
import { service, startManifestProxy } from '../helpers/manifests.ts';
import { waitFor } from '../helpers/servers.ts';

test('defaults: metrics and debug on loopback, health on every address', () => {
  assert.match(DEFAULT_CONFIG.metricsBindAddress, /^127\.0\.0\.1:/);
  assert.equal(DEFAULT_CONFIG.healthzBindAddress, '0.0.0.0:10256');
});

test('the health server answers /healthz and /livez only', async (t) => {
  const proxy = await startManifestProxy([
    service('web', '10.96.0.1', [{ name: 'http', port: 80, targetPort: 9 }]),
  ]);
  t.after(() => proxy.close());
  const health = `http://127.0.0.1:${proxy.server.healthServer!.port}`;
  const metrics = `http://127.0.0.1:${proxy.server.metricsServer!.port}`;
  await waitFor(async () => (await fetch(`${health}/healthz`)).status === 200, 3000, 'healthy');
  const body = (await (await fetch(`${health}/healthz`)).json()) as Record<string, unknown>;
  assert.deepEqual(Object.keys(body).sort(), [
    'currentTime',
    'healthy',
    'lastUpdated',
    'nodeEligible',
    'reason',
  ]);
  assert.equal((await fetch(`${health}/livez`)).status, 200);
  for (const path of [
    '/metrics',
    '/debug/services',
    '/configz',
    '/proxyMode',
    '/debug/connections',
    '/',
    '/..%2fmetrics',
  ])
    assert.equal((await fetch(`${health}${path}`)).status, 404, `health server ${path}`);
  for (const path of ['/metrics', '/debug/services', '/configz'])
    assert.equal((await fetch(`${metrics}${path}`)).status, 200, `metrics server ${path}`);
});

test('a token the API server refuses is not logged', async (t) => {
  const api = await startFakeApiServer({ token: 'the-right-token' });
  t.after(() => api.close());
  const dir = await mkdtemp(join(tmpdir(), 'kup-exposure-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const SECRET = 'wrong-but-secret-token-91c4';
  const kubeconfig = join(dir, 'kubeconfig');
  await writeFile(kubeconfig, api.kubeconfigYaml().replace('the-right-token', SECRET), { mode: 0o600 });
  const lines: string[] = [];
  const log = createLogger({
    level: 'trace',
    destination: new Writable({
      write(chunk, _e, cb) {
        lines.push(String(chunk));
        cb();
      },
    }),
  });
  const server = new ProxyServer(
    {
      ...DEFAULT_CONFIG,
      // In this process: one relaying process (the worker mode has tests of its own).
      workers: 1,
      kubeconfig,
      iptables: false,
      hostnameOverride: 'node-1',
      bindAddress: '127.0.0.1',
      healthzBindAddress: '127.0.0.1:0',
      metricsBindAddress: '127.0.0.1:0',
      verbosity: 4,
    },
    { log },
  );
  await server.start();
  t.after(() => server.close());
  await waitFor(() => lines.some((l) => l.includes('Watch failed, retrying')), 5000, 'a refused request');
  assert.ok(
    api.requests.some((r) => r.headers['authorization'] === `Bearer ${SECRET}`),
    'the token was sent',
  );
  assert.match(lines.join(''), /401/);
  assert.ok(!lines.join('').includes(SECRET), 'the token is not in the logs');
  const configz = await fetch(`http://127.0.0.1:${server.metricsServer!.port}/configz`);
  assert.ok(!(await configz.text()).includes(SECRET), '/configz shows the kubeconfig path, not its token');
});
