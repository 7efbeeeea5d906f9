// --workers 2: the proxy as users run it (the bin, a manifest, --no-iptables) with a worker process
// beside the main one, both listening on every proxy port. Counters are summed and connections listed
// from both; an endpoint change reaches the worker; ClientIP affinity holds whichever process accepts;
// a killed worker is replaced while the main process's connections go on; SIGTERM drains both.
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { mkdtemp, rename, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { IDS_PER_PROCESS } from '../../src/relay/connection-id.ts';
import type { DebugServicePort } from '../../src/server/debug.ts';
import type { ConnectionListing } from '../../src/trace/connection-table.ts';
import { service, slice, toYaml } from '../helpers/manifests.ts';
import { freePort, spawnNode } from '../helpers/proxy-process.ts';
import { waitFor } from '../helpers/servers.ts';

const BIN = fileURLToPath(new URL('../../bin/kube-userspace-proxy.js', import.meta.url));
type After = { after(fn: () => unknown): void };

/** A backend on `ip`: says its name on connect, then echoes. */
async function backend(t: After, ip: string, name: string, port = 0): Promise<number> {
  const server = net.createServer((c) => {
    c.on('error', () => {});
    c.write(`${name}\n`);
    c.pipe(c);
  });
  await new Promise<void>((resolve) => server.listen(port, ip, resolve));
  t.after(() => server.close());
  return (server.address() as net.AddressInfo).port;
}

type Proxy = {
  child: ChildProcess;
  lines: Record<string, unknown>[];
  metricsPort: number;
  write(objects: unknown[]): Promise<void>;
  get<T>(path: string): Promise<T>;
  text(path: string): Promise<string>;
  workerPids(): number[];
};

async function startProxy(t: After, objects: unknown[], extraArgs: string[] = []): Promise<Proxy> {
  const dir = await mkdtemp(join(tmpdir(), 'kup-workers-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const file = join(dir, 'm.yaml');
  let n = 0;
  const write = async (objs: unknown[]) => {
    const tmp = join(dir, `.m.${n++}`);
    await writeFile(tmp, toYaml(objs));
    await rename(tmp, file);
  };
  await write(objects);
  const metricsPort = await freePort();
  const { child, lines } = spawnNode([
    BIN,
    '--manifest',
    file,
    '--no-iptables',
    '--workers=2',
    '--state-file=',
    '--hostname-override=node-1',
    '--bind-address=0.0.0.0',
    '--healthz-bind-address=',
    `--metrics-bind-address=127.0.0.1:${metricsPort}`,
    '--shutdown-grace-period=20s',
    ...extraArgs,
  ]);
  t.after(() => {
    child.kill('SIGKILL');
    for (const l of lines)
      if (l.msg === 'Worker started')
        try {
          process.kill(l.pid as number, 'SIGKILL');
        } catch {
          // Gone already.
        }
  });
  const base = `http://127.0.0.1:${metricsPort}`;
  const proxy: Proxy = {
    child,
    lines,
    metricsPort,
    write,
    get: async <T>(path: string) => (await (await fetch(base + path)).json()) as T,
    text: async (path: string) => (await fetch(base + path)).text(),
    workerPids: () => lines.filter((l) => l.msg === 'Worker started').map((l) => l.pid as number),
  };
  return proxy;
}

/** Waits until the main process and the worker both opened `service` (one "Opened service port" each). */
async function bothOpened(proxy: Proxy, service: string, times = 2): Promise<number> {
  await waitFor(
    () => {
      if (proxy.child.exitCode !== null) throw new Error('the proxy exited');
      return (
        proxy.lines.filter((l) => l.msg === 'Opened service port' && l.service === service).length >= times
      );
    },
    20_000,
    `${service} open in both processes`,
  );
  return proxy.lines.find((l) => l.msg === 'Opened service port' && l.service === service)!
    .proxyPort as number;
}

/** One connection: the endpoint's name (its first line), then closed. */
function ask(port: number, localAddress = '127.0.0.1'): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ host: '127.0.0.1', port, localAddress });
    let data = '';
    const timer = setTimeout(() => s.destroy(new Error('no answer')), 5000);
    s.on('data', (d) => {
      data += d;
      const nl = data.indexOf('\n');
      if (nl >= 0) {
        clearTimeout(timer);
        s.destroy();
        resolve(data.slice(0, nl));
      }
    });
    s.on('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
  });
}

