// Loopback benchmark: the proxy (the real CLI, --no-iptables, in its own process) against a direct
// connection, same run, alternating, medians. Throughput of one TCP stream, new connections per second
// (32 concurrent clients, one small request each), and UDP request/response rate.
// Run: node bench/loopback.bench.ts [--seconds 3] [--rounds 3]
import { spawn } from 'node:child_process';
import dgram from 'node:dgram';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const { values } = parseArgs({
  options: { seconds: { type: 'string', default: '3' }, rounds: { type: 'string', default: '3' } },
});
const SECONDS = Number(values.seconds);
const ROUNDS = Number(values.rounds);
const BIN = fileURLToPath(new URL('../bin/kube-userspace-proxy.js', import.meta.url));

type Target = { name: string; host: string; port: number; udpPort: number };

async function main() {
  // Backends live in a child process, so the client here, the backend and the proxy each get a process.
  const backend = spawn(process.execPath, ['-e', BACKEND_SCRIPT], { stdio: ['ignore', 'pipe', 'inherit'] });
  const ports = await new Promise<{ tcp: number; udp: number }>((resolve) =>
    backend.stdout.once('data', (d) => resolve(JSON.parse(String(d)))),
  );
  const dir = await mkdtemp(join(tmpdir(), 'kup-bench-'));
  const manifest = join(dir, 'bench.yaml');
  await writeFile(manifest, manifestText(ports.tcp, ports.udp));
  const proxyPorts = { tcp: 21080, udp: 21081 };
  const proxy = spawn(
    process.execPath,
    [
      BIN,
      '--manifest',
      manifest,
      '--no-iptables',
      '--bind-address=0.0.0.0',
      '--proxy-port-range=21080-21081',
      '--hostname-override=bench',
      '--healthz-bind-address=',
      '--metrics-bind-address=127.0.0.1:0',
      '--v=0',
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  await new Promise<void>((resolve) => {
    let seen = 0;
    proxy.stdout.on('data', (d: Buffer) => {
      seen += (String(d).match(/Opened service port/g) ?? []).length;
      if (seen >= 2) resolve();
    });
  });
  // Which port is which is decided by the allocator; ask the kernel which one answers TCP.
  const tcpFirst = await canConnect(proxyPorts.tcp);
  const proxied: Target = {
    name: 'proxy',
    host: '127.0.0.1',
    port: tcpFirst ? proxyPorts.tcp : proxyPorts.udp,
    udpPort: tcpFirst ? proxyPorts.udp : proxyPorts.tcp,
  };
  const direct: Target = { name: 'direct', host: '127.0.0.11', port: ports.tcp, udpPort: ports.udp };

  const results: Record<string, Record<string, number[]>> = { direct: {}, proxy: {} };
  const record = (t: Target, k: string, v: number) => {
    const r = results[t.name]!;
    r[k] ??= [];
    r[k].push(v);
  };
  for (let round = 0; round < ROUNDS; round++) {
    for (const t of round % 2 === 0 ? [direct, proxied] : [proxied, direct]) {
      record(t, 'throughput Gbit/s', await throughput(t));
      record(t, 'new connections/s', await connectionsPerSecond(t));
      record(t, 'UDP requests/s', await udpRate(t));
    }
  }
  proxy.kill('SIGTERM');
  backend.kill('SIGTERM');
  await rm(dir, { recursive: true, force: true });

  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
  const lines = [
    `machine: ${cpus().length} cores (${cpus()[0]?.model ?? '?'}), Node ${process.version}, ${ROUNDS} rounds × ${SECONDS}s, medians`,
    '',
    '| measure | direct | proxy | proxy/direct |',
    '|---|---|---|---|',
  ];
  for (const k of Object.keys(results.direct!)) {
    const d = median(results.direct![k]!);
    const p = median(results.proxy![k]!);
    lines.push(`| ${k} | ${fmt(d)} | ${fmt(p)} | ${(p / d).toFixed(2)}× |`);
  }
  process.stdout.write(`${lines.join('\n')}\n`);
}

function fmt(n: number): string {
  return n >= 100 ? Math.round(n).toLocaleString('en') : n.toFixed(2);
}

function canConnect(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect({ host: '127.0.0.1', port }, () => {
      s.destroy();
      resolve(true);
    });
    s.on('error', () => resolve(false));
  });
}

