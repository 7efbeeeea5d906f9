// Does the data path scale with processes, or with threads? K relays (this repository's TcpListener, each
// in its own process, or each in its own worker thread of one process) listen on one port with
// SO_REUSEPORT and the kernel spreads connections over them, as a multi-worker mode would run
// (docs/multi-worker.md); HAProxy with `nbthread K` is measured beside them in the same run,
// alternating, medians. Loopback only: nginx (one worker) is the backend, wrk the
// client. Prints a table; asserts nothing. Needs wrk, nginx and haproxy (bench/setup.sh).
// Run: node bench/workers.bench.ts [--max-workers N (default: cores)] [--rounds 3] [--seconds 4]
import { type ChildProcess, fork, spawn, spawnSync } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { isMainThread, parentPort, Worker } from 'node:worker_threads';
import { silentLogger } from '../src/lib/log.ts';
import { RoundRobinBalancer } from '../src/loadbalancer/round-robin.ts';
import { noopObserver } from '../src/relay/observer.ts';
import { newServicePortStats } from '../src/relay/service-context.ts';
import { DEFAULT_TCP_OPTIONS, TcpListener } from '../src/relay/tcp.ts';
import { endpointKey } from '../src/state/endpoint.ts';
import type { ServicePortName } from '../src/state/service-port.ts';
import { parseWrk } from './tools.ts';

const BACKEND_PORT = 18480;
const PROXY_PORT = 18481;
const HAPROXY_PORT = 18482;

/** A relay process: one TcpListener on PROXY_PORT with reusePort, to the backend. */
async function relay(): Promise<void> {
  const balancer = new RoundRobinBalancer();
  balancer.setEndpoints([
    {
      key: endpointKey('127.0.0.1', BACKEND_PORT),
      ip: '127.0.0.1',
      port: BACKEND_PORT,
      family: 'IPv4',
      ready: true,
      serving: true,
      terminating: false,
      isLocal: false,
      nodeName: undefined,
      zoneHints: undefined,
      nodeHints: undefined,
    },
  ]);
  const listener = new TcpListener(
    {
      name: 'bench/web:http' as ServicePortName,
      protocol: 'TCP',
      balancer,
      balancers: { IPv4: balancer, IPv6: balancer },
      stats: newServicePortStats(),
      observer: noopObserver,
    },
    { ...DEFAULT_TCP_OPTIONS, reusePort: true },
    { log: silentLogger() },
  );
  await listener.listen('127.0.0.1', PROXY_PORT);
  if (!isMainThread) {
    parentPort?.postMessage('ready');
    return;
  }
  process.send?.('ready');
  process.on('disconnect', () => process.exit(0));
}

/** K relays as worker threads of this process (terminated by the caller). */
async function startRelayThreads(k: number): Promise<Worker[]> {
  const workers = Array.from(
    { length: k },
    () => new Worker(new URL(import.meta.url), { argv: ['--relay'] }),
  );
  await Promise.all(workers.map((w) => new Promise((resolve) => w.once('message', resolve))));
  return workers;
}

type Sample = { target: string; workers: number; scenario: string; rps: number; p99: number };

function wrk(port: number, seconds: number, close: boolean): { rps: number; p99: number } {
  const args = ['-t1', '-c32', `-d${seconds}s`, '--latency'];
  if (close) args.push('-H', 'Connection: close');
  const r = spawnSync('wrk', [...args, `http://127.0.0.1:${port}/`], { encoding: 'utf8' });
  const parsed = parseWrk(r.stdout);
  return { rps: parsed.rps, p99: parsed.p99 };
}

async function startRelays(k: number): Promise<ChildProcess[]> {
  const children = Array.from({ length: k }, () =>
    fork(new URL(import.meta.url).pathname, ['--relay'], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] }),
  );
  await Promise.all(children.map((c) => new Promise((resolve) => c.once('message', resolve))));
  return children;
}