/** A connection held open: its name, and a round trip on it. */
async function hold(
  t: After,
  port: number,
): Promise<{ socket: net.Socket; localPort: number; echo(text: string): Promise<string> }> {
  const socket = net.connect({ host: '127.0.0.1', port });
  t.after(() => socket.destroy());
  socket.on('error', () => {});
  let buffered = '';
  let waiter: (() => void) | undefined;
  socket.on('data', (d) => {
    buffered += d;
    waiter?.();
  });
  const line = () =>
    new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('no echo')), 3000);
      const check = () => {
        const nl = buffered.indexOf('\n');
        if (nl < 0) return;
        clearTimeout(timer);
        waiter = undefined;
        const out = buffered.slice(0, nl);
        buffered = buffered.slice(nl + 1);
        resolve(out);
      };
      waiter = check;
      socket.once('close', () => reject(new Error('closed')));
      check();
    });
  await line();
  return {
    socket,
    localPort: socket.localPort!,
    echo: async (text: string) => {
      socket.write(`${text}\n`);
      return line();
    },
  };
}

const isWorkerId = (id: number) => id >= IDS_PER_PROCESS;

test('--workers 2: both processes serve one port; counters summed, connections listed from both; an endpoint change reaches the worker', async (t) => {
  const a = await backend(t, '127.0.0.51', 'a');
  await backend(t, '127.0.0.52', 'b', a);
  const objects = (ip: string) => [
    service('web', '10.96.0.1', [{ name: 'http', port: 80, targetPort: a }]),
    slice('web', 'web-1', [{ ip }], [{ name: 'http', port: a }]),
  ];
  const proxy = await startProxy(t, objects('127.0.0.51'));
  const port = await bothOpened(proxy, 'default/web:http/TCP');
  for (let i = 0; i < 40; i++) assert.equal(await ask(port), 'a');
  const web = (await proxy.get<DebugServicePort[]>('/debug/services')).find(
    (s) => s.service === 'default/web:http',
  )!;
  assert.equal(web.connections.accepted, 40, 'accepted by either process, counted once');
  assert.match(
    await proxy.text('/metrics'),
    /kup_service_connections_total\{service="default\/web:http",protocol="TCP"\} 40\n/,
  );
  const listing = await proxy.get<ConnectionListing>('/debug/connections?state=closed&limit=100');
  assert.equal(listing.recent.length, 40);
  const byWorker = listing.recent.filter((r) => isWorkerId(r.id)).length;
  assert.ok(byWorker > 0 && byWorker < 40, `both processes took connections (worker: ${byWorker} of 40)`);
  assert.equal(new Set(listing.recent.map((r) => r.id)).size, 40, 'ids unique across processes');
  // The console's table and the trace backlog hold both processes' connections too.
  const ui = await proxy.get<{ rows: { id: number }[] }>('/ui/api/connections?state=closed&limit=100');
  assert.equal(ui.rows.length, 40);
  assert.ok(ui.rows.some((r) => isWorkerId(r.id)) && ui.rows.some((r) => !isWorkerId(r.id)));
  const backlog = (await proxy.text('/debug/trace?follow=false'))
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as { type: string; id: number; atMs: number });
  const opened = backlog.filter((e) => e.type === 'opened');
  assert.equal(opened.length, 40, 'every opening, from both processes');
  assert.ok(opened.some((e) => isWorkerId(e.id)) && opened.some((e) => !isWorkerId(e.id)));
  assert.deepEqual(
    backlog.map((e) => e.atMs),
    backlog.map((e) => e.atMs).sort((x, y) => x - y),
    'oldest first across processes',
  );
  // A follower sees both processes' new connections as they happen.
  const ac = new AbortController();
  t.after(() => ac.abort());
  const res = await fetch(`http://127.0.0.1:${proxy.metricsPort}/debug/trace`, { signal: ac.signal });
  const reader = res.body!.getReader();
  let followed = '';
  const seen = { worker: false, main: false };
  const readUntilBoth = (async () => {
    const decoder = new TextDecoder();
    while (!(seen.worker && seen.main)) {
      const { value, done } = await reader.read();
      if (done) break;
      followed += decoder.decode(value, { stream: true });
      for (const line of followed.split('\n').slice(0, -1)) {
        const e = JSON.parse(line) as { type: string; id: number; atMs: number };
        if (e.type !== 'opened' || e.atMs < backlog.at(-1)!.atMs) continue;
        if (isWorkerId(e.id)) seen.worker = true;
        else seen.main = true;
      }
    }
  })();
  await waitFor(
    async () => {
      await ask(port);
      return seen.worker && seen.main;
    },
    10_000,
    'the follower to see both processes',
  );
  ac.abort();
  await readUntilBoth.catch(() => {});

  // The endpoint moves: within moments no process sends anyone to the old one.
  await proxy.write(objects('127.0.0.52'));
  await waitFor(
    async () => {
      for (let i = 0; i < 20; i++) if ((await ask(port)) !== 'b') return false;
      return true;
    },
    10_000,
    'every process to use the new endpoint',
  );
  for (let i = 0; i < 40; i++) assert.equal(await ask(port), 'b', `connection ${i}`);
});

