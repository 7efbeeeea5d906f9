// /debug/trace followers must not cost the data path. Two proxies run as users run them (the bin, a
// manifest, --trace=protocols, no iptables) on one CPU, under the same load at the same time; 100 followers
// of /debug/trace (a quarter reading, the rest never reading), real HTTP clients in a process of their own,
// go to one proxy and then the other; this process (on the other CPUs) is the backend and the clients, and
// compares the two proxies' new-connection rates window by window. Then the cap's 503, and a follower that
// never reads.
import assert from 'node:assert/strict';
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { type TestContext, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import type { ConnectionInfo } from '../../src/relay/observer.ts';
import { DEFAULT_TCP_OPTIONS, TcpListener } from '../../src/relay/tcp.ts';
import { startHttpServer } from '../../src/server/http.ts';
import { traceRoutes } from '../../src/server/trace-routes.ts';
import type { ServicePortName } from '../../src/state/service-port.ts';
import { ConnectionTable } from '../../src/trace/connection-table.ts';
import { createTracer } from '../../src/trace/tracer.ts';
import { ep } from '../helpers/endpoints.ts';
import { service, slice, toYaml } from '../helpers/manifests.ts';
import { log, makeContext } from '../helpers/relay.ts';
import { echoServer, request, tcpServer, waitFor } from '../helpers/servers.ts';

const BIN = fileURLToPath(new URL('../../bin/kube-userspace-proxy.js', import.meta.url));

const FOLLOWERS = 100;
const CONCURRENCY = 16;
/** Phases, alternating the proxy the followers go to; windows measured in each; attempts at most. */
const PHASES = 2;
const WINDOWS = 6;
const ATTEMPTS = 3;
/**
 * After the followers connect, before a phase's windows: their connecting (backlogs, 503s, the kernel
 * buffers of those that never read filling up) costs the proxy more than the steady state for about a
 * second.
 */
const SETTLE_MS = 1500;
const WINDOW_MS = 500;

const REQUEST = 'GET /cart HTTP/1.1\r\nHost: shop.example\r\nConnection: close\r\n\r\n';
const RESPONSE = 'HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok';

// The followers: `open N` opens N followers of /debug/trace (every fourth reads what it is sent, the others
// read the status line and then never again) and prints the statuses once each has one; `close` destroys
// them and prints when all are closed.
const FOLLOWER_SCRIPT = String.raw`
const net = require('node:net');
const out = (o) => process.stdout.write(JSON.stringify(o) + '\n');
let sockets = [];
function open(n, port) {
  const statuses = {};
  let pending = n;
  if (n === 0) return out({ opened: statuses });
  const done = (status) => {
    statuses[status] = (statuses[status] ?? 0) + 1;
    if (--pending === 0) out({ opened: statuses });
  };
  for (let i = 0; i < n; i++) {
    const reads = i % 4 === 0;
    const s = net.connect({ host: '127.0.0.1', port });
    sockets.push(s);
    let head = '';
    let status;
    s.on('error', () => {});
    s.on('close', () => { if (status === undefined) { status = 'closed'; done(status); } });
    s.on('data', (d) => {
      if (status !== undefined) return;
      head += d.toString('latin1');
      const m = /^HTTP\/1\.1 (\d{3})/.exec(head);
      if (m === null) return;
      status = m[1];
      done(status);
      if (!reads) s.pause();
    });
    s.write('GET /debug/trace?follow=true HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n');
  }
}
function close() {
  const all = sockets;
  sockets = [];
  let pending = all.length;
  if (pending === 0) return out({ closed: 0 });
  for (const s of all) {
    s.once('close', () => { if (--pending === 0) out({ closed: all.length }); });
    s.destroy();
  }
}
require('node:readline').createInterface({ input: process.stdin }).on('line', (l) => {
  const [cmd, arg, port] = l.split(' ');
  if (cmd === 'open') open(Number(arg), Number(port));
  else if (cmd === 'close') close();
});
`;

/** A child process that prints JSON lines: wait for the next line with a key. */
class Child {
  readonly proc: ChildProcess;
  readonly lines: Record<string, unknown>[] = [];
  #waiters: (() => void)[] = [];
  stderr = '';

  /** `cpus`: a taskset CPU list to run on. */
  constructor(args: string[], cpus?: string) {
    const [file, argv] =
      cpus === undefined ? [process.execPath, args] : ['taskset', ['-c', cpus, process.execPath, ...args]];
    this.proc = spawn(file, argv, { stdio: ['pipe', 'pipe', 'pipe'] });
    this.proc.stderr!.on('data', (d) => {
      this.stderr = (this.stderr + String(d)).slice(-4000);
    });
    createInterface({ input: this.proc.stdout! }).on('line', (line) => {
      try {
        this.lines.push(JSON.parse(line) as Record<string, unknown>);
      } catch {
        return;
      }
      for (const w of this.#waiters) w();
    });
    this.proc.once('exit', () => {
      for (const w of this.#waiters) w();
    });
  }

  /** The first line at or after `from` with `key`, within `timeoutMs`. */
  next(key: string, from: number, timeoutMs = 20_000): Promise<Record<string, unknown>> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#waiters = this.#waiters.filter((w) => w !== check);
        reject(new Error(`no "${key}" line within ${timeoutMs} ms; stderr: ${this.stderr}`));
      }, timeoutMs);
      const check = () => {
        const line = this.lines.slice(from).find((l) => l[key] !== undefined);
        if (line === undefined && this.proc.exitCode === null && this.proc.signalCode === null) return;
        clearTimeout(timer);
        this.#waiters = this.#waiters.filter((w) => w !== check);
        if (line === undefined) reject(new Error(`exited before a "${key}" line; stderr: ${this.stderr}`));
        else resolve(line);
      };
      this.#waiters.push(check);
      check();
    });
  }

  send(line: string): void {
    this.proc.stdin!.write(`${line}\n`);
  }

  stop(): Promise<void> {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) return Promise.resolve();
    const exited = new Promise<void>((resolve) => this.proc.once('exit', () => resolve()));
    this.proc.kill('SIGKILL');
    return exited;
  }
}

