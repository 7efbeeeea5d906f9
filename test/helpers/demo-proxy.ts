// The demo as a test fixture: examples/demo.yaml's Services and EndpointSlices with its two "pods" (HTTP
// and UDP echo on 127.0.0.11 and 127.0.0.12, on a free port instead of 8080/5353), optionally with many
// generated service ports, served by the real proxy process (the bin, --no-iptables) with its metrics
// server on a free loopback port.
import type { ChildProcess } from 'node:child_process';
import dgram from 'node:dgram';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import http from 'node:http';
import type net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseAllDocuments } from 'yaml';
import { toYaml } from './manifests.ts';
import { freePort, spawnNode } from './proxy-process.ts';
import { waitFor } from './servers.ts';

const BIN = fileURLToPath(new URL('../../bin/kube-userspace-proxy.js', import.meta.url));
const DEMO = fileURLToPath(new URL('../../examples/demo.yaml', import.meta.url));
export const POD_IPS = ['127.0.0.11', '127.0.0.12'] as const;

export type DemoProxy = {
  /** `http://127.0.0.1:<metrics port>` */
  readonly metrics: string;
  /** Proxy port by `ns/name:port/PROTO`. */
  readonly proxyPorts: ReadonlyMap<string, number>;
  readonly child: ChildProcess;
  /** The proxy's JSON log lines so far. */
  readonly lines: Record<string, unknown>[];
  stop(): Promise<void>;
};

export type DemoProxyOptions = {
  /** Generated TCP service ports (`gen/svc-N:http`) besides the demo's, each with one endpoint. */
  extraServicePorts?: number;
  extraArgs?: string[];
  /** `ulimit -n` for the process (10,000 service ports need more than 10,000 descriptors). */
  fdLimit?: number;
  /** How long to wait for every service port to open. */
  startTimeoutMs?: number;
  /** More objects for the manifest, given the pods' port. */
  extraObjects?: (podPort: number) => unknown[];
  /** Options for node itself (e.g. --inspect=127.0.0.1:PORT for a benchmark's garbage collections). */
  nodeArgs?: string[];
};

type Pods = { port: number; close(): Promise<void> };

/** HTTP and UDP echo "pods" on both pod IPs, all on one port (the EndpointSlice has one port per name). */
async function startPods(): Promise<Pods> {
  for (let attempt = 0; attempt < 10; attempt++) {
    const port = await freePort();
    const servers: http.Server[] = [];
    const sockets: dgram.Socket[] = [];
    const close = async () => {
      for (const s of servers) s.closeAllConnections();
      await Promise.all(servers.map((s) => new Promise((r) => s.close(r))));
      await Promise.all(sockets.map((s) => new Promise<void>((r) => s.close(() => r()))));
    };
    try {
      for (const ip of POD_IPS) {
        const server = http.createServer((req, res) => {
          req.resume();
          res.setHeader('content-type', 'text/plain');
          res.end(`hello from ${ip}: ${req.method}\n`);
        });
        servers.push(server);
        await listen(server, port, ip);
        const udp = dgram.createSocket('udp4');
        sockets.push(udp);
        udp.on('message', (msg, from) =>
          udp.send(Buffer.concat([Buffer.from(`${ip}: `), msg]), from.port, from.address),
        );
        await new Promise<void>((resolve, reject) => {
          udp.once('error', reject);
          udp.bind(port, ip, () => resolve());
        });
      }
      return { port, close };
    } catch {
      await close().catch(() => {});
    }
  }
  throw new Error('no port free on both pod IPs');
}

function listen(server: net.Server, port: number, host: string): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve());
  });
}