/** One stream: writes 64 KiB chunks for SECONDS to a sink that counts, reports Gbit/s. */
function throughput(t: Target): Promise<number> {
  return new Promise((resolve, reject) => {
    const chunk = Buffer.alloc(64 * 1024, 7);
    const s = net.connect({ host: t.host, port: t.port, noDelay: true });
    let sent = 0;
    let stop = false;
    const started = process.hrtime.bigint();
    const pump = () => {
      while (!stop) {
        sent += chunk.length;
        if (!s.write(chunk)) return void s.once('drain', pump);
      }
    };
    s.on('connect', () => {
      s.write('SINK\n');
      pump();
      setTimeout(() => {
        stop = true;
        s.end();
      }, SECONDS * 1000);
    });
    s.on('data', () => {});
    s.on('error', reject);
    s.on('close', () => {
      const secs = Number(process.hrtime.bigint() - started) / 1e9;
      resolve((sent * 8) / secs / 1e9);
    });
  });
}

/** 32 concurrent clients, each: connect, send a line, read the reply, close; repeat for SECONDS. */
async function connectionsPerSecond(t: Target): Promise<number> {
  let done = 0;
  const deadline = Date.now() + SECONDS * 1000;
  const one = () =>
    new Promise<void>((resolve) => {
      const s = net.connect({ host: t.host, port: t.port, noDelay: true });
      s.on('connect', () => s.write('PING\n'));
      s.on('data', () => s.end());
      s.on('error', () => resolve());
      s.on('close', () => {
        done++;
        resolve();
      });
    });
  const worker = async () => {
    while (Date.now() < deadline) await one();
  };
  const started = Date.now();
  await Promise.all(Array.from({ length: 32 }, worker));
  return done / ((Date.now() - started) / 1000);
}

/** 32 UDP requests in flight from one client socket; replies counted for SECONDS. */
function udpRate(t: Target): Promise<number> {
  return new Promise((resolve) => {
    const s = dgram.createSocket('udp4');
    let replies = 0;
    const payload = Buffer.alloc(40, 1);
    const started = Date.now();
    const stopAt = started + SECONDS * 1000;
    s.on('message', () => {
      replies++;
      if (Date.now() < stopAt) s.send(payload, t.udpPort, t.host);
    });
    s.bind(0, '127.0.0.1', () => {
      for (let i = 0; i < 32; i++) s.send(payload, t.udpPort, t.host);
    });
    setTimeout(
      () => {
        s.close();
        resolve(replies / ((Date.now() - started) / 1000));
      },
      SECONDS * 1000 + 100,
    );
  });
}

function manifestText(tcp: number, udp: number): string {
  return `apiVersion: v1
kind: Service
metadata: { name: bench, namespace: default }
spec:
  clusterIP: 10.96.0.1
  ports:
    - { name: tcp, protocol: TCP, port: 80, targetPort: ${tcp} }
    - { name: udp, protocol: UDP, port: 53, targetPort: ${udp} }
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: { name: bench-1, namespace: default, labels: { kubernetes.io/service-name: bench } }
addressType: IPv4
ports:
  - { name: tcp, protocol: TCP, port: ${tcp} }
  - { name: udp, protocol: UDP, port: ${udp} }
endpoints:
  - addresses: [127.0.0.11]
`;
}

// A sink (first line "SINK") or a PING/PONG server over TCP, and a UDP echo, on 127.0.0.11.
const BACKEND_SCRIPT = `
const net = require('node:net'); const dgram = require('node:dgram');
const srv = net.createServer({ noDelay: true }, (s) => {
  s.once('data', (d) => { if (d.toString().startsWith('SINK')) { s.on('data', () => {}); s.on('end', () => s.end()); } else { s.end('PONG\\n'); } });
  s.on('error', () => {});
});
const udp = dgram.createSocket('udp4');
udp.on('message', (m, r) => udp.send(m, r.port, r.address));
srv.listen(0, '127.0.0.11', () => udp.bind(0, '127.0.0.11', () => process.stdout.write(JSON.stringify({ tcp: srv.address().port, udp: udp.address().port }))));
`;

await main();