/** New connections through the proxy, `concurrency` at a time, each one HTTP exchange then closed. */
class Load {
  readonly port: number;
  completed = 0;
  failed = 0;
  /** Why connections failed (error code, or `short` for a response cut short), for the report. */
  readonly why = new Map<string, number>();
  #running = true;
  #inFlight = new Set<net.Socket>();

  constructor(port: number, concurrency: number) {
    this.port = port;
    for (let i = 0; i < concurrency; i++) this.#one();
  }

  #one(): void {
    if (!this.#running) return;
    // From 127.0.0.2: the proxies' own upstream sockets are on 127.0.0.1, and a client port that is also
    // one of theirs looks to the loop guard like a connection come back (reset, as a loop).
    const s = net.connect({ host: '127.0.0.1', port: this.port, localAddress: '127.0.0.2' });
    this.#inFlight.add(s);
    let got = 0;
    let failed: string | undefined;
    s.setTimeout(5000, () => s.destroy(Object.assign(new Error('timeout'), { code: 'TIMEOUT' })));
    s.on('connect', () => s.write(REQUEST));
    s.on('data', (d) => {
      got += d.length;
    });
    s.on('error', (err: NodeJS.ErrnoException) => {
      failed = err.code ?? err.message;
    });
    s.on('close', () => {
      this.#inFlight.delete(s);
      if (failed === undefined && got === RESPONSE.length) this.completed++;
      else if (this.#running) {
        this.failed++;
        const why = failed ?? 'short';
        this.why.set(why, (this.why.get(why) ?? 0) + 1);
      }
      this.#one();
    });
  }

  stop(): void {
    this.#running = false;
    for (const s of this.#inFlight) s.destroy();
  }
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen({ host: '127.0.0.1', port: 0 }, () => {
      const { port } = s.address() as net.AddressInfo;
      s.close(() => resolve(port));
    });
  });
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 === 1 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

/** CPU time of a process, all its threads, in ns (the scheduler's count: no tick rounding). */
function cpuNs(pid: number): number {
  let ns = 0;
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    try {
      ns += Number(readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'utf8').split(' ')[0]);
    } catch {
      // A thread that ended between the two reads.
    }
  }
  return ns;
}

type Window = { perSecond: number; perCpuSecond: number; failed: number };

/** Over WINDOW_MS, per load: completed connections per second, and per CPU second of its proxy. */
async function measure(loads: Load[], pids: number[]): Promise<Window[]> {
  const c0 = loads.map((l) => l.completed);
  const f0 = loads.map((l) => l.failed);
  const cpu0 = pids.map(cpuNs);
  const t0 = performance.now();
  await new Promise((r) => setTimeout(r, WINDOW_MS));
  const ms = performance.now() - t0;
  const cpu1 = pids.map(cpuNs);
  return loads.map((l, i) => {
    const done = l.completed - c0[i]!;
    return {
      perSecond: (done * 1000) / ms,
      perCpuSecond: (done * 1e9) / Math.max(1, cpu1[i]! - cpu0[i]!),
      failed: l.failed - f0[i]!,
    };
  });
}

