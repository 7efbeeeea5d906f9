// The proxy as users run it (the bin, a manifest, --no-iptables) in a child process, with every HTTP
// surface on a known loopback port: the health server, the metrics server and one health check node port
// (a LoadBalancer Service with externalTrafficPolicy Local and a local endpoint). For tests that send
// hostile input and then ask whether the process lives. Plus raw HTTP exchanges on a socket.
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { toYaml } from './manifests.ts';
import { type TestServer, tcpServer, waitFor } from './servers.ts';

const BIN = fileURLToPath(new URL('../../bin/kube-userspace-proxy.js', import.meta.url));

/**
 * Node running `args` (under `ulimit -n fdLimit` when given), its JSON log lines as they come and the
 * last 8 KiB of its stderr.
 */
export function spawnNode(
  args: string[],
  fdLimit?: number,
): { child: ChildProcess; lines: Record<string, unknown>[]; stderr(): string } {
  const child =
    fdLimit === undefined
      ? spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'pipe'] })
      : spawn('sh', ['-c', `ulimit -n ${fdLimit} && exec "$0" "$@"`, process.execPath, ...args], {
          stdio: ['ignore', 'pipe', 'pipe'],
        });
  const lines: Record<string, unknown>[] = [];
  let stderr = '';
  child.stderr!.on('data', (d) => {
    stderr = (stderr + String(d)).slice(-8192);
  });
  createInterface({ input: child.stdout! }).on('line', (line) => {
    try {
      lines.push(JSON.parse(line) as Record<string, unknown>);
    } catch {
      // Not a log line.
    }
  });
  return { child, lines, stderr: () => stderr };
}

/** A port that was free on 127.0.0.1 a moment ago. */
export async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

export type ProxyProcess = {
  readonly child: ChildProcess;
  readonly ports: { health: number; metrics: number; healthCheck: number; proxy: number };
  /** The proxy's JSON log lines so far. */
  readonly lines: Record<string, unknown>[];
  /** Its stderr (the last 8 KiB): where a crash's stack goes. */
  stderr(): string;
  /** True while the process runs. */
  alive(): boolean;
  /** Open file descriptors of the process now. */
  openFds(): Promise<number>;
  stop(): Promise<void>;
};

export type ProxyProcessOptions = {
  /** `ulimit -n` for the process (soft and hard). */
  fdLimit?: number;
  extraArgs?: string[];
};

/**
 * Starts the proxy and waits until all three servers answer and the service port is open. The ports are
 * picked free a moment before the proxy binds them; another process may take one meanwhile, so a start
 * that could not bind all three is retried on new ports (twice).
 */
export async function startProxyProcess(options: ProxyProcessOptions = {}): Promise<ProxyProcess> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await startOnce(options);
    } catch (err) {
      if (!(err instanceof PortTaken) || attempt >= 3) throw err;
    }
  }
}

/** One of the picked ports was taken before the proxy bound it. */
class PortTaken extends Error {}

