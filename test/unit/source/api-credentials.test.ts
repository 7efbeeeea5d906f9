// The credentials built without client-node (the in-cluster service account, the no-kubeconfig
// default) resolve and authenticate exactly as client-node's loadFromDefault + applySecurityAuthentication
// do for the same environment; every kubeconfig file still goes to client-node.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { KubeConfig } from '@kubernetes/client-node';
import {
  builtInCredentials,
  type Environment,
  resolveCredentialSource,
  SERVICE_ACCOUNT_DIR,
} from '../../../src/source/api-credentials.ts';
import { kubeConfigCredentials } from '../../../src/source/kubeconfig-credentials.ts';

const SA = '/sa';

function environment(files: string[], env: Record<string, string> = {}, platform = 'linux'): Environment {
  const present = new Set(files);
  return { env, platform, homedir: '/root', serviceAccountDir: SA, exists: (p) => present.has(p) };
}

test('resolveCredentialSource: a kubeconfig file anywhere goes to client-node', () => {
  const kubeconfig = { kind: 'kubeconfig' };
  assert.deepEqual(resolveCredentialSource({ kubeconfig: '/k' }, environment([])), kubeconfig);
  assert.deepEqual(resolveCredentialSource({}, environment([], { KUBECONFIG: '/a:/b' })), kubeconfig);
  assert.deepEqual(resolveCredentialSource({}, environment(['/root/.kube/config'])), kubeconfig);
  assert.deepEqual(
    resolveCredentialSource({}, environment(['/h', '/h/.kube/config'], { HOME: '/h' })),
    kubeconfig,
  );
  assert.deepEqual(resolveCredentialSource({}, environment([], {}, 'win32')), kubeconfig);
  // ~/.kube/config wins over the service account, as in client-node.
  assert.deepEqual(resolveCredentialSource({}, environment(['/sa/token', '/root/.kube/config'])), kubeconfig);
});

test('resolveCredentialSource: the service account, its server from the environment or --master', () => {
  const env = { KUBERNETES_SERVICE_HOST: '10.96.0.1', KUBERNETES_SERVICE_PORT: '443' };
  const files = { caFile: '/sa/ca.crt', tokenFile: '/sa/token' };
  assert.deepEqual(resolveCredentialSource({}, environment(['/sa/token'], env)), {
    kind: 'in-cluster',
    server: 'https://10.96.0.1:443',
    skipTLSVerify: false,
    ...files,
  });
  const v6 = { KUBERNETES_SERVICE_HOST: 'fd00::1', KUBERNETES_SERVICE_PORT: '8080' };
  assert.deepEqual(resolveCredentialSource({}, environment(['/sa/token'], v6)), {
    kind: 'in-cluster',
    server: 'http://[fd00::1]:8080',
    skipTLSVerify: true,
    ...files,
  });
  assert.deepEqual(
    resolveCredentialSource({ master: 'http://127.0.0.1:8001' }, environment(['/sa/token'], env)),
    {
      kind: 'in-cluster',
      server: 'http://127.0.0.1:8001',
      skipTLSVerify: true,
      ...files,
    },
  );
  // A HOME without .kube/config does not count.
  assert.equal(
    resolveCredentialSource({}, environment(['/sa/token', '/h'], { HOME: '/h' })).kind,
    'in-cluster',
  );
});

test('resolveCredentialSource: nothing at all is http://localhost:8080, or --master', () => {
  assert.deepEqual(resolveCredentialSource({}, environment([])), {
    kind: 'default',
    server: 'http://localhost:8080',
    skipTLSVerify: true,
  });
  assert.deepEqual(resolveCredentialSource({ master: 'https://api:6443' }, environment([])), {
    kind: 'default',
    server: 'https://api:6443',
    skipTLSVerify: false,
  });
});

test('builtInCredentials: the same headers and TLS choice as client-node for the same service account', async (t) => {
  const root = await mkdtemp(join(tmpdir(), 'api-credentials-'));
  t.after(() => rm(root, { recursive: true, force: true }));
  const dir = root + SERVICE_ACCOUNT_DIR;
  await mkdir(dir, { recursive: true });
  await writeFile(join(dir, 'token'), 'tok-1\n');
  await writeFile(join(dir, 'ca.crt'), 'not a certificate');
  const saved = { ...process.env };
  t.after(() => {
    for (const name of ['KUBERNETES_SERVICE_HOST', 'KUBERNETES_SERVICE_PORT']) {
      if (saved[name] === undefined) delete process.env[name];
      else process.env[name] = saved[name];
    }
  });
  process.env.KUBERNETES_SERVICE_HOST = '10.96.0.1';
  process.env.KUBERNETES_SERVICE_PORT = '443';
  const kc = new KubeConfig();
  kc.loadFromCluster(root);
  const env = { KUBERNETES_SERVICE_HOST: '10.96.0.1', KUBERNETES_SERVICE_PORT: '443' };
  const exists = (p: string) => p === `${dir}/token`;
  const source = resolveCredentialSource(
    {},
    { env, platform: 'linux', homedir: '/nowhere', serviceAccountDir: dir, exists },
  );
  assert.equal(source.kind, 'in-cluster');
  if (source.kind !== 'in-cluster') return;
  const ours = await builtInCredentials(source, {
    readFile: (p) => readFileSync(p),
    nowMs: () => 0,
  }).authenticate();
  const theirs = await kubeConfigCredentials(kc).authenticate();
  assert.equal(ours.server, theirs.server);
  assert.deepEqual(ours.headers, theirs.headers);
  assert.equal(ours.headers.Authorization, 'Bearer tok-1\n');
  assert.equal(ours.dispatcher !== undefined, theirs.dispatcher !== undefined);
  await ours.dispatcher?.close();
  await theirs.dispatcher?.close();
});

test('builtInCredentials: the token file is reread after 60 s, the CA file on every request; no TLS, no dispatcher', async () => {
  const reads: string[] = [];
  let token = 'a';
  let now = 0;
  const readFile = (p: string) => {
    reads.push(p);
    return Buffer.from(p.endsWith('token') ? token : 'ca');
  };
  const source = {
    kind: 'in-cluster',
    server: 'https://api:6443/',
    skipTLSVerify: false,
    caFile: '/sa/ca.crt',
    tokenFile: '/sa/token',
  } as const;
  const creds = builtInCredentials(source, { readFile, nowMs: () => now });
  const first = await creds.authenticate();
  assert.equal(first.server, 'https://api:6443');
  assert.equal(first.headers.Authorization, 'Bearer a');
  token = 'b';
  now = 60_000;
  assert.equal((await creds.authenticate()).headers.Authorization, 'Bearer a');
  now = 60_001;
  assert.equal((await creds.authenticate()).headers.Authorization, 'Bearer b');
  assert.deepEqual(reads, ['/sa/ca.crt', '/sa/token', '/sa/ca.crt', '/sa/ca.crt', '/sa/token']);
  token = '';
  now = 200_000;
  assert.deepEqual((await creds.authenticate()).headers, {});

  const plain = builtInCredentials(
    { kind: 'default', server: 'https://api:6443', skipTLSVerify: false },
    { readFile, nowMs: () => 0 },
  );
  const auth = await plain.authenticate();
  assert.deepEqual(auth.headers, {});
  assert.equal(auth.dispatcher, undefined);
  const insecure = builtInCredentials(
    { kind: 'default', server: 'http://localhost:8080', skipTLSVerify: true },
    { readFile, nowMs: () => 0 },
  );
  const d = (await insecure.authenticate()).dispatcher;
  assert.notEqual(d, undefined);
  await d?.close();
});
