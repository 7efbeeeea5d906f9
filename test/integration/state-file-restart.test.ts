// The proxy-port assignment survives a restart through --state-file, also with --no-iptables (no rules
// to read it back from); a corrupt file costs nothing but new ports; two proxies never share one file.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { lstat, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { DEFAULT_CONFIG } from '../../src/config/config.ts';
import { silentLogger } from '../../src/lib/log.ts';
import { ProxyServer } from '../../src/proxy-server.ts';
import { service, slice, startManifestProxy } from '../helpers/manifests.ts';
import { identityServer, request, waitFor } from '../helpers/servers.ts';

const KEYS = ['default/web:http/TCP', 'default/api:grpc/TCP', 'default/dns:dns/UDP'];

function objects(port: number) {
  return [
    service('web', '10.96.0.20', [{ name: 'http', port: 80, targetPort: port }]),
    slice('web', 'web-1', [{ ip: '127.0.0.11' }], [{ name: 'http', port }]),
    service('api', '10.96.0.21', [{ name: 'grpc', port: 90, targetPort: port }]),
    slice('api', 'api-1', [{ ip: '127.0.0.11' }], [{ name: 'grpc', port }]),
    service('dns', '10.96.0.10', [{ name: 'dns', port: 53, targetPort: 5353, protocol: 'UDP' }]),
  ];
}