test('--workers 2: ClientIP affinity holds whichever process accepts the connection', async (t) => {
  const port = await backend(t, '127.0.0.61', 'e1');
  await backend(t, '127.0.0.62', 'e2', port);
  await backend(t, '127.0.0.63', 'e3', port);
  const proxy = await startProxy(t, [
    service('sticky', '10.96.0.2', [{ name: 'http', port: 80, targetPort: port }], {
      sessionAffinity: 'ClientIP',
    }),
    slice(
      'sticky',
      'sticky-1',
      [{ ip: '127.0.0.61' }, { ip: '127.0.0.62' }, { ip: '127.0.0.63' }],
      [{ name: 'http', port }],
    ),
  ]);
  const proxyPort = await bothOpened(proxy, 'default/sticky:http/TCP');
  const endpoints = new Set<string>();
  for (let c = 1; c <= 12; c++) {
    const client = `127.0.1.${c}`;
    const seen = new Set<string>();
    for (let i = 0; i < 10; i++) seen.add(await ask(proxyPort, client));
    assert.equal(seen.size, 1, `${client} went to ${[...seen]}`);
    endpoints.add([...seen][0]!);
  }
  assert.ok(endpoints.size >= 2, `clients are spread over the endpoints: ${[...endpoints]}`);
  const listing = await proxy.get<ConnectionListing>('/debug/connections?state=closed&limit=200');
  const byWorker = listing.recent.filter((r) => isWorkerId(r.id)).length;
  assert.ok(byWorker > 0 && byWorker < 120, `both processes took connections (worker: ${byWorker} of 120)`);
});

test('--workers 2: a killed worker is replaced, the main process keeps its connections; SIGTERM drains both', async (t) => {
  const port = await backend(t, '127.0.0.71', 'x');
  const proxy = await startProxy(t, [
    service('echo', '10.96.0.3', [{ name: 'tcp', port: 80, targetPort: port }]),
    slice('echo', 'echo-1', [{ ip: '127.0.0.71' }], [{ name: 'tcp', port }]),
  ]);
  const proxyPort = await bothOpened(proxy, 'default/echo:tcp/TCP');
  const held = [];
  for (let i = 0; i < 16; i++) held.push(await hold(t, proxyPort));
  const active = await proxy.get<ConnectionListing>('/debug/connections?state=active&limit=100');
  const onWorker = new Set(
    active.active
      .filter((r) => isWorkerId(r.id))
      .map((r) => Number(r.client.slice(r.client.lastIndexOf(':') + 1))),
  );
  assert.ok(onWorker.size > 0 && onWorker.size < 16, `the worker holds some (${onWorker.size} of 16)`);

  const [workerPid] = proxy.workerPids();
  process.kill(workerPid!, 'SIGKILL');
  await waitFor(
    () => proxy.lines.some((l) => l.msg === 'Worker exited; restarting it'),
    5000,
    'the exit noticed',
  );
  for (const h of held) {
    if (onWorker.has(h.localPort)) continue;
    assert.equal(await h.echo('still here'), 'still here', 'a connection of the main process goes on');
  }
  await waitFor(() => proxy.workerPids().length === 2, 10_000, 'a new worker');
  await bothOpened(proxy, 'default/echo:tcp/TCP', 3);
  // The new worker takes connections again.
  await waitFor(
    async () => {
      for (let i = 0; i < 10; i++) assert.equal(await ask(proxyPort), 'x');
      const l = await proxy.get<ConnectionListing>('/debug/connections?state=closed&limit=200');
      return l.recent.some((r) => isWorkerId(r.id));
    },
    10_000,
    'the new worker to take connections',
  );

  // SIGTERM: both processes stop accepting, their connections go on until the clients leave.
  const survivors = held.filter((h) => !onWorker.has(h.localPort));
  const onNewWorker: Awaited<ReturnType<typeof hold>>[] = [];
  for (let i = 0; i < 12; i++) onNewWorker.push(await hold(t, proxyPort));
  const exited = new Promise<number | null>((resolve) => proxy.child.once('exit', (code) => resolve(code)));
  proxy.child.kill('SIGTERM');
  await waitFor(() => proxy.lines.some((l) => l.msg === 'Shutting down'), 5000, 'the drain to start');
  await new Promise((r) => setTimeout(r, 300));
  for (const h of [...survivors, ...onNewWorker])
    assert.equal(await h.echo('draining'), 'draining', 'established connections go on while draining');
  for (const h of [...survivors, ...onNewWorker]) h.socket.end();
  assert.equal(await exited, 0);
  for (const pid of proxy.workerPids()) {
    let alive = true;
    try {
      process.kill(pid, 0);
    } catch {
      alive = false;
    }
    if (alive)
      await waitFor(
        () => {
          try {
            process.kill(pid, 0);
            return false;
          } catch {
            return true;
          }
        },
        3000,
        `worker ${pid} to exit`,
      );
  }
});