/**
 * CPUs for the proxies (the first this process may use) and for everything else (the rest), when there
 * are two or more and taskset is there: both proxies then share one CPU, and whatever the followers cost
 * one of them comes out of its share. Else undefined (every process anywhere).
 */
function cpuSplit(t: TestContext): { proxies: string; others: string } | undefined {
  let list: number[];
  try {
    const out = execFileSync('taskset', ['-c', '-p', String(process.pid)], { encoding: 'utf8' });
    list = expandCpuList(out.slice(out.lastIndexOf(':') + 1).trim());
  } catch {
    return undefined;
  }
  if (list.length < 2) return undefined;
  const others = list.slice(1).join(',');
  // This process (all its threads) moves off the proxies' CPU, and back when the test is done.
  execFileSync('taskset', ['-a', '-c', '-p', others, String(process.pid)]);
  t.after(() => {
    execFileSync('taskset', ['-a', '-c', '-p', list.join(','), String(process.pid)]);
  });
  return { proxies: String(list[0]), others };
}

/** `0-2,5` → [0, 1, 2, 5]. */
function expandCpuList(s: string): number[] {
  return s.split(',').flatMap((part) => {
    const [a, b] = part.split('-').map(Number);
    return b === undefined ? [a!] : Array.from({ length: b - a! + 1 }, (_, i) => a! + i);
  });
}

/** A proxy as users run it, on the manifest, with its metrics server on `metricsPort`. */
async function startProxy(t: TestContext, manifest: string, cpus: string | undefined) {
  const metricsPort = await freePort();
  const proxy = new Child(
    [
      BIN,
      '--manifest',
      manifest,
      '--no-iptables',
      '--trace=protocols',
      '--state-file=',
      '--bind-address=0.0.0.0',
      '--healthz-bind-address=',
      `--metrics-bind-address=127.0.0.1:${metricsPort}`,
    ],
    cpus,
  );
  t.after(() => proxy.stop());
  const proxyPort = (await proxy.next('proxyPort', 0)).proxyPort as number;
  await waitFor(
    () =>
      new Promise<boolean>((resolve) => {
        const s = net.connect({ host: '127.0.0.1', port: metricsPort }, () => {
          s.destroy();
          resolve(true);
        });
        s.on('error', () => resolve(false));
      }),
    10_000,
    'the metrics server',
  );
  return { proxy, proxyPort, metricsPort, pid: proxy.proc.pid! };
}

