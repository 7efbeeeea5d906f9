// Hostile manifests against the proxy as users run it (the bin, --no-iptables, a child process): an alias
// bomb, a recursive alias, 10,000-deep nesting in YAML and in JSON, and a FIFO at the manifest path. Each is
// refused with a log line that names the file and line; the proxy keeps relaying the good service it had,
// /healthz keeps answering, and SIGTERM still ends it. Before the fixes the bomb froze the process (52 s for
// 8 levels, > 100 s for 9), the recursive alias and deep JSON were rejected with a raw TypeError/RangeError
// and no location, and the FIFO parked every later reload (and the shutdown) for ever.
import assert from 'node:assert/strict';
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { mkdtemp, rename, rm, unlink, writeFile } from 'node:fs/promises';
import http from 'node:http';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { service, slice, toYaml } from '../helpers/manifests.ts';
import { type TestServer, tcpServer, waitFor } from '../helpers/servers.ts';

const BIN = fileURLToPath(new URL('../../bin/kube-userspace-proxy.js', import.meta.url));

// The classic alias bomb ("billion laughs"), 9 levels of 9 aliases: 9^9 = 387,420,489 strings once
// expanded, from 700-odd bytes. As unknown fields of an otherwise valid Service, so that validation lets
// it through to whatever expands it.
const BOMB = `apiVersion: v1
kind: Service
metadata: {name: bomb, namespace: default}
spec: {clusterIP: 10.96.0.99, ports: [{name: http, port: 80}]}
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
`;

// A node that contains itself: JSON.stringify threw "Converting circular structure to JSON".
const RECURSIVE = `apiVersion: v1
kind: Service
metadata: {name: loop, namespace: default}
spec:
  clusterIP: 10.96.0.98
  ports: [{name: http, port: 80}]
  extra: &self
    again: *self
`;

const DEEP_YAML = `apiVersion: v1
kind: Service
metadata: {name: deep, namespace: default}
spec:
  clusterIP: 10.96.0.97
  ports: [{name: http, port: 80}]
  extra: ${'['.repeat(10_000)}${']'.repeat(10_000)}
`;

// JSON.parse builds it fine; JSON.stringify of it threw a bare RangeError.
const DEEP_JSON = `{"apiVersion": "v1", "kind": "Service",
 "metadata": {"name": "deep", "namespace": "default"},
 "spec": {"clusterIP": "10.96.0.97", "ports": [{"name": "http", "port": 80}],
  "extra": ${'['.repeat(10_000)}${']'.repeat(10_000)}}}
`;

type Proxy = {
  child: ChildProcess;
  file: string;
  health: number;
  proxyPort: number;
  lines: Record<string, unknown>[];
  /** Log lines of rejected manifests so far. */
  rejections(): Record<string, unknown>[];
  /** SIGTERM; resolves with the exit code and how long it took, or null after `timeoutMs` (then SIGKILL). */
  terminate(timeoutMs?: number): Promise<{ code: number | null; ms: number } | null>;
};

