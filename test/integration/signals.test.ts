// Signals a local process can send the CLI: SIGUSR1 must not open Node's inspector (code execution as
// root for anyone on the host's loopback), SIGHUP drains like SIGTERM. Loopback only, --no-iptables.
import assert from 'node:assert/strict';
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { constants, tmpdir } from 'node:os';
import { join } from 'node:path';
import { type TestContext, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { service, slice, toYaml } from '../helpers/manifests.ts';

const BIN = fileURLToPath(new URL('../../bin/kube-userspace-proxy.js', import.meta.url));
/** What Node prints when a signal opened (or tried to open) its inspector. */
const INSPECTOR = /Debugger listening|Starting inspector/;

type Proxy = {
  child: ChildProcess;
  stdout: () => string;
  stderr: () => string;
  proxyPort: number;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
};

/**
 * A backend on 127.0.0.1 that answers `pong` `delayMs` after it reads anything, then closes; `onRequest`
 * runs when it reads (the request went through the proxy).
 */
async function slowBackend(
  t: TestContext,
  delayMs: number,
  onRequest: () => void = () => {},
): Promise<number> {
  const server = net.createServer((socket) => {
    socket.on('error', () => {});
    socket.once('data', () => {
      onRequest();
      setTimeout(() => socket.end('pong'), delayMs);
    });
  });
  await new Promise<void>((resolve) => server.listen({ host: '127.0.0.1', port: 0 }, resolve));
  t.after(() => new Promise((resolve) => server.close(resolve)));
  return (server.address() as net.AddressInfo).port;
}

async function startProxy(
  t: TestContext,
  backendPort: number,
  env: NodeJS.ProcessEnv = {},
  extraArgs: readonly string[] = [],
): Promise<Proxy> {
  const dir = await mkdtemp(join(tmpdir(), 'kup-signals-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const file = join(dir, 'm.yaml');
  await writeFile(
    file,
    toYaml([
      service('web', '10.96.0.1', [{ name: 'http', port: 80, targetPort: backendPort }]),
      slice('web', 'w', [{ ip: '127.0.0.1' }], [{ name: 'http', port: backendPort }]),
    ]),
  );
  const args = [
    BIN,
    '--manifest',
    file,
    '--no-iptables',
    '--bind-address=0.0.0.0',
    '--healthz-bind-address=',
    '--metrics-bind-address=',
    '--state-file=',
    ...extraArgs,
  ];
  const child = spawn(process.execPath, args, {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, KUP_INSPECTOR_SIGNAL: '', ...env },
  });
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (c) => {
    stdout += c;
  });
  child.stderr!.on('data', (c) => {
    stderr += c;
  });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.on('exit', (code, signal) => resolve({ code, signal })),
  );
  t.after(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  });
  const deadline = Date.now() + 10_000;
  let proxyPort = 0;
  while (proxyPort === 0 && Date.now() < deadline && child.exitCode === null) {
    const line = stdout.split('\n').find((l) => l.includes('Opened service port'));
    if (line !== undefined) proxyPort = (JSON.parse(line) as { proxyPort: number }).proxyPort;
    else await sleep(20);
  }
  assert.ok(proxyPort > 0, `the proxy did not open its port:\n${stdout}\n${stderr}`);
  return { child, stdout: () => stdout, stderr: () => stderr, proxyPort, exited };
}

/** Connects through the proxy, sends `ping`, resolves with everything read until the close. */
function exchange(port: number, onSent: () => void = () => {}): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host: '127.0.0.1', port }, () => {
      socket.write('ping');
      onSent();
    });
    let got = '';
    socket.setEncoding('utf8');
    socket.on('data', (c) => {
      got += c;
    });
    socket.on('end', () => resolve(got));
    socket.on('error', reject);
    socket.setTimeout(5_000, () => socket.destroy(new Error('no answer in 5 s')));
  });
}

