// Macro-benchmark of what tracing costs the data path: the same TcpListeners in child processes, one with
// --trace none and one with protocols, driven over loopback from this process (client and backends) in
// alternating runs. Prints medians, the protocols/none ratio and the proxy's CPU per unit. No assertions.
// Run: node bench/trace.bench.ts [--rounds 15] [--seconds 1] [--mib 128] [--concurrency 32] [--rate 1500]
//        [--modes none,protocols,none (default; the second none is an A/A control)|connections|protocols+log|data-only]
//        [--scenarios upload-http,...] [--prof DIR]
import { fork } from 'node:child_process';
import net from 'node:net';
import { parseArgs } from 'node:util';
import v8 from 'node:v8';
import { pino } from 'pino';
import { silentLogger } from '../src/lib/log.ts';
import { RoundRobinBalancer } from '../src/loadbalancer/round-robin.ts';
import type { ConnectionObserver } from '../src/relay/observer.ts';
import type { ServicePortContext } from '../src/relay/service-context.ts';
import { newServicePortStats } from '../src/relay/service-context.ts';
import { DEFAULT_TCP_OPTIONS, TcpListener } from '../src/relay/tcp.ts';
import { endpointKey } from '../src/state/endpoint.ts';
import type { ServicePortName, TraceMode } from '../src/state/service-port.ts';
import { ConnectionTable } from '../src/trace/connection-table.ts';
import { createTracer } from '../src/trace/tracer.ts';
import { handMadeConnection } from '../test/helpers/tracer.ts';

type Backends = { upload: number; download: number; cps: number };
type ChildMessage =
  | { ports: Backends }
  | {
      cpuUs: number;
      mainCpuUs: number;
      events: number;
      recent: number;
      active: number;
      dropped: number;
      accepted: number;
    };

const SCENARIOS = ['upload-http', 'download-http', 'upload-raw', 'conn/s', 'conn-paced'] as const;
type Scenario = (typeof SCENARIOS)[number];

// ---------------------------------------------------------------------------------------------------
// The proxy side (child process): three listeners, one per backend, all with the same tracer mode.

async function runProxy(mode: string, backends: Backends): Promise<void> {
  const log = silentLogger();
  const table = new ConnectionTable();
  const traceMode = (
    mode === 'protocols+log' ? 'protocols' : mode === 'data-only' ? 'none' : mode
  ) as TraceMode;
  const dataOnly: ConnectionObserver = {
    opened() {},
    closed() {},
    clientData: () => true,
    endpointData: () => true,
    wantsData: true,
  };
  const accessLog = mode === 'protocols+log' ? pino(pino.destination('/dev/null')) : undefined;
  const tracer = createTracer({ mode: traceMode, table, accessLog });
  const ports: Record<string, number> = {};
  const contexts: ServicePortContext[] = [];
  for (const [name, port] of Object.entries(backends)) {
    const balancer = new RoundRobinBalancer();
    balancer.setEndpoints([
      {
        key: endpointKey('127.0.0.1', port),
        ip: '127.0.0.1',
        port,
        family: 'IPv4',
        ready: true,
        serving: true,
        terminating: false,
        isLocal: true,
        nodeName: undefined,
        zoneHints: undefined,
        nodeHints: undefined,
      },
    ]);
    const context: ServicePortContext = {
      name: `bench/${name}:tcp` as ServicePortName,
      protocol: 'TCP',
      balancer,
      balancers: { IPv4: balancer, IPv6: balancer },
      stats: newServicePortStats(),
      // `data-only`: an observer that takes every chunk and does nothing (the relay's own cost of wantsData).
      observer: mode === 'data-only' ? dataOnly : tracer.observerFor({ trace: undefined }),
    };
    contexts.push(context);
    const listener = new TcpListener(context, DEFAULT_TCP_OPTIONS, { log });
    await listener.listen('127.0.0.1', 0);
    ports[name] = listener.port;
  }
  process.on('message', (m: string) => {
    if (m === 'stats') {
      const cpu = process.cpuUsage();
      const main = process.threadCpuUsage();
      process.send!({
        cpuUs: cpu.user + cpu.system,
        mainCpuUs: main.user + main.system,
        events: tracer.stats().events,
        recent: table.recentCount,
        active: table.activeCount,
        dropped: table.dropped,
        accepted: contexts.reduce((n, c) => n + c.stats.accepted, 0),
      });
    } else if (m === 'exit') process.exit(0);
  });
  process.send!({ ports });
}