async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** The proxy on a manifest with one good Service ("web", answering "pod"), up and relaying. */
async function startProxy(t: { after(fn: () => unknown): void }, pod: TestServer): Promise<Proxy> {
  const dir = await mkdtemp(join(tmpdir(), 'kup-hostile-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const file = join(dir, 'services.yaml');
  await writeFile(file, goodManifest(pod.port));
  const health = await freePort();
  const child = spawn(
    process.execPath,
    [
      BIN,
      '--manifest',
      file,
      '--no-iptables',
      '--state-file=',
      '--hostname-override=node-1',
      '--bind-address=0.0.0.0',
      `--healthz-bind-address=127.0.0.1:${health}`,
      '--metrics-bind-address=',
    ],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  t.after(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  });
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const lines: Record<string, unknown>[] = [];
  let stderr = '';
  child.stderr!.on('data', (d) => {
    stderr = (stderr + String(d)).slice(-4096);
  });
  createInterface({ input: child.stdout! }).on('line', (line) => {
    try {
      lines.push(JSON.parse(line) as Record<string, unknown>);
    } catch {
      // not a log line
    }
  });
  let proxyPort = 0;
  await waitFor(
    () => {
      if (child.exitCode !== null) throw new Error(`the proxy exited (${child.exitCode}): ${stderr}`);
      const opened = lines.find((l) => l.msg === 'Opened service port' && typeof l.proxyPort === 'number');
      proxyPort = (opened?.proxyPort as number | undefined) ?? 0;
      return proxyPort > 0;
    },
    20_000,
    'the proxy to open the good service',
  );
  return {
    child,
    file,
    health,
    proxyPort,
    lines,
    rejections: () => lines.filter((l) => l.msg === 'Manifest rejected, keeping the last good state'),
    terminate: async (timeoutMs = 10_000) => {
      const started = Date.now();
      child.kill('SIGTERM');
      let timer: NodeJS.Timeout | undefined;
      const code = await Promise.race([
        exited,
        new Promise<'timeout'>((resolve) => {
          timer = setTimeout(() => resolve('timeout'), timeoutMs);
        }),
      ]);
      clearTimeout(timer);
      if (code !== 'timeout') return { code, ms: Date.now() - started };
      child.kill('SIGKILL');
      return null;
    },
  };
}

function goodManifest(podPort: number): string {
  return toYaml([
    service('web', '10.96.0.1', [{ name: 'http', port: 80, targetPort: podPort }]),
    slice('web', 'web-1', [{ ip: '127.0.0.1' }], [{ name: 'http', port: podPort }]),
  ]);
}

/** Replaces the manifest as editors do (a new file renamed over it). */
async function replace(file: string, text: string): Promise<void> {
  const tmp = `${file}.tmp`;
  await writeFile(tmp, text);
  await rename(tmp, file);
}

/** The reply to one connection to the service, or the error. */
function relay(port: number): Promise<string> {
  return new Promise((resolve) => {
    const socket = net.connect({ host: '127.0.0.1', port });
    const chunks: Buffer[] = [];
    const timer = setTimeout(() => socket.destroy(new Error('timed out')), 3000);
    socket.on('data', (c) => chunks.push(c));
    socket.on('error', (err) => {
      clearTimeout(timer);
      resolve(`error: ${err.message}`);
    });
    socket.on('close', () => {
      clearTimeout(timer);
      resolve(Buffer.concat(chunks).toString());
    });
    socket.end();
  });
}

/** The status of GET /healthz, or 0 when nothing answered within 3 s. */
function healthz(port: number): Promise<number> {
  return new Promise((resolve) => {
    const req = http.get({ host: '127.0.0.1', port, path: '/healthz', timeout: 3000 }, (res) => {
      res.resume();
      resolve(res.statusCode ?? 0);
    });
    req.on('timeout', () => req.destroy());
    req.on('error', () => resolve(0));
  });
}

/** The message of a rejection log line (pino's serialized err). */
function messageOf(line: Record<string, unknown> | undefined): string {
  const err = line?.err as { message?: string; code?: string } | undefined;
  return `${err?.code ?? ''} ${err?.message ?? ''}`;
}

test('an alias bomb, a recursive alias and 10,000-deep nesting are refused with file:line; the proxy keeps serving', {
  timeout: 120_000,
}, async (t) => {
  const pod = await tcpServer('127.0.0.1', (s) => s.end('pod'));
  t.after(() => pod.close());
  const proxy = await startProxy(t, pod);
  assert.equal(await relay(proxy.proxyPort), 'pod');
  const cases = [
    {
      name: 'alias bomb (9 levels of 9)',
      text: `${goodManifest(pod.port)}---\n${BOMB}`,
      // The bomb's aliases are on lines 5-13 of its document, which starts after the good part.
      want: /services\.yaml:(\d+):\d+: aliases expand the document by more than 1000000/,
      lines: [0, 13],
    },
    {
      name: 'recursive alias',
      text: RECURSIVE,
      want: /services\.yaml:8:12: alias \*self is inside the node it names \(a recursive alias\)/,
    },
    {
      name: 'YAML nested 10,000 deep',
      text: DEEP_YAML,
      want: /services\.yaml:7:\d+: nested deeper than 100 levels/,
    },
    {
      name: 'JSON nested 10,000 deep',
      text: DEEP_JSON,
      want: /services\.yaml:4:\d+: nested deeper than 100 levels/,
    },
  ];
  for (const c of cases) {
    const before = proxy.rejections().length;
    const started = Date.now();
    await replace(proxy.file, c.text);
    await waitFor(() => proxy.rejections().length > before, 10_000, `${c.name} to be rejected`);
    const message = messageOf(proxy.rejections().at(-1));
    t.diagnostic(`${c.name}: rejected in ${Date.now() - started} ms: ${message.slice(0, 200)}`);
    assert.match(message, /KUP_ERR_MANIFEST_INVALID/, c.name);
    const m = c.want.exec(message);
    assert.ok(m, `${c.name}: ${message.slice(0, 500)}`);
    if (c.lines !== undefined) {
      const good = goodManifest(pod.port).split('\n').length;
      const line = Number(m[1]);
      assert.ok(line > good + c.lines[0]! && line <= good + c.lines[1]!, `${c.name}: line ${line}`);
    }
    assert.doesNotMatch(message, /Maximum call stack|circular structure|TypeError|RangeError/, c.name);
    assert.equal(await healthz(proxy.health), 200, `/healthz after ${c.name}`);
    assert.equal(await relay(proxy.proxyPort), 'pod', `relaying after ${c.name}`);
  }
  // A good file is still picked up afterwards.
  await replace(
    proxy.file,
    `${goodManifest(pod.port)}---\n${toYaml([service('api', '10.96.0.2', [{ name: 'http', port: 80, targetPort: pod.port }])])}`,
  );
  await waitFor(
    () => proxy.lines.some((l) => l.msg === 'Opened service port' && l.service === 'default/api:http/TCP'),
    10_000,
    'the fixed manifest',
  );
  const exit = await proxy.terminate();
  assert.ok(exit !== null, 'SIGTERM did not end the proxy within 10 s');
  assert.equal(exit.code, 0);
});

test('a FIFO at the manifest path is refused at once; relaying, /healthz and SIGTERM carry on', {
  timeout: 60_000,
}, async (t) => {
  const pod = await tcpServer('127.0.0.1', (s) => s.end('pod'));
  t.after(() => pod.close());
  const proxy = await startProxy(t, pod);
  const before = proxy.rejections().length;
  await unlink(proxy.file);
  // No writer ever opens it: a blocking open(2) for reading waits for ever.
  execFileSync('mkfifo', [proxy.file]);
  // The watcher may read between the unlink and the mkfifo: that read's ENOENT is refused first.
  const fifoRejection = () =>
    proxy
      .rejections()
      .slice(before)
      .map(messageOf)
      .find((m) => /FIFO/.test(m));
  await waitFor(() => fifoRejection() !== undefined, 10_000, 'the FIFO to be refused');
  const message = fifoRejection()!;
  assert.match(message, /KUP_ERR_MANIFEST_READ/);
  assert.match(message, /services\.yaml: not a regular file \(a FIFO\)/);
  assert.equal(await healthz(proxy.health), 200);
  assert.equal(await relay(proxy.proxyPort), 'pod');
  // A later change is still read (nothing is parked in a read of the FIFO).
  await unlink(proxy.file);
  await writeFile(proxy.file, goodManifest(pod.port).replace('web-1', 'web-2'));
  await waitFor(
    () => proxy.lines.some((l) => l.msg === 'Manifest reloaded'),
    10_000,
    'the regular file to be read again',
  );
  await unlink(proxy.file);
  execFileSync('mkfifo', [proxy.file]);
  await waitFor(() => proxy.rejections().length > before + 1, 10_000, 'the second FIFO to be refused');
  const exit = await proxy.terminate();
  assert.ok(exit !== null, 'SIGTERM did not end the proxy within 10 s');
  assert.equal(exit.code, 0);
});

test('an alias bomb or a FIFO at start: the proxy exits 1 at once, naming the file', {
  timeout: 60_000,
}, async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'kup-hostile-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const bomb = join(dir, 'bomb.yaml');
  await writeFile(bomb, BOMB);
  const fifo = join(dir, 'fifo.yaml');
  execFileSync('mkfifo', [fifo]);
  for (const [file, want] of [
    [bomb, /bomb\.yaml:\d+:\d+: aliases expand the document/],
    [fifo, /fifo\.yaml: not a regular file \(a FIFO\)/],
  ] as const) {
    const started = Date.now();
    const r = await new Promise<{ code: number | null; out: string }>((resolve) => {
      const child = spawn(
        process.execPath,
        [
          BIN,
          '--manifest',
          file,
          '--no-iptables',
          '--state-file=',
          '--healthz-bind-address=',
          '--metrics-bind-address=',
        ],
        { stdio: ['ignore', 'pipe', 'pipe'] },
      );
      let out = '';
      child.stdout.on('data', (d) => (out += d));
      child.stderr.on('data', (d) => (out += d));
      const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
      child.on('close', (code) => {
        clearTimeout(timer);
        resolve({ code, out });
      });
    });
    assert.equal(r.code, 1, r.out);
    assert.match(r.out, want);
    t.diagnostic(`${file}: exit 1 after ${Date.now() - started} ms`);
  }
});
