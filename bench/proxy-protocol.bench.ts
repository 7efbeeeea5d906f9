// What the PROXY protocol costs per connection: new connections per second through the proxy (the
// real CLI, --no-iptables) to nginx, one Service with the header (v1, v2) and one without, same run,
// alternating rounds, medians; HTTP/1.1 `Connection: close` requests from wrk. nginx reads the header
// (`listen … proxy_protocol`) on one port and serves the same response on the other.
// Run: node bench/proxy-protocol.bench.ts [--seconds 3] [--rounds 5]
import { spawn, spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { cpuTicks, median, parseWrk } from './tools.ts';

const { values } = parseArgs({
  options: { seconds: { type: 'string', default: '3' }, rounds: { type: 'string', default: '5' } },
});
const SECONDS = Number(values.seconds);
const ROUNDS = Number(values.rounds);
const BIN = fileURLToPath(new URL('../bin/kube-userspace-proxy.js', import.meta.url));
const NGINX = { plain: 22080, pp: 22081 };
const PROXY = { off: 22180, v1: 22181, v2: 22182 };

function svc(name: string, ip: string, port: number, pp: string | undefined) {
  const annotations =
    pp === undefined ? '' : `\n  annotations: { kube-userspace-proxy.io/proxy-protocol: ${pp} }`;
  return `apiVersion: v1
kind: Service
metadata:
  name: ${name}
  namespace: default${annotations}
spec: { clusterIP: ${ip}, ports: [{ name: http, port: 80, targetPort: ${port} }] }
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: { name: ${name}-1, namespace: default, labels: { kubernetes.io/service-name: ${name} } }
addressType: IPv4
ports: [{ name: http, port: ${port} }]
endpoints: [{ addresses: [127.0.0.1], conditions: { ready: true } }]
`;
}

async function waitListening(port: number): Promise<void> {
  for (let i = 0; i < 200; i++) {
    const ok = await new Promise<boolean>((resolve) => {
      const s = net.connect({ host: '127.0.0.1', port });
      s.on('connect', () => resolve(s.destroy() === s));
      s.on('error', () => resolve(false));
    });
    if (ok) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`nothing listens on ${port}`);
}

function wrk(port: number): { rps: number; p99ms: number } {
  const r = spawnSync(
    'wrk',
    ['-t1', '-c32', `-d${SECONDS}s`, '--latency', '-H', 'Connection: close', `http://127.0.0.1:${port}/`],
    { encoding: 'utf8' },
  );
  const parsed = parseWrk(r.stdout);
  if (parsed.errors > 0 || parsed.error !== undefined) process.stderr.write(`port ${port}: ${r.stdout}\n`);
  return { rps: parsed.rps, p99ms: parsed.p99 };
}

/** CPU seconds (user + system) a process and its threads used so far; 0 when it is gone. */
function cpuSeconds(pid: number | undefined): number {
  if (pid === undefined) return 0;
  try {
    return cpuTicks(readFileSync(`/proc/${pid}/stat`, 'utf8')) / 100;
  } catch {
    return 0;
  }
}

async function main() {
  for (const tool of ['nginx', 'wrk'])
    if (spawnSync('sh', ['-c', `command -v ${tool}`]).status !== 0) {
      console.log(`proxy-protocol bench: ${tool} is not installed (sudo bash bench/setup.sh); skipped`);
      return;
    }
  const dir = await mkdtemp(join(tmpdir(), 'kup-bench-pp-'));
  const children: ReturnType<typeof spawn>[] = [];
  try {
    await writeFile(
      join(dir, 'nginx.conf'),
      `worker_processes 1;
error_log ${dir}/error.log;
pid ${dir}/nginx.pid;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path ${dir}/b; proxy_temp_path ${dir}/p; fastcgi_temp_path ${dir}/f; uwsgi_temp_path ${dir}/u; scgi_temp_path ${dir}/s;
  server { listen 127.0.0.1:${NGINX.plain} backlog=4096; location / { return 200 "ok\\n"; } }
  server { listen 127.0.0.1:${NGINX.pp} proxy_protocol backlog=4096; location / { return 200 "ok\\n"; } }
}
`,
    );
    children.push(
      spawn('nginx', ['-p', dir, '-c', join(dir, 'nginx.conf'), '-g', 'daemon off;'], { stdio: 'inherit' }),
    );
    const manifest = join(dir, 'm.yaml');
    await writeFile(
      manifest,
      [
        svc('off', '10.96.0.1', NGINX.plain, undefined),
        svc('v1', '10.96.0.2', NGINX.pp, 'v1'),
        svc('v2', '10.96.0.3', NGINX.pp, 'v2'),
      ].join('---\n'),
    );
    const state = join(dir, 'state.json');
    await writeFile(
      state,
      JSON.stringify({
        version: 1,
        proxyPorts: {
          'default/off:http/TCP': PROXY.off,
          'default/v1:http/TCP': PROXY.v1,
          'default/v2:http/TCP': PROXY.v2,
        },
      }),
    );
    children.push(
      spawn(
        process.execPath,
        [
          BIN,
          '--manifest',
          manifest,
          '--no-iptables',
          '--bind-address=0.0.0.0',
          `--state-file=${state}`,
          '--healthz-bind-address=',
          '--metrics-bind-address=',
          '--hostname-override=node-1',
          '--trace=protocols',
          '--proxy-port-range=22180-22199',
          // One process: the CPU per connection below is read from its /proc/<pid>/stat alone.
          '--workers=1',
        ],
        { stdio: ['ignore', 'ignore', 'inherit'] },
      ),
    );
    for (const port of [NGINX.plain, NGINX.pp, PROXY.off, PROXY.v1, PROXY.v2]) await waitListening(port);
    const proxyPid = children[1]!.pid;
    const results: Record<keyof typeof PROXY, { rps: number[]; p99: number[]; cpuUs: number[] }> = {
      off: { rps: [], p99: [], cpuUs: [] },
      v1: { rps: [], p99: [], cpuUs: [] },
      v2: { rps: [], p99: [], cpuUs: [] },
    };
    const order = ['off', 'v1', 'v2'] as const;
    for (let round = 0; round < ROUNDS; round++) {
      // Alternating: each round starts with a different one.
      for (let i = 0; i < order.length; i++) {
        const which = order[(round + i) % order.length]!;
        const before = cpuSeconds(proxyPid);
        const r = wrk(PROXY[which]);
        const cpu = cpuSeconds(proxyPid) - before;
        results[which].rps.push(r.rps);
        results[which].p99.push(r.p99ms);
        // The proxy's CPU per connection (wrk's requests are the connections with Connection: close).
        results[which].cpuUs.push((cpu * 1e6) / Math.max(1, r.rps * SECONDS));
      }
    }
    const off = median(results.off.rps);
    console.log(`PROXY protocol cost: ${ROUNDS} rounds × ${SECONDS} s, wrk -c32 Connection: close, medians`);
    console.log('| header | new connections/s | vs off | p99 ms | proxy CPU µs per connection |');
    console.log('|---|---:|---:|---:|---:|');
    for (const which of order) {
      const rps = median(results[which].rps);
      console.log(
        `| ${which} | ${rps.toFixed(0)} | ${(rps / off).toFixed(2)}× | ${median(results[which].p99).toFixed(2)} | ${median(results[which].cpuUs).toFixed(1)} |`,
      );
    }
  } finally {
    for (const c of children) c.kill('SIGTERM');
    await new Promise((r) => setTimeout(r, 300));
    await rm(dir, { recursive: true, force: true });
  }
}

await main();