// ---------------------------------------------------------------------------------------------------
// The driving side: backends, load, and the table.

const CHUNK = Buffer.alloc(64 * 1024, 0x61);

function listen(handler: (s: net.Socket) => void): Promise<net.Server> {
  const server = net.createServer({ noDelay: true, allowHalfOpen: true }, (s) => {
    s.on('error', () => {});
    handler(s);
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

/** Writes `total` bytes with backpressure. */
function pump(sock: net.Socket, total: number): Promise<void> {
  return new Promise((resolve) => {
    let left = total;
    const write = () => {
      while (left > 0) {
        const n = Math.min(left, CHUNK.length);
        left -= n;
        if (!sock.write(n === CHUNK.length ? CHUNK : CHUNK.subarray(0, n))) {
          sock.once('drain', write);
          return;
        }
      }
      resolve();
    };
    write();
  });
}

async function startBackends(bytes: number): Promise<{ ports: Backends; close(): void }> {
  // Upload: swallow everything; answer once the client has finished sending.
  const upload = await listen((s) => {
    s.resume();
    s.on('end', () => s.end('HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n'));
  });
  // Download: after the request head, a response of `bytes` bytes.
  const download = await listen((s) => {
    s.once('data', async () => {
      s.write(`HTTP/1.1 200 OK\r\nContent-Length: ${bytes}\r\n\r\n`);
      await pump(s, bytes);
      s.end();
    });
    s.on('end', () => s.end());
  });
  // Connections: one small response per connection, then close (the server closes first).
  const cps = await listen((s) => {
    s.once('data', () => s.end('HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok'));
  });
  const port = (s: net.Server) => (s.address() as net.AddressInfo).port;
  return {
    ports: { upload: port(upload), download: port(download), cps: port(cps) },
    close() {
      upload.close();
      download.close();
      cps.close();
    },
  };
}

function connect(port: number): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ host: '127.0.0.1', port, noDelay: true, allowHalfOpen: true }, () => resolve(s));
    s.once('error', reject);
  });
}

function closed(s: net.Socket): Promise<number> {
  return new Promise((resolve, reject) => {
    let n = 0;
    s.on('data', (d: Buffer) => {
      n += d.length;
    });
    s.on('end', () => s.end());
    s.once('close', () => resolve(n));
    s.once('error', reject);
  });
}

/** MiB/s of one connection sending `bytes` (an HTTP POST body, or raw bytes no sniffer recognises). */
async function upload(port: number, bytes: number, http: boolean): Promise<number> {
  const start = performance.now();
  const s = await connect(port);
  const done = closed(s);
  if (http) s.write(`POST /upload HTTP/1.1\r\nHost: bench.example\r\nContent-Length: ${bytes}\r\n\r\n`);
  await pump(s, bytes);
  s.end();
  await done;
  return bytes / 2 ** 20 / ((performance.now() - start) / 1000);
}

async function download(port: number, bytes: number): Promise<number> {
  const start = performance.now();
  const s = await connect(port);
  const done = closed(s);
  s.write('GET /big HTTP/1.1\r\nHost: bench.example\r\n\r\n');
  const got = await done;
  if (got < bytes) throw new Error(`short download: ${got} of ${bytes}`);
  return bytes / 2 ** 20 / ((performance.now() - start) / 1000);
}

const REQUEST = Buffer.from('GET / HTTP/1.1\r\nHost: bench.example\r\nConnection: close\r\n\r\n');

/** New connections per second: `concurrency` loops of connect, request, response, close. */
async function connectionsPerSecond(port: number, seconds: number, concurrency: number): Promise<number> {
  const start = performance.now();
  const deadline = start + seconds * 1000;
  let n = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (performance.now() < deadline) {
        const s = await connect(port);
        const done = closed(s);
        s.write(REQUEST);
        await done;
        n++;
      }
    }),
  );
  return n / ((performance.now() - start) / 1000);
}