async function startHaproxy(dir: string, k: number): Promise<ChildProcess> {
  const conf = join(dir, `haproxy-${k}.cfg`);
  await writeFile(
    conf,
    [
      'global',
      `  nbthread ${k}`,
      '  maxconn 8000',
      'defaults',
      '  mode tcp',
      '  timeout connect 5s',
      '  timeout client 60s',
      '  timeout server 60s',
      'listen web',
      `  bind 127.0.0.1:${HAPROXY_PORT}`,
      '  balance roundrobin',
      `  server pod1 127.0.0.1:${BACKEND_PORT}`,
      '',
    ].join('\n'),
  );
  const p = spawn('haproxy', ['-db', '-f', conf], { stdio: 'ignore' });
  await new Promise((r) => setTimeout(r, 500));
  return p;
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[s.length >> 1] ?? Number.NaN;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      'max-workers': { type: 'string', default: String(cpus().length) },
      rounds: { type: 'string', default: '3' },
      seconds: { type: 'string', default: '4' },
    },
  });
  const missing = ['wrk', 'nginx', 'haproxy'].filter(
    (t) => spawnSync('sh', ['-c', `command -v ${t}`]).status !== 0,
  );
  if (missing.length > 0) {
    console.log(`workers bench: missing ${missing.join(', ')} (sudo bash bench/setup.sh); skipped`);
    return;
  }
  const maxWorkers = Number(values['max-workers']);
  const rounds = Number(values.rounds);
  const seconds = Number(values.seconds);
  const dir = await mkdtemp(join(tmpdir(), 'kup-workers-'));
  await writeFile(
    join(dir, 'nginx.conf'),
    `worker_processes 1; daemon off; pid ${dir}/nginx.pid; error_log ${dir}/nginx.err;
events { worker_connections 8192; }
http { access_log off; keepalive_requests 1000000;
  server { listen 127.0.0.1:${BACKEND_PORT} backlog=4096; location / { return 200 "pod1\\n"; } } }\n`,
  );
  const nginx = spawn('nginx', ['-c', join(dir, 'nginx.conf')], { stdio: 'ignore' });
  const samples: Sample[] = [];
  try {
    await new Promise((r) => setTimeout(r, 500));
    for (let k = 1; k <= maxWorkers; k++) {
      for (let round = 0; round < rounds; round++) {
        // Alternate which target goes first.
        const targets = ['proxy', 'threads', 'haproxy'];
        const order = targets.map((_, i) => targets[(i + round) % targets.length]!);
        for (const target of order) {
          const threads = target === 'threads' ? await startRelayThreads(k) : [];
          const procs =
            target === 'proxy'
              ? await startRelays(k)
              : target === 'haproxy'
                ? [await startHaproxy(dir, k)]
                : [];
          const port = target === 'haproxy' ? HAPROXY_PORT : PROXY_PORT;
          try {
            wrk(port, 1, true); // warm-up
            for (const scenario of ['new connections', 'keep-alive'] as const) {
              const r = wrk(port, seconds, scenario === 'new connections');
              samples.push({ target, workers: k, scenario, rps: r.rps, p99: r.p99 });
              console.error(
                `  ${k} ${target.padEnd(8)} ${scenario.padEnd(16)} ${r.rps.toFixed(0)}/s p99 ${r.p99} ms`,
              );
            }
          } finally {
            await Promise.all(threads.map((w) => w.terminate()));
            for (const p of procs) p.kill();
            await Promise.all(
              procs.map((p) => new Promise((r) => (p.exitCode !== null ? r(0) : p.once('exit', r)))),
            );
          }
        }
      }
    }
  } finally {
    nginx.kill();
    await rm(dir, { recursive: true, force: true });
  }
  const get = (target: string, k: number, scenario: string) =>
    median(
      samples
        .filter((s) => s.target === target && s.workers === k && s.scenario === scenario)
        .map((s) => s.rps),
    );
  console.log(
    `\nworkers bench: ${cpus().length} cores, loopback, wrk -t1 -c32, ${rounds} rounds × ${seconds} s, medians`,
  );
  console.log(
    'K | scenario        | processes req/s | threads req/s | HAProxy req/s | processes / HAProxy | threads / HAProxy | processes / ×1 | threads / ×1',
  );
  for (let k = 1; k <= maxWorkers; k++) {
    for (const scenario of ['new connections', 'keep-alive']) {
      const p = get('proxy', k, scenario);
      const t = get('threads', k, scenario);
      const h = get('haproxy', k, scenario);
      console.log(
        `${k} | ${scenario.padEnd(15)} | ${p.toFixed(0)} | ${t.toFixed(0)} | ${h.toFixed(0)} | ${(p / h).toFixed(2)}× | ${(t / h).toFixed(2)}× | ${(p / get('proxy', 1, scenario)).toFixed(2)}× | ${(t / get('threads', 1, scenario)).toFixed(2)}×`,
      );
    }
  }
}

if (process.argv.includes('--relay')) await relay();
else await main();
