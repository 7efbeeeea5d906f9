// The CLI as a user runs it: exit codes, one clear message for bad input, JSON logs, SIGTERM.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { service, slice, toYaml } from '../helpers/manifests.ts';

const BIN = fileURLToPath(new URL('../../bin/kube-userspace-proxy.js', import.meta.url));

function run(args: string[], options: { until?: RegExp; signal?: NodeJS.Signals; timeoutMs?: number } = {}) {
  return new Promise<{ code: number | null; stdout: string; stderr: string; ms: number }>((resolve) => {
    const child = spawn(process.execPath, [BIN, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    let signalledAt = 0;
    const started = Date.now();
    const timer = setTimeout(() => child.kill('SIGKILL'), options.timeoutMs ?? 10_000);
    child.stdout.on('data', (c) => {
      stdout += c;
      if (options.until && signalledAt === 0 && options.until.test(stdout)) {
        signalledAt = Date.now();
        child.kill(options.signal ?? 'SIGTERM');
      }
    });
    child.stderr.on('data', (c) => {
      stderr += c;
    });
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr, ms: Date.now() - (signalledAt || started) });
    });
  });
}

test('--version and --help exit 0', async () => {
  const v = await run(['--version']);
  assert.equal(v.code, 0);
  assert.match(v.stdout, /^kube-userspace-proxy \d+\.\d+\.\d+/);
  const h = await run(['--help']);
  assert.equal(h.code, 0);
  assert.match(h.stdout, /--manifest/);
});

test('a bad flag exits 2 with one clear message before anything starts', async () => {
  const r = await run(['--proxy-port-range=9000-8000']);
  assert.equal(r.code, 2);
  assert.match(r.stderr, /invalid --proxy-port-range "9000-8000"/);
  assert.equal(r.stdout, '');
});

test('a missing manifest exits 1 with the reason', async () => {
  const r = await run([
    '--manifest=/nonexistent/x.yaml',
    '--no-iptables',
    '--healthz-bind-address=',
    '--metrics-bind-address=',
  ]);
  assert.equal(r.code, 1);
  assert.match(r.stdout, /KUP_ERR_MANIFEST_READ/);
});

test('runs on a manifest, logs JSON lines, and exits 0 on SIGTERM', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'kup-cli-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const file = join(dir, 'm.yaml');
  await writeFile(
    file,
    toYaml([
      service('web', '10.96.0.1', [{ name: 'http', port: 80, targetPort: 8080 }]),
      slice('web', 'w', [{ ip: '127.0.0.11' }], [{ name: 'http', port: 8080 }]),
    ]),
  );
  const r = await run(
    [
      '--manifest',
      file,
      '--no-iptables',
      '--bind-address=0.0.0.0',
      '--healthz-bind-address=127.0.0.1:0',
      '--metrics-bind-address=127.0.0.1:0',
    ],
    { until: /Opened service port/ },
  );
  assert.equal(r.code, 0, r.stderr);
  const lines = r.stdout.trim().split('\n');
  for (const line of lines) JSON.parse(line);
  assert.ok(lines.some((l) => l.includes('Shutting down')));
  assert.ok(r.ms < 3000, `exit took ${r.ms} ms`);
});

test('fatal start-up errors exit non-zero with the reason', async (t) => {
  // The metrics port is taken and --bind-address-hard-fail is set.
  const net = await import('node:net');
  const squatter = net.createServer();
  await new Promise<void>((r) => squatter.listen({ host: '127.0.0.1', port: 0 }, () => r()));
  t.after(() => new Promise((r) => squatter.close(r)));
  const port = (squatter.address() as { port: number }).port;
  const dir = await mkdtemp(join(tmpdir(), 'kup-cli-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const file = join(dir, 'm.yaml');
  await writeFile(
    file,
    toYaml([service('web', '10.96.0.1', [{ name: 'http', port: 80, targetPort: 8080 }])]),
  );
  const hard = await run([
    '--manifest',
    file,
    '--no-iptables',
    '--bind-address-hard-fail',
    `--metrics-bind-address=127.0.0.1:${port}`,
    '--healthz-bind-address=',
  ]);
  assert.equal(hard.code, 1);
  assert.match(hard.stdout, /cannot start the metrics server/);
  const missingConfig = await run(['--config', join(dir, 'nope.yaml')]);
  assert.notEqual(missingConfig.code, 0);
  assert.match(missingConfig.stderr + missingConfig.stdout, /nope\.yaml/);
});

test('--log-format text prints readable lines', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'kup-cli-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const file = join(dir, 'm.yaml');
  await writeFile(
    file,
    toYaml([service('web', '10.96.0.1', [{ name: 'http', port: 80, targetPort: 8080 }])]),
  );
  const r = await run(
    [
      '--manifest',
      file,
      '--no-iptables',
      '--log-format=text',
      '--bind-address=0.0.0.0',
      '--healthz-bind-address=',
      '--metrics-bind-address=',
    ],
    { until: /Opened service port/ },
  );
  assert.equal(r.code, 0);
  assert.match(
    r.stdout,
    /^\d{4}-\d\d-\d\dT\S+ INFO {2}Opened service port .*service=default\/web:http\/TCP/m,
  );
});

test('a manifest of random bytes gives bounded log lines with the reason, not the bytes', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'kup-cli-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const file = join(dir, 'garbage.yaml');
  // 350 KB of seeded noise without NUL bytes: the YAML parser once quoted it whole (an 840 KB line).
  const bytes = Buffer.alloc(350_000);
  let x = 0x9e3779b9;
  for (let i = 0; i < bytes.length; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    bytes[i] = 1 + ((x >>> 0) % 255);
  }
  await writeFile(file, bytes);
  const r = await run([
    '--manifest',
    file,
    '--no-iptables',
    '--state-file=',
    '--healthz-bind-address=',
    '--metrics-bind-address=',
  ]);
  assert.equal(r.code, 1);
  const lines = r.stdout.trim().split('\n');
  for (const line of lines) {
    assert.ok(line.length <= 64 * 1024, `a ${line.length}-char log line`);
    assert.doesNotMatch(line, /[\u0000-\u001f\u007f-\u009f]/, 'no raw control characters');
    JSON.parse(line);
  }
  assert.match(r.stdout, /KUP_ERR_MANIFEST_INVALID/);
});