/**
 * Connections at a fixed rate (a new batch every 10 ms), each one request and its response; at most
 * `concurrency` at once. The proxy is not saturated, so its CPU per connection compares modes without
 * the batching effects of a saturated event loop. Returns the connections completed.
 */
async function pacedConnections(
  port: number,
  seconds: number,
  rate: number,
  concurrency: number,
): Promise<number> {
  const tickMs = 10;
  const perTick = rate / (1000 / tickMs);
  const ticks = Math.round((seconds * 1000) / tickMs);
  let due = 0;
  let open = 0;
  let done = 0;
  let failed = 0;
  const one = async (): Promise<void> => {
    open++;
    try {
      const s = await connect(port);
      const closing = closed(s);
      s.write(REQUEST);
      await closing;
      done++;
    } catch {
      failed++;
    } finally {
      open--;
    }
  };
  const start = performance.now();
  for (let t = 0; t < ticks; t++) {
    due += perTick;
    for (; due >= 1 && open < concurrency; due--) void one();
    const next = start + (t + 1) * tickMs;
    await new Promise((r) => setTimeout(r, Math.max(0, next - performance.now())));
  }
  for (let i = 0; i < 500 && open > 0; i++) await new Promise((r) => setTimeout(r, 10));
  if (failed > 0) throw new Error(`${failed} paced connections failed`);
  return done;
}

/** A stand-in for the relay's connection object: what the observer reads. */
const fakeConnection = (id: number) => handMadeConnection(id, '127.0.0.1', 40000, undefined, 1);

function nsPer(iterations: number, fn: (i: number) => void): number {
  for (let i = 0; i < Math.min(iterations, 20_000); i++) fn(i); // warm up the JIT
  const start = process.hrtime.bigint();
  for (let i = 0; i < iterations; i++) fn(i);
  return Number(process.hrtime.bigint() - start) / iterations;
}

/**
 * The observers' own CPU, in process and free of scheduling noise: per connection (open, one request and
 * response, close) and per 64 KiB chunk once the sniffer is done or while it follows an HTTP body.
 */
/** V8 heap bytes allocated per call of `fn` (counted across collections with v8.GCProfiler). */
function bytesPer(iterations: number, fn: (i: number) => void): number {
  const profiler = new v8.GCProfiler();
  const start = v8.getHeapStatistics().used_heap_size;
  profiler.start();
  for (let i = 0; i < iterations; i++) fn(i);
  const end = v8.getHeapStatistics().used_heap_size;
  let allocated = 0;
  let last = start;
  for (const gc of profiler.stop()?.statistics ?? []) {
    allocated += gc.beforeGC.heapStatistics.usedHeapSize - last;
    last = gc.afterGC.heapStatistics.usedHeapSize;
  }
  return (allocated + end - last) / iterations;
}

function observerCost(mode: TraceMode): {
  perConnection: number;
  bytesPerConnection: number;
  perChunkDone: number;
  perChunkBody: number;
} {
  const table = new ConnectionTable();
  const observer = createTracer({ mode, table }).observerFor({ trace: undefined });
  const response = Buffer.from('HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok');
  let id = 1;
  const lifecycle = (): void => {
    const c = fakeConnection(id++);
    observer.opened(c);
    observer.clientData?.(c, REQUEST);
    observer.endpointData?.(c, response);
    c.endMs = 2;
    c.closeReason = 'endpoint-fin';
    observer.closed(c);
  };
  const perConnection = nsPer(200_000, lifecycle);
  // Less the fake connection itself (what the relay allocates anyway).
  const bytesPerConnection = bytesPer(200_000, lifecycle) - bytesPer(200_000, (i) => fakeConnection(i));
  const done = fakeConnection(id++);
  observer.opened(done);
  observer.clientData?.(done, CHUNK); // 'aaaa…': unrecognised, the sniffer is done at once
  const perChunkDone = nsPer(1_000_000, () => observer.clientData?.(done, CHUNK));
  const body = fakeConnection(id++);
  observer.opened(body);
  observer.clientData?.(
    body,
    Buffer.from(`POST / HTTP/1.1\r\nHost: x\r\nContent-Length: ${2 ** 50}\r\n\r\n`),
  );
  const perChunkBody = nsPer(1_000_000, () => observer.clientData?.(body, CHUNK));
  return { perConnection, bytesPerConnection, perChunkDone, perChunkBody };
}