test('100 followers of /debug/trace (most never reading) leave the new-connection rate ≥ 0.95× of none', async (t) => {
  const backend = await tcpServer('127.0.0.11', (socket) => {
    let head = '';
    socket.on('data', (d) => {
      head += d.toString('latin1');
      if (head.includes('\r\n\r\n')) socket.end(RESPONSE);
    });
  });
  t.after(() => backend.close());
  const dir = await mkdtemp(join(tmpdir(), 'kup-followers-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const manifest = join(dir, 'm.yaml');
  await writeFile(
    manifest,
    toYaml([
      service('shop', '10.96.0.1', [{ name: 'web', port: 80, targetPort: backend.port }], {
        namespace: 'prod',
      }),
      slice('shop', 'shop-1', [{ ip: '127.0.0.11' }], [{ name: 'web', port: backend.port }], 'prod'),
    ]),
  );
  // Two identical proxies under the same load at the same time, on one CPU: whatever else the machine runs
  // falls on both alike, and the followers go to one, then the other.
  const cpus = cpuSplit(t);
  const proxies = [
    await startProxy(t, manifest, cpus?.proxies),
    await startProxy(t, manifest, cpus?.proxies),
  ];
  const followers = new Child(['-e', FOLLOWER_SCRIPT], cpus?.others);
  t.after(() => followers.stop());
  const loads = proxies.map((p) => new Load(p.proxyPort, CONCURRENCY));
  t.after(() => {
    for (const l of loads) l.stop();
  });
  // The proxies' JIT warms up first (the first second runs at about half speed), followers' paths included.
  for (const p of proxies) {
    const from = followers.lines.length;
    followers.send(`open ${FOLLOWERS} ${p.metricsPort}`);
    await followers.next('opened', from);
    await new Promise((r) => setTimeout(r, 700));
    const closing = followers.lines.length;
    followers.send('close');
    await followers.next('closed', closing);
  }

  /** One attempt: paired windows, with the followers on one proxy and none on the other. */
  const attempt = async () => {
    const rate: number[] = [];
    const cpu: number[] = [];
    const rows: string[] = [];
    let failed = 0;
    let statuses: Record<string, number> = {};
    for (let phase = 0; phase < PHASES; phase++) {
      const on = phase % 2;
      const off = 1 - on;
      const from = followers.lines.length;
      followers.send(`open ${FOLLOWERS} ${proxies[on]!.metricsPort}`);
      statuses = (await followers.next('opened', from)).opened as Record<string, number>;
      await new Promise((r) => setTimeout(r, SETTLE_MS));
      for (let k = 0; k < WINDOWS; k++) {
        const w = await measure(
          loads,
          proxies.map((p) => p.pid),
        );
        rate.push(w[on]!.perSecond / w[off]!.perSecond);
        cpu.push(w[on]!.perCpuSecond / w[off]!.perCpuSecond);
        failed += w[on]!.failed;
        rows.push(
          `${Math.round(w[on]!.perSecond)}/${Math.round(w[off]!.perSecond)} ` +
            `(${Math.round(w[on]!.perCpuSecond)}/${Math.round(w[off]!.perCpuSecond)})`,
        );
      }
      const closing = followers.lines.length;
      followers.send('close');
      await followers.next('closed', closing);
    }
    return { rate: median(rate), cpu: median(cpu), rows, failed, statuses };
  };

  // The machine is shared: other work can slow one proxy more than the other for a while. Both ratios must
  // hold in one attempt of a few; today's per-follower serialization fails every attempt by far (0.087×,
  // 0.070× per CPU second). The bar is the rate; CPU accounting is noisier, so its guard is 0.9.
  const MIN_RATE = 0.95;
  const MIN_CPU = 0.9;
  let result = await attempt();
  for (let n = 1; n < ATTEMPTS && (result.rate < MIN_RATE || result.cpu < MIN_CPU); n++) {
    t.diagnostic(`attempt ${n}: ${result.rows.join('; ')}`);
    result = await attempt();
  }
  for (const l of loads) l.stop();
  t.diagnostic(
    `new connections/s with ${FOLLOWERS} followers / without (per CPU second of the proxy), by window: ` +
      `${result.rows.join('; ')}; medians of the ratios: ${result.rate.toFixed(3)} (${result.cpu.toFixed(3)}); ` +
      `follower statuses ${JSON.stringify(result.statuses)}`,
  );
  assert.ok(
    (result.statuses['200'] ?? 0) > 0,
    `some followers were served: ${JSON.stringify(result.statuses)}`,
  );
  assert.equal(
    result.failed,
    0,
    `no connection failed while the followers were subscribed: ${JSON.stringify(Object.fromEntries(loads[0]!.why))} ${JSON.stringify(Object.fromEntries(loads[1]!.why))}`,
  );
  assert.ok(
    result.rate >= MIN_RATE,
    `with ${FOLLOWERS} followers the new-connection rate is ${result.rate.toFixed(3)}× without`,
  );
  assert.ok(
    result.cpu >= MIN_CPU,
    `with ${FOLLOWERS} followers the proxy relays ${result.cpu.toFixed(3)}× the connections per CPU second`,
  );
  // Both proxies lived through it all.
  for (const p of proxies) assert.equal(p.proxy.proc.exitCode, null);
});

/** A follower of /debug/trace on a raw socket: the status, then the body as it comes (or not, paused). */
function follower(port: number, read: boolean) {
  const s = net.connect({ host: '127.0.0.1', port });
  const f = { socket: s, head: '', status: 0, chunks: [] as Buffer[], lines: 0, last: 0, closed: false };
  s.on('error', () => {});
  s.on('close', () => {
    f.closed = true;
  });
  s.on('data', (d: Buffer) => {
    if (f.status === 0) {
      f.head += d.toString('latin1');
      const m = /^HTTP\/1\.1 (\d{3})/.exec(f.head);
      if (m !== null) f.status = Number(m[1]);
      if (!read) s.pause();
      return;
    }
    f.chunks.push(d);
    // Lines so far: a JSON object's `}` then the newline (a string in it cannot hold a raw newline).
    for (let i = 0; i < d.length; i++) {
      if (d[i] === 0x0a && (i > 0 ? d[i - 1] : f.last) === 0x7d) f.lines++;
    }
    f.last = d[d.length - 1]!;
  });
  s.write('GET /debug/trace?follow=true&limit=0 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n');
  return f;
}

/** The NDJSON lines of a chunked body read so far (chunk sizes stripped). */
function ndjson(chunks: Buffer[]): Record<string, unknown>[] {
  return Buffer.concat(chunks)
    .toString()
    .split('\r\n')
    .filter((l) => l.startsWith('{'))
    .join('\n')
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l) as Record<string, unknown>);
}

