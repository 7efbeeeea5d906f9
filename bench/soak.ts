// Soak: the proxy (the real CLI, --no-iptables, its own process) under steady load while its endpoints
// churn every second, for 10 minutes by default. Counts failed requests (TCP and UDP) and samples the
// proxy's RSS and heap, to show zero failures and flat memory. A bench mode, not part of CI.
//   node bench/soak.ts [--minutes 10] [--clients 16] [--churn-ms 1000]
// Churn: every tick one endpoint leaves the EndpointSlice and one comes back. A TCP backend that left
// stops listening 300 ms later (a pod with a short grace period; about when the proxy has reloaded) and
// listens again before it returns, so a proxy that still picks it gets "connection refused" and must
// try the next endpoint unseen. UDP
// backends stay up: UDP has no connect to fail over on (a datagram to a gone pod is lost, in kube-proxy too).
import { spawn } from 'node:child_process';
import dgram from 'node:dgram';
import { readFileSync } from 'node:fs';
import { mkdtemp, rename, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const { values } = parseArgs({
  options: {
    minutes: { type: 'string', default: '10' },
    clients: { type: 'string', default: '16' },
    'churn-ms': { type: 'string', default: '1000' },
    'sample-ms': { type: 'string', default: '5000' },
  },
});
const DURATION_MS = Number(values.minutes) * 60_000;
const CLIENTS = Number(values.clients);
const CHURN_MS = Number(values['churn-ms']);
const SAMPLE_MS = Number(values['sample-ms']);
const BIN = fileURLToPath(new URL('../bin/kube-userspace-proxy.js', import.meta.url));
const BACKENDS = 5;
const STOP_AFTER_MS = 300;
const IN_SLICE = 3;
const host = (i: number) => `127.0.0.${11 + i}`;

/** A backend pod: a TCP server that answers its name (restartable) and a UDP echo that stays up. */
class Backend {
  readonly host: string;
  readonly port: number;
  server: net.Server | undefined;
  constructor(host: string, port: number) {
    this.host = host;
    this.port = port;
  }
  async start(): Promise<void> {
    if (this.server) return;
    const server = net.createServer((s) => {
      s.on('error', () => {});
      s.end(this.host);
    });
    this.server = server;
    await new Promise<void>((resolve) => server.listen({ host: this.host, port: this.port }, resolve));
  }
  stop(): void {
    // Established connections finish; only new ones are refused.
    this.server?.close();
    this.server = undefined;
  }
}

async function main(): Promise<void> {
  const port = 18080;
  const udpPort = 18053;
  const backends = Array.from({ length: BACKENDS }, (_, i) => new Backend(host(i), port));
  for (const b of backends) await b.start();
  const udpServers = backends.map((b) => {
    const u = dgram.createSocket('udp4');
    u.on('message', (m, r) => u.send(m, r.port, r.address));
    u.bind(udpPort, b.host);
    return u;
  });

  const dir = await mkdtemp(join(tmpdir(), 'kup-soak-'));
  const manifest = join(dir, 'soak.yaml');
  let inSlice = [0, 1, 2].slice(0, IN_SLICE);
  let writes = 0;
  const write = async () => {
    const tmp = join(dir, `.soak.${writes++}`);
    await writeFile(tmp, manifestText(port, udpPort, inSlice.map(host)));
    await rename(tmp, manifest);
  };
  await write();
  const metricsPort = 18249;
  const proxy = spawn(
    process.execPath,
    [
      BIN,
      '--manifest',
      manifest,
      '--no-iptables',
      '--bind-address=0.0.0.0',
      '--proxy-port-range=18100-18101',
      '--hostname-override=soak',
      '--healthz-bind-address=',
      `--metrics-bind-address=127.0.0.1:${metricsPort}`,
      '--iptables-min-sync-period=0',
      '--state-file=',
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  let proxyLog = '';
  proxy.stdout.on('data', (d: Buffer) => {
    proxyLog = (proxyLog + String(d)).slice(-20_000);
  });
  const services = async () =>
    (await (await fetch(`http://127.0.0.1:${metricsPort}/debug/services`)).json()) as {
      service: string;
      protocol: string;
      proxyPort: number;
      endpoints: string[];
    }[];
  let ports: { tcp: number; udp: number } | undefined;
  for (let i = 0; i < 100 && ports === undefined; i++) {
    try {
      const s = await services();
      const tcp = s.find((x) => x.protocol === 'TCP')?.proxyPort;
      const udp = s.find((x) => x.protocol === 'UDP')?.proxyPort;
      if (tcp && udp) ports = { tcp, udp };
    } catch {}
    await sleep(100);
  }
  if (ports === undefined) throw new Error(`the proxy did not start:\n${proxyLog}`);
  const proxyPorts = ports;

  const stats = { tcpOk: 0, tcpFailed: 0, udpOk: 0, udpFailed: 0, churns: 0 };
  const udpDropsBefore = udpReceiveBufferErrors();
  const failures: string[] = [];
  const started = Date.now();
  const deadline = started + DURATION_MS;
  let running = true;

  const tcpWorker = async () => {
    while (running) {
      const r = await tcpRequest(proxyPorts.tcp);
      if (r.ok) stats.tcpOk++;
      else {
        stats.tcpFailed++;
        if (failures.length < 20) failures.push(`${new Date().toISOString()} TCP ${r.error}`);
      }
    }
  };
  const udpWorker = async () => {
    while (running) {
      const r = await udpRequest(proxyPorts.udp);
      if (r.ok) stats.udpOk++;
      else {
        stats.udpFailed++;
        if (failures.length < 20) failures.push(`${new Date().toISOString()} UDP ${r.error}`);
      }
    }
  };

  // Churn: the oldest endpoint leaves, one that was out returns (its TCP listener back first).
  const churn = setInterval(async () => {
    const leaving = inSlice[0]!;
    const out = backends.map((_, i) => i).filter((i) => !inSlice.includes(i));
    const returning = out[Math.floor(Math.random() * out.length)]!;
    await backends[returning]!.start();
    inSlice = [...inSlice.slice(1), returning];
    await write();
    stats.churns++;
    setTimeout(() => {
      if (!inSlice.includes(leaving)) backends[leaving]!.stop();
    }, STOP_AFTER_MS);
  }, CHURN_MS);

  const samples: { t: number; rssMB: number; heapMB: number; tcpOk: number; failed: number }[] = [];
  const sample = async () => {
    const rss = Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${proxy.pid}/status`, 'utf8'))?.[1] ?? 0);
    const metrics = await (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text();
    const heap = Number(/^nodejs_heap_size_used_bytes (\S+)$/m.exec(metrics)?.[1] ?? 0);
    const s = {
      t: Math.round((Date.now() - started) / 1000),
      rssMB: round1(rss / 1024),
      heapMB: round1(heap / 2 ** 20),
      tcpOk: stats.tcpOk,
      failed: stats.tcpFailed + stats.udpFailed,
    };
    samples.push(s);
    process.stdout.write(
      `t=${s.t}s rss=${s.rssMB}MB heap=${s.heapMB}MB tcp=${stats.tcpOk} udp=${stats.udpOk} failed=${s.failed} churns=${stats.churns}\n`,
    );
  };
  const sampler = setInterval(() => void sample(), SAMPLE_MS);
  process.stdout.write(
    `soak: ${values.minutes} min, ${CLIENTS} TCP + ${Math.max(1, CLIENTS / 4)} UDP clients, churn every ${CHURN_MS} ms, ` +
      `${cpus().length} cores, Node ${process.version}\n`,
  );
  await sample();
  const workers = [
    ...Array.from({ length: CLIENTS }, tcpWorker),
    ...Array.from({ length: Math.max(1, CLIENTS / 4) }, udpWorker),
  ];
  await sleep(Math.max(0, deadline - Date.now()));
  clearInterval(churn);
  running = false;
  await Promise.all(workers);
  clearInterval(sampler);
  await sample();
  proxy.kill('SIGTERM');
  for (const b of backends) b.stop();
  for (const u of udpServers) u.close();
  await rm(dir, { recursive: true, force: true });

  const secs = (Date.now() - started) / 1000;
  const second = samples.filter((s) => s.t >= samples.at(-1)!.t / 2);
  const summary = {
    minutes: round1(secs / 60),
    tcpRequests: stats.tcpOk + stats.tcpFailed,
    tcpFailed: stats.tcpFailed,
    tcpPerSecond: Math.round(stats.tcpOk / secs),
    udpRequests: stats.udpOk + stats.udpFailed,
    udpFailed: stats.udpFailed,
    churns: stats.churns,
    // Datagrams the kernel dropped because a socket's receive buffer was full (any socket on the host).
    udpReceiveBufferErrors: udpReceiveBufferErrors() - udpDropsBefore,
    rssMB: {
      first: samples[0]!.rssMB,
      min: Math.min(...samples.map((s) => s.rssMB)),
      max: Math.max(...samples.map((s) => s.rssMB)),
      last: samples.at(-1)!.rssMB,
      secondHalfSlopeMBPerMin: round1(slope(second.map((s) => [s.t / 60, s.rssMB]))),
    },
    heapMB: {
      first: samples[0]!.heapMB,
      max: Math.max(...samples.map((s) => s.heapMB)),
      last: samples.at(-1)!.heapMB,
      secondHalfSlopeMBPerMin: round1(slope(second.map((s) => [s.t / 60, s.heapMB]))),
    },
    firstFailures: failures,
  };
  process.stdout.write(`${JSON.stringify(summary, null, 2)}\n`);
  if (stats.tcpFailed > 0) process.exitCode = 1;
}

function tcpRequest(port: number): Promise<{ ok: boolean; error?: string }> {
  return new Promise((resolve) => {
    const s = net.connect({ host: '127.0.0.1', port });
    let data = '';
    const timer = setTimeout(() => s.destroy(new Error('timeout')), 5000);
    s.on('data', (d) => (data += d));
    s.on('error', (e: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      resolve({ ok: false, error: e.code ?? e.message });
    });
    s.on('close', (hadError) => {
      clearTimeout(timer);
      if (!hadError) resolve(data.startsWith('127.0.0.') ? { ok: true } : { ok: false, error: 'EMPTY' });
    });
  });
}

function udpRequest(port: number): Promise<{ ok: boolean; error?: string }> {
  return new Promise((resolve) => {
    const u = dgram.createSocket('udp4');
    const timer = setTimeout(() => {
      u.close();
      resolve({ ok: false, error: 'timeout' });
    }, 2000);
    u.on('message', () => {
      clearTimeout(timer);
      u.close();
      resolve({ ok: true });
    });
    u.on('error', (e: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      u.close();
      resolve({ ok: false, error: e.code ?? e.message });
    });
    u.send('ping', port, '127.0.0.1');
  });
}

/** RcvbufErrors of /proc/net/snmp (UDP datagrams dropped for a full receive buffer). */
function udpReceiveBufferErrors(): number {
  const lines = readFileSync('/proc/net/snmp', 'utf8')
    .split('\n')
    .filter((l) => l.startsWith('Udp:'));
  const [names, values] = lines.map((l) => l.split(/\s+/));
  return Number(values?.[names?.indexOf('RcvbufErrors') ?? -1] ?? 0);
}

/** Least-squares slope of y over x. */
function slope(points: number[][]): number {
  const n = points.length;
  if (n < 2) return 0;
  const mx = points.reduce((a, p) => a + p[0]!, 0) / n;
  const my = points.reduce((a, p) => a + p[1]!, 0) / n;
  let num = 0;
  let den = 0;
  for (const [x, y] of points) {
    num += (x! - mx) * (y! - my);
    den += (x! - mx) ** 2;
  }
  return den === 0 ? 0 : num / den;
}

function round1(n: number): number {
  return Math.round(n * 10) / 10;
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

function manifestText(tcp: number, udp: number, ips: string[]): string {
  return `apiVersion: v1
kind: Service
metadata: { name: soak, namespace: default }
spec:
  clusterIP: 10.96.0.1
  ports:
    - { name: tcp, protocol: TCP, port: 80, targetPort: ${tcp} }
    - { name: udp, protocol: UDP, port: 53, targetPort: ${udp} }
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: { name: soak-1, namespace: default, labels: { kubernetes.io/service-name: soak } }
addressType: IPv4
ports:
  - { name: tcp, protocol: TCP, port: ${tcp} }
  - { name: udp, protocol: UDP, port: ${udp} }
endpoints:
${ips.map((ip) => `  - addresses: [${ip}]`).join('\n')}
`;
}

await main();
