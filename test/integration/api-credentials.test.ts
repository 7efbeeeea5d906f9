// Without a kubeconfig file the start path never loads @kubernetes/client-node (~0.4 s and ~25 MB of
// heap at start), and the in-cluster service account's token reaches the API server.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { loadApiCredentials } from '../../src/source/api-credentials.ts';
import { KubernetesSource } from '../../src/source/kubernetes.ts';
import { startFakeApiServer } from '../helpers/fake-apiserver.ts';
import { NODE, RecordingHandlers, recordingLogger, seedBasic, synced } from '../helpers/source-harness.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

/** Imports the proxy's whole start path (proxy-server.ts and all it imports) in a child, loads credentials, says which client-node modules it resolved. */
function clientNodeLoaded(options: string, env: Record<string, string>): string[] {
  const script = `
    import { registerHooks } from 'node:module';
    const seen = [];
    registerHooks({ resolve(specifier, context, next) {
      const r = next(specifier, context);
      if (r.url.includes('@kubernetes/client-node')) seen.push(r.url);
      return r;
    } });
    await import('./src/proxy-server.ts');
    const { loadApiCredentials } = await import('./src/source/api-credentials.ts');
    await loadApiCredentials(${options});
    process.stdout.write(JSON.stringify(seen));
  `;
  const out = execFileSync(process.execPath, ['--input-type=module', '-e', script], {
    cwd: ROOT,
    env: { PATH: process.env.PATH ?? '', ...env },
    encoding: 'utf8',
  });
  return JSON.parse(out) as string[];
}

test('start path: client-node is loaded only for a kubeconfig file', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'api-credentials-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  // No kubeconfig anywhere (HOME is empty), --master given: none of it.
  assert.deepEqual(clientNodeLoaded(`{ master: 'http://127.0.0.1:1' }`, { HOME: dir }), []);
  const file = join(dir, 'config');
  await writeFile(file, 'apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n');
  assert.notDeepEqual(clientNodeLoaded(`{ kubeconfig: ${JSON.stringify(file)} }`, { HOME: dir }), []);
});

test('in-cluster service account: its token on every list and watch', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'api-credentials-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  await writeFile(join(dir, 'token'), 'sa-token');
  await writeFile(join(dir, 'ca.crt'), 'unused over plain http');
  const server = await startFakeApiServer({ token: 'sa-token' });
  t.after(() => server.close());
  seedBasic(server);
  const env = { HOME: dir, KUBERNETES_SERVICE_HOST: '127.0.0.1', KUBERNETES_SERVICE_PORT: '443' };
  const exists = (p: string) => p === join(dir, 'token');
  const credentials = await loadApiCredentials(
    { master: server.url },
    { env, platform: 'linux', homedir: dir, serviceAccountDir: dir, exists },
  );
  const h = new RecordingHandlers();
  const source = new KubernetesSource({
    credentials,
    handlers: h,
    nodeName: NODE,
    log: recordingLogger().logger,
    configSyncPeriodMs: 0,
  });
  t.after(() => source.stop());
  await source.start();
  await synced(h);
  assert.ok(server.requests.length >= 2);
  for (const r of server.requests) assert.equal(r.headers.authorization, 'Bearer sa-token', r.path);
});