test('--workers 2: an endpoint one process ejects is skipped by every process', async (t) => {
  const port = await backend(t, '127.0.0.81', 'ok');
  // 127.0.0.82:port refuses: nothing listens there.
  const proxy = await startProxy(
    t,
    [
      service('flaky', '10.96.0.4', [{ name: 'http', port: 80, targetPort: port }]),
      slice('flaky', 'flaky-1', [{ ip: '127.0.0.81' }, { ip: '127.0.0.82' }], [{ name: 'http', port }]),
    ],
    ['--outlier-base-ejection-time=60s'],
  );
  const proxyPort = await bothOpened(proxy, 'default/flaky:http/TCP');
  const ejected = () => proxy.lines.filter((l) => l.msg === 'Endpoint ejected after consecutive failures');
  const failures = async () => {
    const s = (await proxy.get<DebugServicePort[]>('/debug/services')).find(
      (x) => x.service === 'default/flaky:http',
    )!;
    return s.connections.connectFailures.refused ?? 0;
  };
  // Until the first process ejects it (each connection still succeeds: a refused connect is retried).
  for (let i = 0; i < 60 && ejected().length === 0; i++) assert.equal(await ask(proxyPort), 'ok');
  assert.equal(ejected().length, 1, 'one process ejected it');
  await new Promise((r) => setTimeout(r, 300));
  const before = await failures();
  for (let i = 0; i < 40; i++) assert.equal(await ask(proxyPort), 'ok');
  assert.equal(await failures(), before, 'no process tried the ejected endpoint again');
  assert.equal(ejected().length, 1, 'the other process did not have to find it failing itself');
  const listing = await proxy.get<ConnectionListing>('/debug/connections?state=closed&limit=100');
  const last40 = listing.recent.slice(0, 40);
  assert.ok(
    last40.some((r) => isWorkerId(r.id)) && last40.some((r) => !isWorkerId(r.id)),
    'both processes served',
  );
});

test('--workers 2: the worker starts once the main process has synced and serves every port, not during the cold start', async (t) => {
  const port = await backend(t, '127.0.0.53', 'a');
  const proxy = await startProxy(t, [
    service('early', '10.96.0.40', [{ name: 'p', port: 80, targetPort: port }]),
    slice('early', 'early-1', [{ ip: '127.0.0.53' }], [{ name: 'p', port }]),
  ]);
  await bothOpened(proxy, 'default/early:p/TCP');
  const opened = proxy.lines.findIndex((l) => l.msg === 'Opened service port' && l.worker === undefined);
  const started = proxy.lines.findIndex((l) => l.msg === 'Worker started');
  assert.ok(opened >= 0 && started >= 0);
  // Its start (Node's own, its copy of the table, a listener a port) no longer competes with the cold start.
  assert.ok(opened < started, 'the main process opened its listeners before the worker was started');
});