test('followers past the cap get a 503 saying why; one that never reads gets events dropped, counted exactly', async (t) => {
  const table = new ConnectionTable();
  // No time budget here: every event is built, so that the only drops are the non-reader's.
  const tracer = createTracer({ mode: 'connections', table, maxSubscribers: 2, maxStreamCpuShare: 1 });
  const server = await startHttpServer('127.0.0.1:0', traceRoutes(tracer, table));
  t.after(() => server.close());
  const backend = await echoServer('127.0.0.12');
  t.after(() => backend.close());
  const context = makeContext([ep('127.0.0.12', backend.port)], 'TCP', 'prod/echo:tcp');
  context.observer = tracer.observerFor({ trace: undefined });
  const listener = new TcpListener(context, DEFAULT_TCP_OPTIONS, { log });
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.destroy());

  const reader = follower(server.port, true);
  const stuck = follower(server.port, false);
  t.after(() => {
    reader.socket.destroy();
    stuck.socket.destroy();
  });
  await waitFor(() => reader.status !== 0 && stuck.status !== 0, 5000, 'two followers');
  assert.deepEqual([reader.status, stuck.status], [200, 200]);
  // The third: 503, with a body that says why, and a Retry-After.
  const third = await fetch(`http://127.0.0.1:${server.port}/debug/trace?follow=true`, {
    signal: AbortSignal.timeout(5000),
  });
  assert.equal(third.status, 503);
  assert.equal(third.headers.get('retry-after'), '10');
  assert.match(await third.text(), /too many followers of \/debug\/trace \(at most 2 at once\)/);
  assert.equal(tracer.stats().refusedSubscribers, 1);
  // The buffered events are still there for anyone, followers or not.
  const once = await fetch(`http://127.0.0.1:${server.port}/debug/trace?follow=false`);
  assert.equal(once.status, 200);
  await once.text();

  // 40,000 connections (80,000 events, about 13 MB of NDJSON) while one follower never reads.
  const observer = tracer.observerFor({ trace: undefined });
  const total = 80_000;
  for (let i = 0; i < total / 2; i++) {
    const c = fakeConnection(i);
    observer.opened(c);
    c.endMs = 2000;
    c.closeReason = 'client-fin';
    observer.closed(c);
    // Let the stream flush now and then, as it would between a real proxy's connections.
    if (i % 2000 === 1999) await new Promise((r) => setTimeout(r, 60));
  }
  await waitFor(() => reader.lines >= total, 10_000, 'the reading follower to get everything');
  assert.ok(tracer.stats().droppedEvents > 0, 'the non-reader lost events');
  // The data path served meanwhile, with both followers attached.
  for (let i = 0; i < 3; i++) assert.equal(await request(listener.port, { send: `ping ${i}` }), `ping ${i}`);

  // Now it reads: what was kept, then a line with the count of what was not; nothing else.
  stuck.socket.resume();
  const quiet = async () => {
    const before = stuck.lines;
    await new Promise((r) => setTimeout(r, 300));
    return stuck.lines === before;
  };
  await waitFor(quiet, 10_000, 'the non-reader to read what it was kept and told');
  const lines = ndjson(stuck.chunks);
  const got = lines.filter((l) => l.type !== 'dropped').length;
  const dropped = lines.filter((l) => l.type === 'dropped').reduce((n, l) => n + (l.count as number), 0);
  t.diagnostic(`the non-reader got ${got} events and was told ${dropped} were dropped`);
  assert.ok(got < total / 2, `what was held for it is bounded (${got} of ${total})`);
  assert.equal(got + dropped, total + 6, 'each event delivered or counted, once (the 6 are the pings)');
});

function fakeConnection(
  id: number,
): ConnectionInfo & { endMs: number; closeReason: 'client-fin' | undefined } {
  return {
    id: 1_000_000 + id,
    service: 'prod/load:tcp' as ServicePortName,
    protocol: 'TCP',
    clientAddress: '10.0.0.1',
    clientPort: 10_000 + (id % 50_000),
    endpoint: ep('10.1.0.1', 8080),
    startMs: 1000,
    endMs: 0,
    bytesFromClient: 100,
    bytesToClient: 200,
    failedAttempts: [],
    closeReason: undefined,
    observerData: undefined,
  };
}