/** The demo manifest with its target ports moved to `port`, plus `extra` generated service ports. */
export async function demoManifest(port: number, extra = 0): Promise<unknown[]> {
  const text = await readFile(DEMO, 'utf8');
  const objects = parseAllDocuments(text).map((d) => d.toJSON() as Record<string, unknown>);
  const moved = JSON.parse(
    JSON.stringify(objects).replace(/"(targetPort|port)":(8080|5353)/g, `"$1":${port}`),
  );
  const generated: unknown[] = [];
  for (let i = 0; i < extra; i++) {
    const name = `svc-${String(i).padStart(5, '0')}`;
    const ip = `10.100.${Math.floor(i / 250)}.${(i % 250) + 1}`;
    generated.push(
      {
        apiVersion: 'v1',
        kind: 'Service',
        metadata: { name, namespace: 'gen' },
        spec: {
          clusterIP: ip,
          clusterIPs: [ip],
          ports: [{ name: 'http', protocol: 'TCP', port: 80, targetPort: port }],
        },
      },
      {
        apiVersion: 'discovery.k8s.io/v1',
        kind: 'EndpointSlice',
        metadata: { name: `${name}-1`, namespace: 'gen', labels: { 'kubernetes.io/service-name': name } },
        addressType: 'IPv4',
        ports: [{ name: 'http', protocol: 'TCP', port }],
        endpoints: [{ addresses: [POD_IPS[i % 2]], conditions: { ready: true } }],
      },
    );
  }
  return [...moved, ...generated];
}

function servicePortsOf(objects: unknown[]): number {
  let n = 0;
  for (const o of objects as { kind?: string; spec?: { ports?: unknown[] } }[])
    if (o.kind === 'Service') n += o.spec?.ports?.length ?? 0;
  return n;
}

/** Starts the pods and the proxy, and waits until every service port of the manifest is open. */
export async function startDemoProxy(options: DemoProxyOptions = {}): Promise<DemoProxy> {
  const pods = await startPods();
  const dir = await mkdtemp(join(tmpdir(), 'kup-demo-'));
  const objects = [
    ...(await demoManifest(pods.port, options.extraServicePorts ?? 0)),
    ...(options.extraObjects?.(pods.port) ?? []),
  ];
  const expected = servicePortsOf(objects);
  const manifest = join(dir, 'demo.yaml');
  await writeFile(manifest, toYaml(objects));
  const metricsPort = await freePort();
  const args = [
    ...(options.nodeArgs ?? []),
    BIN,
    '--manifest',
    manifest,
    '--no-iptables',
    '--state-file=',
    '--hostname-override=demo-node',
    '--healthz-bind-address=',
    `--metrics-bind-address=127.0.0.1:${metricsPort}`,
    '--bind-address-hard-fail',
    // One process: the console's tests count failures and ejections exactly (workers.test.ts has the rest).
    '--workers=1',
    ...(options.extraArgs ?? []),
  ];
  const { child, lines, stderr } = spawnNode(args, options.fdLimit);
  const metrics = `http://127.0.0.1:${metricsPort}`;
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((r) => child.once('exit', r));
      child.kill('SIGKILL');
      await exited;
    }
    await pods.close();
    await rm(dir, { recursive: true, force: true });
  };
  const proxyPorts = new Map<string, number>();
  try {
    await waitFor(
      async () => {
        if (child.exitCode !== null) throw new Error(`the proxy exited (${child.exitCode}): ${stderr()}`);
        try {
          const list = (await (await fetch(`${metrics}/debug/services`)).json()) as {
            service: string;
            protocol: string;
            proxyPort: number;
          }[];
          const open = list.filter((s) => s.proxyPort > 0);
          if (open.length < expected) return false;
          for (const s of open) proxyPorts.set(`${s.service}/${s.protocol}`, s.proxyPort);
          return true;
        } catch {
          return false;
        }
      },
      options.startTimeoutMs ?? 20_000,
      `${expected} open service ports`,
    );
  } catch (err) {
    await stop();
    throw new Error(`${(err as Error).message}; stderr: ${stderr()}`);
  }
  return { metrics, proxyPorts, child, lines, stop };
}