async function startOnce(options: ProxyProcessOptions): Promise<ProxyProcess> {
  const backend: TestServer = await tcpServer('127.0.0.1', (s) => s.end('pod'));
  const [health, metrics, healthCheck] = [await freePort(), await freePort(), await freePort()];
  const dir = await mkdtemp(join(tmpdir(), 'kup-proc-'));
  const manifest = join(dir, 'm.yaml');
  await writeFile(
    manifest,
    toYaml([
      {
        apiVersion: 'v1',
        kind: 'Service',
        metadata: { name: 'lb', namespace: 'default' },
        spec: {
          type: 'LoadBalancer',
          clusterIP: '10.96.0.7',
          clusterIPs: ['10.96.0.7'],
          externalTrafficPolicy: 'Local',
          healthCheckNodePort: healthCheck,
          ports: [{ name: 'http', protocol: 'TCP', port: 80, targetPort: backend.port }],
        },
      },
      {
        apiVersion: 'discovery.k8s.io/v1',
        kind: 'EndpointSlice',
        metadata: { name: 'lb-1', namespace: 'default', labels: { 'kubernetes.io/service-name': 'lb' } },
        addressType: 'IPv4',
        ports: [{ name: 'http', protocol: 'TCP', port: backend.port }],
        endpoints: [{ addresses: ['127.0.0.1'], nodeName: 'node-1', conditions: { ready: true } }],
      },
    ]),
  );
  const args = [
    BIN,
    '--manifest',
    manifest,
    '--no-iptables',
    '--state-file=',
    '--hostname-override=node-1',
    '--bind-address=0.0.0.0',
    `--healthz-bind-address=127.0.0.1:${health}`,
    `--metrics-bind-address=127.0.0.1:${metrics}`,
    // A health or metrics port someone took meanwhile ends the start (retried), never a stranger answering.
    '--bind-address-hard-fail',
    // Under a descriptor limit the tests count the process's own descriptors: one process.
    ...(options.fdLimit === undefined ? [] : ['--workers=1']),
    ...(options.extraArgs ?? []),
  ];
  const { child, lines, stderr } = spawnNode(args, options.fdLimit);
  const alive = () => child.exitCode === null && child.signalCode === null;
  const stop = async () => {
    if (alive()) {
      const exited = new Promise((r) => child.once('exit', r));
      child.kill('SIGKILL');
      await exited;
    }
    await backend.close();
    await rm(dir, { recursive: true, force: true });
  };
  try {
    let proxy = 0;
    await waitFor(
      async () => {
        if (!alive()) {
          const listen = lines.some(
            (l) => (l.err as { code?: string } | undefined)?.code === 'KUP_ERR_LISTEN',
          );
          throw new (listen ? PortTaken : Error)(`the proxy exited (${child.exitCode}): ${stderr()}`);
        }
        // The health check node port is the service health server's: one it could not bind is logged.
        if (lines.some((l) => /EADDRINUSE/.test(JSON.stringify(l)))) throw new PortTaken('a port was taken');
        const opened = lines.find((l) => typeof l.proxyPort === 'number' && l.proxyPort > 0);
        if (opened !== undefined) proxy = opened.proxyPort as number;
        const up = await Promise.all([health, metrics, healthCheck].map((p) => answers(p)));
        return proxy > 0 && up.every(Boolean);
      },
      20_000,
      'the proxy process and its servers',
    );
    return {
      child,
      ports: { health, metrics, healthCheck, proxy },
      lines,
      stderr,
      alive,
      openFds: async () => (await readdir(`/proc/${child.pid}/fd`)).length,
      stop,
    };
  } catch (err) {
    await stop();
    if (err instanceof PortTaken) throw err;
    const last = lines.slice(-5).map((l) => JSON.stringify(l));
    throw new Error(`${(err as Error).message}; stderr: ${stderr()}; last log lines: ${last.join('\n')}`);
  }
}

/** True when a GET / on `port` gets any HTTP answer. */
async function answers(port: number): Promise<boolean> {
  const reply = await exchange(port, 'GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
  return reply.status > 0;
}

export type Reply = {
  /** The first response's status; 0 when none came. */
  status: number;
  /** Everything received. */
  text: string;
  /** The server closed the connection (else we did, after `idleMs` without data). */
  closedByServer: boolean;
};

export type ExchangeOptions = {
  /** Send the request in these pieces, `delayMs` apart (a slow sender). */
  pieces?: number;
  delayMs?: number;
  /** Give up waiting after this long without data. */
  idleMs?: number;
  /** The client address (127.0.0.0/8). */
  localAddress?: string;
};

/** Sends raw bytes to 127.0.0.1:`port` and collects what comes back until close or silence. */
export function exchange(
  port: number,
  request: string | Buffer,
  options: ExchangeOptions = {},
): Promise<Reply> {
  const { pieces = 1, delayMs = 0, idleMs = 1000, localAddress } = options;
  const bytes = typeof request === 'string' ? Buffer.from(request, 'latin1') : request;
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let closedByServer = true;
    let idle: NodeJS.Timeout | undefined;
    const timers: NodeJS.Timeout[] = [];
    const socket = net.connect({ host: '127.0.0.1', port, localAddress });
    const touch = () => {
      clearTimeout(idle);
      idle = setTimeout(() => {
        closedByServer = false;
        socket.destroy();
      }, idleMs);
    };
    socket.on('connect', () => {
      const size = Math.ceil(bytes.length / pieces) || 1;
      for (let i = 0, at = 0; at < bytes.length; i++, at += size) {
        const piece = bytes.subarray(at, at + size);
        timers.push(
          setTimeout(() => {
            if (!socket.destroyed) socket.write(piece);
          }, i * delayMs),
        );
      }
      touch();
    });
    socket.on('data', (d) => {
      chunks.push(d);
      touch();
    });
    socket.on('error', () => {});
    socket.on('close', () => {
      clearTimeout(idle);
      for (const t of timers) clearTimeout(t);
      const text = Buffer.concat(chunks).toString('latin1');
      const m = /^HTTP\/1\.[01] (\d{3})/.exec(text);
      resolve({ status: m ? Number(m[1]) : 0, text, closedByServer });
    });
    touch();
  });
}

/** GET `path` over a fresh connection: the status, 0 for none. */
export async function get(port: number, path: string, localAddress?: string): Promise<number> {
  const reply = await exchange(port, `GET ${path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`, {
    localAddress,
    idleMs: 2000,
  });
  return reply.status;
}