type Child = {
  /** The mode, with `#2`... when the same mode runs twice (an A/A control showing the noise floor). */
  label: string;
  ports: Backends;
  stats(): Promise<Extract<ChildMessage, { cpuUs: number }>>;
  kill(): void;
};

async function startChild(
  mode: string,
  label: string,
  backends: Backends,
  profDir: string | undefined,
): Promise<Child> {
  const execArgv = profDir === undefined ? [] : ['--cpu-prof', `--cpu-prof-dir=${profDir}`];
  const child = fork(import.meta.filename, ['--proxy', mode, JSON.stringify(backends)], { execArgv });
  const ports = await new Promise<Backends>((resolve) =>
    child.once('message', (m: ChildMessage) => resolve((m as { ports: Backends }).ports)),
  );
  return {
    label,
    ports,
    stats: () =>
      new Promise((resolve) => {
        child.once('message', (m: ChildMessage) => resolve(m as Extract<ChildMessage, { cpuUs: number }>));
        child.send('stats');
      }),
    kill: () => child.send('exit'),
  };
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 === 1 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

type Run = { value: number; cpu: number; mainCpu: number };

async function main(): Promise<void> {
  const { values } = parseArgs({
    args: process.argv.slice(2),
    options: {
      rounds: { type: 'string', default: '15' },
      seconds: { type: 'string', default: '1' },
      mib: { type: 'string', default: '128' },
      concurrency: { type: 'string', default: '32' },
      rate: { type: 'string', default: '1500' },
      modes: { type: 'string', default: 'none,protocols,none' },
      scenarios: { type: 'string', default: SCENARIOS.join(',') },
      prof: { type: 'string' },
    },
  });
  const rounds = Number(values.rounds);
  const seconds = Number(values.seconds);
  const bytes = Number(values.mib) * 2 ** 20;
  const concurrency = Number(values.concurrency);
  const rate = Number(values.rate);
  const modes = values.modes.split(',');
  const scenarios = values.scenarios.split(',') as Scenario[];
  const backends = await startBackends(bytes);
  const seen = new Map<string, number>();
  const labels = modes.map((m) => {
    const n = (seen.get(m) ?? 0) + 1;
    seen.set(m, n);
    return n === 1 ? m : `${m}#${n}`;
  });
  const children = await Promise.all(
    modes.map((m, i) => startChild(m, labels[i]!, backends.ports, values.prof)),
  );

  /** One run: the figure and the proxy's CPU microseconds per unit (MiB or connection). */
  const run = async (child: Child, scenario: Scenario): Promise<Run> => {
    const before = await child.stats();
    let value: number;
    let units: number;
    const t0 = performance.now();
    if (scenario === 'conn/s') {
      value = await connectionsPerSecond(child.ports.cps, seconds, concurrency);
      units = (value * (performance.now() - t0)) / 1000;
    } else if (scenario === 'conn-paced') {
      units = await pacedConnections(child.ports.cps, seconds, rate, concurrency);
      value = units / ((performance.now() - t0) / 1000);
    } else {
      value =
        scenario === 'download-http'
          ? await download(child.ports.download, bytes)
          : await upload(child.ports.upload, bytes, scenario === 'upload-http');
      units = bytes / 2 ** 20;
    }
    const after = await child.stats();
    return {
      value,
      cpu: (after.cpuUs - before.cpuUs) / units,
      mainCpu: (after.mainCpuUs - before.mainCpuUs) / units,
    };
  };

  process.stdout.write(
    `trace bench: ${rounds} rounds, ${values.mib} MiB per transfer, ${concurrency} concurrent for ${seconds}s; ` +
      `modes ${labels.join(', ')}\n`,
  );
  // Warm up every path in every child once.
  for (const c of children) for (const s of scenarios) await run(c, s);

  // Per round, each mode runs back to back: a ratio taken within a round compares runs under the same
  // background load, so the median of those ratios resists noise better than a ratio of medians.
  const results = new Map<string, Run[]>();
  for (let r = 0; r < rounds; r++) {
    for (const scenario of scenarios) {
      // Alternate the order each round so drift (thermal, page cache, TIME_WAIT) favours no mode.
      const order = r % 2 === 0 ? children : [...children].reverse();
      for (const c of order) {
        const key = `${scenario}|${c.label}`;
        const list = results.get(key) ?? [];
        list.push(await run(c, scenario));
        results.set(key, list);
      }
    }
    process.stdout.write(`  round ${r + 1}/${rounds} done\n`);
  }

  const base = labels[0]!;
  const pick = (runs: Run[], f: keyof Run) => runs.map((x) => x[f]);
  const ratio = (xs: Run[], bs: Run[], f: keyof Run) => median(xs.map((x, i) => x[f] / bs[i]![f])).toFixed(3);
  const header = ['scenario', 'mode', 'median', 'ratio', 'proxy CPU', 'ratio', 'main thread CPU', 'ratio'];
  const rows: string[][] = [header];
  for (const scenario of scenarios) {
    const perConnection = scenario === 'conn/s' || scenario === 'conn-paced';
    const unit = perConnection ? 'conn/s' : 'MiB/s';
    const cpuUnit = perConnection ? 'µs/conn' : 'µs/MiB';
    const b = results.get(`${scenario}|${base}`)!;
    for (const label of labels) {
      const x = results.get(`${scenario}|${label}`)!;
      rows.push([
        scenario,
        label,
        `${median(pick(x, 'value')).toFixed(0)} ${unit}`,
        ratio(x, b, 'value'),
        `${median(pick(x, 'cpu')).toFixed(1)} ${cpuUnit}`,
        ratio(x, b, 'cpu'),
        `${median(pick(x, 'mainCpu')).toFixed(1)} ${cpuUnit}`,
        ratio(x, b, 'mainCpu'),
      ]);
    }
  }
  const widths = header.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  for (const r of rows) process.stdout.write(`${r.map((c, i) => c.padEnd(widths[i]!)).join('  ')}\n`);
  process.stdout.write(
    `(ratio: median over rounds of the ratio to the ${base} run of the same round; ` +
      `a repeated mode such as none#2 is an A/A control: its distance from 1 is the noise floor)\n`,
  );

  // The observers' own cost against the relay's CPU per unit without tracing (from the runs above).
  const noneCpu = (scenario: Scenario) => {
    const x = results.get(`${scenario}|none`);
    return x === undefined ? undefined : median(pick(x, 'mainCpu')) * 1000; // ns per MiB or connection
  };
  process.stdout.write(
    '\nobserver CPU measured in process (ns), as a share of the main-thread CPU without tracing:\n',
  );
  const chunksPerMiB = 2 ** 20 / CHUNK.length;
  for (const mode of ['connections', 'protocols'] as const) {
    const c = observerCost(mode);
    const share = (ns: number, scenario: Scenario) => {
      const b = noneCpu(scenario);
      return b === undefined ? '' : ` (${((ns / b) * 100).toFixed(2)}% of ${scenario})`;
    };
    process.stdout.write(
      `  ${mode}: ${c.perConnection.toFixed(0)} per connection${share(c.perConnection, 'conn/s')}, ` +
        `${c.bytesPerConnection.toFixed(0)} bytes allocated per connection; ` +
        `${c.perChunkDone.toFixed(0)} per chunk after done${share(c.perChunkDone * chunksPerMiB, 'upload-raw')}; ` +
        `${c.perChunkBody.toFixed(0)} per chunk of an HTTP body${share(c.perChunkBody * chunksPerMiB, 'upload-http')}\n`,
    );
  }
  for (const c of children) {
    const s = await c.stats();
    process.stdout.write(
      `  ${c.label}: ${s.accepted} connections, ${s.events} trace events, ${s.recent} closed kept, ` +
        `${s.dropped} dropped, ${s.active} active\n`,
    );
    c.kill();
  }
  backends.close();
}

if (process.argv[2] === '--proxy') await runProxy(process.argv[3]!, JSON.parse(process.argv[4]!) as Backends);
else await main();