test('--state-file: a restart (no iptables) gets the same proxy ports; the file is rewritten only when ports move', async (t) => {
  const backend = await identityServer('127.0.0.11', 'pod');
  t.after(() => backend.close());
  const dir = await mkdtemp(join(tmpdir(), 'kup-statefile-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const stateFile = join(dir, 'sub', 'state.json');

  const first = await startManifestProxy(objects(backend.port), { stateFile });
  const ports = () => Object.fromEntries(KEYS.map((k) => [k, first.proxyPort(k)]));
  await waitFor(() => KEYS.every((k) => first.proxyPort(k) !== undefined), 5000, 'the service ports');
  const before = ports();
  await waitFor(
    async () => (await readFile(stateFile, 'utf8').catch(() => '')).includes('dns'),
    5000,
    'the file',
  );
  const text = await readFile(stateFile, 'utf8');
  assert.deepEqual(JSON.parse(text), {
    version: 1,
    proxyPorts: Object.fromEntries(Object.entries(before).sort()),
  });
  // An endpoint-only change moves no port: the file is not rewritten.
  await first.write([
    ...objects(backend.port),
    slice('dns', 'dns-1', [{ ip: '127.0.0.12' }], [{ name: 'dns', port: 5353, protocol: 'UDP' }]),
  ]);
  await waitFor(
    () => (first.server.proxier.get('default/dns:dns/UDP' as never)?.endpoints.length ?? 0) === 1,
    5000,
    'the endpoint',
  );
  await first.server.runner.stop();
  assert.equal(await readFile(stateFile, 'utf8'), text);
  await first.close();

  const second = await startManifestProxy(objects(backend.port), { stateFile });
  t.after(() => second.close());
  await waitFor(() => KEYS.every((k) => second.proxyPort(k) !== undefined), 5000, 'the service ports again');
  assert.deepEqual(Object.fromEntries(KEYS.map((k) => [k, second.proxyPort(k)])), before, 'the same ports');
  assert.equal(await request(second.proxyPort('default/web:http/TCP')!), 'pod');
  assert.match(second.logs.join(''), /"servicePorts":3,"msg":"Reusing the proxy ports of the state file"/);
});

test('--state-file: a corrupt file is logged and ignored; the proxy serves and rewrites it', async (t) => {
  const backend = await identityServer('127.0.0.11', 'pod');
  t.after(() => backend.close());
  const dir = await mkdtemp(join(tmpdir(), 'kup-statefile-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const stateFile = join(dir, 'state.json');
  await writeFile(stateFile, '\u0000\u0001 not json');
  const proxy = await startManifestProxy(objects(backend.port), { stateFile });
  t.after(() => proxy.close());
  await waitFor(() => KEYS.every((k) => proxy.proxyPort(k) !== undefined), 5000, 'the service ports');
  assert.equal(await request(proxy.proxyPort('default/web:http/TCP')!), 'pod');
  assert.match(proxy.logs.join(''), /Corrupt state file, ignoring it/);
  await waitFor(async () => (await readFile(stateFile, 'utf8')).startsWith('{'), 5000, 'the file rewritten');
});

test('--state-file "": no file; the default path is used only where its directory exists', async (t) => {
  const proxy = await startManifestProxy(objects(1), { stateFile: '' });
  t.after(() => proxy.close());
  assert.doesNotMatch(proxy.logs.join(''), /state file/);
});

test('--state-file: a second proxy on the same file refuses to start, naming the holder; the first serves on', async (t) => {
  const backend = await identityServer('127.0.0.11', 'pod');
  t.after(() => backend.close());
  const dir = await mkdtemp(join(tmpdir(), 'kup-statefile-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const stateFile = join(dir, 'state.json');
  const first = await startManifestProxy(objects(backend.port), { stateFile });
  t.after(() => first.close());
  await waitFor(() => KEYS.every((k) => first.proxyPort(k) !== undefined), 5000, 'the service ports');
  await waitFor(
    async () => (await readFile(stateFile, 'utf8').catch(() => '')).includes('dns'),
    5000,
    'the file',
  );
  const text = await readFile(stateFile, 'utf8');

  const second = new ProxyServer(
    {
      ...DEFAULT_CONFIG,
      // In this process: one relaying process (the worker mode has tests of its own).
      workers: 1,
      manifest: first.file,
      iptables: false,
      hostnameOverride: 'node-1',
      // The first one's health port, with hard-fail: the lock is taken before any server binds.
      healthzBindAddress: `127.0.0.1:${first.server.healthServer!.port}`,
      bindAddressHardFail: true,
      metricsBindAddress: '',
      stateFile,
    },
    { log: silentLogger() },
  );
  assert.ok((await lstat(`${stateFile}.lock`)).isSocket(), 'the lock is a socket beside the file');
  await assert.rejects(second.start(), (err: Error & { code?: string }) => {
    assert.equal(err.code, 'KUP_ERR_STATE_FILE_LOCKED', err.message);
    assert.match(
      err.message,
      new RegExp(`another proxy \\(pid ${process.pid} on ${hostname()}\\) uses the state file ${stateFile}`),
    );
    return true;
  });
  await second.close();
  assert.equal(await readFile(stateFile, 'utf8'), text, 'the file is untouched');
  assert.equal(await request(first.proxyPort('default/web:http/TCP')!), 'pod');

  // Released at close: the next proxy takes the file and its ports.
  const before = Object.fromEntries(KEYS.map((k) => [k, first.proxyPort(k)]));
  await first.close();
  await assert.rejects(lstat(`${stateFile}.lock`), { code: 'ENOENT' });
  const third = await startManifestProxy(objects(backend.port), { stateFile });
  t.after(() => third.close());
  await waitFor(() => KEYS.every((k) => third.proxyPort(k) !== undefined), 5000, 'the service ports again');
  assert.deepEqual(Object.fromEntries(KEYS.map((k) => [k, third.proxyPort(k)])), before);
});

test('--state-file: the lock socket a killed proxy left behind does not keep the next one from starting', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'kup-statefile-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const stateFile = join(dir, 'state.json');
  // A process that takes the lock and dies by SIGKILL: its socket stays, nobody answers on it.
  const lockModule = new URL('../../src/proxier/state-file-lock.ts', import.meta.url).href;
  const child = spawn(process.execPath, [
    '--input-type=module',
    '-e',
    `import { lockStateFile } from ${JSON.stringify(lockModule)};
     await lockStateFile(${JSON.stringify(stateFile)}); process.kill(process.pid, 'SIGKILL');`,
  ]);
  await new Promise((resolve) => child.on('exit', resolve));
  assert.equal(child.signalCode, 'SIGKILL');
  assert.ok((await lstat(`${stateFile}.lock`)).isSocket(), 'a stale lock socket');
  const proxy = await startManifestProxy(objects(1), { stateFile });
  try {
    assert.ok((await lstat(`${stateFile}.lock`)).isSocket());
  } finally {
    // Closed here, before the directory goes: its last state-file write must not race the removal.
    await proxy.close();
  }
});