test('SIGUSR1 does not open the inspector: the proxy logs it once and keeps serving', async (t) => {
  const backend = await slowBackend(t, 0);
  const proxy = await startProxy(t, backend);
  for (let i = 0; i < 3; i++) {
    proxy.child.kill('SIGUSR1');
    await sleep(100);
  }
  await sleep(300);
  assert.doesNotMatch(proxy.stderr(), INSPECTOR);
  assert.equal(proxy.child.exitCode, null, 'the proxy is alive');
  assert.equal(await exchange(proxy.proxyPort), 'pong');
  const ignored = proxy
    .stdout()
    .split('\n')
    .filter((l) => l.includes('Ignoring SIGUSR1'));
  assert.equal(ignored.length, 1, proxy.stdout());
  proxy.child.kill('SIGTERM');
  assert.deepEqual(await proxy.exited, { code: 0, signal: null });
});

/** The proxy's worker processes (its children), once `count` of them run; [] after 10 s. */
async function workerPids(pid: number, count: number): Promise<number[]> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const children = (await readFile(`/proc/${pid}/task/${pid}/children`, 'utf8').catch(() => ''))
      .trim()
      .split(/\s+/)
      .filter(Boolean)
      .map(Number);
    if (children.length >= count || Date.now() > deadline) return children;
    await sleep(50);
  }
}

/** Resolves once `pid` has a handler for SIGUSR1 (its SigCgt mask in /proc); fails after 10 s. */
async function catchesSigusr1(pid: number): Promise<void> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const status = await readFile(`/proc/${pid}/status`, 'utf8').catch(() => '');
    const caught = /^SigCgt:\s*([0-9a-f]+)$/m.exec(status)?.[1];
    if (caught !== undefined && (BigInt(`0x${caught}`) >> BigInt(constants.signals.SIGUSR1 - 1)) & 1n) return;
    assert.ok(Date.now() < deadline, `worker ${pid} catches SIGUSR1 within 10 s`);
    await sleep(20);
  }
}

test('SIGUSR1 to a worker process neither opens the inspector nor kills it; every process keeps serving', async (t) => {
  const backend = await slowBackend(t, 0);
  const proxy = await startProxy(t, backend, {}, ['--workers=3']);
  const workers = await workerPids(proxy.child.pid!, 2);
  assert.equal(workers.length, 2, `two workers besides the main process: ${workers.join(' ')}`);
  // Once each runs: between its fork and its first import no process can catch anything (libuv resets
  // every signal to its default in the child, and SIGUSR1's default is to end it).
  for (const pid of workers) await catchesSigusr1(pid);
  for (const pid of workers) process.kill(pid, 'SIGUSR1');
  await sleep(500);
  assert.doesNotMatch(proxy.stderr(), INSPECTOR);
  // Neither died (a worker killed by the signal would be replaced under another pid).
  assert.deepEqual(await workerPids(proxy.child.pid!, 2), workers);
  // Connections spread over the three processes (SO_REUSEPORT): all of them answer.
  for (let i = 0; i < 12; i++) assert.equal(await exchange(proxy.proxyPort), 'pong');
  proxy.child.kill('SIGTERM');
  assert.deepEqual(await proxy.exited, { code: 0, signal: null });
});

test('KUP_INSPECTOR_SIGNAL=1 (the benchmark’s switch) lets SIGUSR1 open the inspector', async (t) => {
  const backend = await slowBackend(t, 0);
  const proxy = await startProxy(t, backend, { KUP_INSPECTOR_SIGNAL: '1' });
  proxy.child.kill('SIGUSR1');
  const deadline = Date.now() + 5_000;
  while (!INSPECTOR.test(proxy.stderr()) && Date.now() < deadline) await sleep(20);
  assert.match(proxy.stderr(), INSPECTOR);
  proxy.child.kill('SIGTERM');
  assert.deepEqual(await proxy.exited, { code: 0, signal: null });
});

test('SIGHUP drains like SIGTERM, also when sent twice: a request in flight gets its answer, exit 0', async (t) => {
  let proxy: Proxy | undefined;
  // SIGHUP once the request is through the proxy, then again: the second one must not cut the drain.
  const backend = await slowBackend(t, 400, () => {
    proxy?.child.kill('SIGHUP');
    setTimeout(() => proxy?.child.kill('SIGHUP'), 100);
  });
  proxy = await startProxy(t, backend);
  assert.equal(await exchange(proxy.proxyPort), 'pong');
  assert.deepEqual(await proxy.exited, { code: 0, signal: null });
  assert.match(proxy.stdout(), /"signal":"SIGHUP".*Shutting down/);
});
