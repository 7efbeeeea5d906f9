// Resource limits on real loopback sockets: the per-service-port TCP connection cap, a connect that finds
// no file descriptor (EMFILE, injected), and the UDP session cap across service ports. And the proxy as
// users run it under `ulimit -n 256`: idle clients of one service must not starve another (the default
// cap is derived from the limit), and running out at accept must be logged and counted.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import dgram from 'node:dgram';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { DEFAULT_OUTLIER_OPTIONS } from '../../src/loadbalancer/outlier.ts';
import { RoundRobinBalancer } from '../../src/loadbalancer/round-robin.ts';
import { FdPressure } from '../../src/relay/fd-pressure.ts';
import type { Connector } from '../../src/relay/tcp.ts';
import { DEFAULT_TCP_OPTIONS, TcpListener } from '../../src/relay/tcp.ts';
import { DEFAULT_UDP_OPTIONS, UdpListener, UdpSessionBudget } from '../../src/relay/udp.ts';
import { ep } from '../helpers/endpoints.ts';
import { service, slice, toYaml } from '../helpers/manifests.ts';
import { log, makeContext } from '../helpers/relay.ts';
import { identityServer, request, tcpServer, udpServer, waitFor } from '../helpers/servers.ts';

type After = { after(fn: () => unknown): void };

/** Opens a connection and resolves once it is established (the proxy may still close it). */
function open(t: After, port: number): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ host: '127.0.0.1', port }, () => resolve(s));
    s.on('error', reject);
    t.after(() => s.destroy());
  });
}

/** Resolves with what the socket received once it closed. */
function closed(s: net.Socket): Promise<string> {
  return new Promise((resolve) => {
    let data = '';
    s.on('data', (c) => (data += c));
    s.on('error', () => {});
    s.on('close', () => resolve(data));
  });
}

test('--max-connections-per-service: past the cap new connections are closed and counted', async (t) => {
  // Holds every connection open and says hello: the cap counts connections, not requests.
  const backend = await tcpServer('127.0.0.11', (s) => s.write('hello'));
  t.after(() => backend.close());
  const context = makeContext([ep(backend.host, backend.port)]);
  const listener = new TcpListener(context, { ...DEFAULT_TCP_OPTIONS, maxConnections: 2 }, { log });
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.destroy());

  const held = [await open(t, listener.port), await open(t, listener.port)];
  await waitFor(() => backend.connections === 2, 2000, 'two relayed connections');
  const third = await open(t, listener.port);
  assert.equal(await closed(third), '', 'the third is closed without reaching an endpoint');
  assert.deepEqual(context.stats.rejected, { limit: 1 });
  assert.equal(backend.connections, 2);
  assert.equal(context.stats.accepted, 2);

  held[0]!.destroy();
  await waitFor(() => context.stats.active === 1, 2000, 'one connection to end');
  const again = await open(t, listener.port);
  await waitFor(() => backend.connections === 3, 2000, 'a free slot used again');
  again.destroy();
});

test('a connect without a file descriptor: client closed, counted fd-exhausted, endpoint not blamed, shed for a moment', async (t) => {
  const backend = await identityServer('127.0.0.11');
  t.after(() => backend.close());
  const endpoint = ep(backend.host, backend.port);
  const balancer = new RoundRobinBalancer(Math.random, {
    ...DEFAULT_OUTLIER_OPTIONS,
    consecutiveFailures: 1,
  });
  balancer.setEndpoints([endpoint, ep('127.0.0.12', backend.port)]);
  const context = { ...makeContext([]), balancer, balancers: { IPv4: balancer, IPv6: balancer } };
  let now = 1_000_000;
  let exhausted = true;
  let dials = 0;
  const connect: Connector = (options) => {
    dials++;
    if (!exhausted) return net.connect(options);
    // What net.connect does when socket() fails: an 'error' on the next tick.
    const s = new net.Socket();
    process.nextTick(() => s.destroy(Object.assign(new Error('connect EMFILE'), { code: 'EMFILE' })));
    return s;
  };
  const fdPressure = new FdPressure(log);
  const listener = new TcpListener(context, DEFAULT_TCP_OPTIONS, {
    log,
    connect,
    now: () => now,
    fdPressure,
  });
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.destroy());

  assert.equal(await request(listener.port), '', 'the client is closed');
  assert.equal(dials, 1, 'no other endpoint tried: it would fail the same way');
  assert.deepEqual(context.stats.connectFailures, { 'fd-exhausted': 1 });
  assert.equal(context.stats.connectFailed, 1);
  assert.deepEqual(balancer.outlier?.ejected(now) ?? [], [], 'the endpoint is not ejected');
  assert.deepEqual(fdPressure.counts, { accept: 0, connect: 1, 'udp-session': 0 });

  // Within the back-off (100 ms) a new connection is closed at once, without a dial.
  exhausted = false;
  now += 50;
  assert.equal(await request(listener.port), '');
  assert.equal(dials, 1);
  assert.deepEqual(context.stats.rejected, { 'fd-exhausted': 1 });

  // After it, descriptors are back: served again.
  now += 100;
  assert.match(await request(listener.port), /^127\.0\.0\.1[12]$/);
  await waitFor(() => context.stats.active === 0, 2000, 'connections to close');
});

test('the UDP session cap across service ports evicts the idlest session, whichever service it has', async (t) => {
  const server = await udpServer('127.0.0.11');
  t.after(() => server.close());
  const budget = new UdpSessionBudget(3);
  let now = 1_000_000;
  const listeners: UdpListener[] = [];
  for (const name of ['default/a:dns', 'default/b:dns']) {
    const context = makeContext([ep(server.host, server.port)], 'UDP', name);
    const l = new UdpListener(context, DEFAULT_UDP_OPTIONS, { log, budget, now: () => now }, 'udp4');
    await l.listen('127.0.0.1', 0);
    t.after(() => l.close());
    listeners.push(l);
  }
  const [a, b] = listeners as [UdpListener, UdpListener];
  const clients: dgram.Socket[] = [];
  const send = async (l: UdpListener) => {
    const c = dgram.createSocket('udp4');
    t.after(() => c.close());
    clients.push(c);
    const reply = new Promise((resolve) => c.once('message', resolve));
    c.bind(0, '127.0.0.1', () => c.send('q', l.port, '127.0.0.1'));
    await reply;
    now += 1; // creation order = idleness here
  };
  await send(a); // the idlest
  await send(b);
  await send(a);
  assert.equal(budget.size, 3);
  await send(b); // over the cap: a's first session goes
  assert.equal(budget.size, 3);
  assert.equal(a.sessions.size, 1);
  assert.equal(b.sessions.size, 2);
  assert.equal(a.context.stats.udpSessionsEvicted, 1);
  assert.equal(budget.evicted, 1);
  // Traffic refreshes a session: the next eviction takes b's first (now the idlest), not a's.
  clients[2]!.send('q', a.port, '127.0.0.1');
  await waitFor(() => server.received >= 5, 2000, 'the refresh to arrive');
  now += 1;
  await send(a);
  assert.equal(b.context.stats.udpSessionsEvicted, 1);
  assert.equal(budget.size, 3);
});

const BIN = fileURLToPath(new URL('../../bin/kube-userspace-proxy.js', import.meta.url));

/** A port free on 127.0.0.1 a moment ago. */
async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const { port } = server.address() as net.AddressInfo;
  await new Promise((r) => server.close(r));
  return port;
}

type Cli = {
  lines: Record<string, unknown>[];
  proxyPort(service: string): number;
  metrics(): Promise<string>;
  alive(): boolean;
  metricsPort: number;
};

/**
 * The CLI under `ulimit -n <fdLimit>` (soft and hard: Node cannot raise it) on a manifest with two
 * services: `idle` (an endpoint here that holds every connection) and `web` (answers `web`).
 */
async function startCli(t: After, fdLimit: number, extraArgs: string[] = []): Promise<Cli> {
  const held: net.Socket[] = [];
  const idleEndpoint = net.createServer((s) => {
    s.on('error', () => {});
    held.push(s);
  });
  await new Promise<void>((r) => idleEndpoint.listen(0, '127.0.0.41', r));
  const web = net.createServer((s) => s.end('web'));
  await new Promise<void>((r) => web.listen(0, '127.0.0.42', r));
  t.after(() => {
    for (const s of held) s.destroy();
    idleEndpoint.close();
    web.close();
  });
  const idlePort = (idleEndpoint.address() as net.AddressInfo).port;
  const webPort = (web.address() as net.AddressInfo).port;
  const dir = await mkdtemp(join(tmpdir(), 'kup-fd-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const manifest = join(dir, 'm.yaml');
  await writeFile(
    manifest,
    toYaml([
      service('idle', '10.96.0.41', [{ name: 'tcp', port: 80, targetPort: idlePort }]),
      slice('idle', 'idle-1', [{ ip: '127.0.0.41' }], [{ name: 'tcp', port: idlePort }]),
      service('web', '10.96.0.42', [{ name: 'http', port: 80, targetPort: webPort }]),
      slice('web', 'web-1', [{ ip: '127.0.0.42' }], [{ name: 'http', port: webPort }]),
    ]),
  );
  const metricsPort = await freePort();
  const args = [
    BIN,
    '--manifest',
    manifest,
    '--no-iptables',
    '--state-file=',
    '--hostname-override=node-1',
    '--bind-address=0.0.0.0',
    '--healthz-bind-address=',
    `--metrics-bind-address=127.0.0.1:${metricsPort}`,
    // One process: descriptors, caps and their log lines are counted per process here.
    '--workers=1',
    ...extraArgs,
  ];
  const child = spawn('sh', ['-c', `ulimit -n ${fdLimit} && exec "$0" "$@"`, process.execPath, ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  t.after(() => child.kill('SIGKILL'));
  let stderr = '';
  child.stderr.on('data', (d) => (stderr = (stderr + String(d)).slice(-4096)));
  const lines: Record<string, unknown>[] = [];
  createInterface({ input: child.stdout }).on('line', (line) => {
    try {
      lines.push(JSON.parse(line) as Record<string, unknown>);
    } catch {
      // Not a log line.
    }
  });
  const alive = () => child.exitCode === null && child.signalCode === null;
  const proxyPort = (name: string) =>
    (lines.find((l) => l.msg === 'Opened service port' && l.service === name)?.proxyPort as number) ?? 0;
  await waitFor(
    () => {
      if (!alive()) throw new Error(`the proxy exited: ${stderr}`);
      return proxyPort('default/idle:tcp/TCP') > 0 && proxyPort('default/web:http/TCP') > 0;
    },
    20_000,
    'the proxy to open both services',
  );
  const metrics = async () => {
    const res = await fetch(`http://127.0.0.1:${metricsPort}/metrics`);
    return res.text();
  };
  return { lines, proxyPort, metrics, alive, metricsPort };
}

/** Opens `n` connections to `port` and leaves them idle (the proxy may close those it cannot take). */
async function idleClients(t: After, port: number, n: number): Promise<net.Socket[]> {
  const sockets: net.Socket[] = [];
  t.after(() => {
    for (const s of sockets) s.destroy();
  });
  for (let i = 0; i < n; i++) {
    const s = net.connect({ host: '127.0.0.1', port });
    s.on('error', () => {});
    sockets.push(s);
    await new Promise((r) => {
      s.once('connect', r);
      s.once('close', r);
    });
  }
  return sockets;
}

test('ulimit -n 256: 300 idle clients of one service do not starve another (default cap: an eighth of the limit)', async (t) => {
  const cli = await startCli(t, 256);
  const log = cli.lines.find((l) => l.msg === 'File descriptor limit');
  assert.equal(log?.maxConnectionsPerService, 64, 'the cap derived from the limit: max(64, 256 / 8)');
  await idleClients(t, cli.proxyPort('default/idle:tcp/TCP'), 300);
  // Hostile: 300 idle connections on one service; the other must still answer, every time.
  for (let i = 0; i < 20; i++) assert.equal(await request(cli.proxyPort('default/web:http/TCP')), 'web');
  const metrics = await cli.metrics();
  const rejected =
    /kup_service_connections_rejected_total\{service="default\/idle:tcp",protocol="TCP",reason="limit"\} (\d+)/.exec(
      metrics,
    );
  assert.ok(
    Number(rejected?.[1]) >= 200,
    `idle's clients past the cap are closed and counted: ${rejected?.[0]}`,
  );
  assert.ok(cli.alive());
});

test('ulimit -n 256 and no cap: out of descriptors at accept is logged and counted, and it recovers', async (t) => {
  const cli = await startCli(t, 256, ['--max-connections-per-service=0']);
  const clients = await idleClients(t, cli.proxyPort('default/idle:tcp/TCP'), 300);
  // Each relayed pair holds two descriptors, and a client whose connect finds none is closed again: so
  // whether the last descriptor stays free depends on the parity of what the process held at start.
  // A silent connection to /metrics holds one (until the 5 s header timeout): one more every 0.5 s, so
  // whenever the backlog of idle clients settles, one takes the last descriptor.
  let polls = 0;
  // libuv closes what it cannot accept without telling Node: only the probe sees it.
  await waitFor(
    async () => {
      if (polls++ % 50 === 0) clients.push(...(await idleClients(t, cli.metricsPort, 1)));
      return cli.lines.some(
        (l) =>
          l.msg === 'Out of file descriptors, shedding new connections' &&
          ((l.counts as Record<string, number> | undefined)?.accept ?? 0) > 0,
      );
    },
    15_000,
    'a log line that counts accepts without a descriptor',
  ).catch((err: Error) => {
    const said = cli.lines.filter((l) => /descriptor/.test(String(l.msg)));
    throw new Error(`${err.message}; the proxy said: ${JSON.stringify(said)}`);
  });
  for (const s of clients) s.destroy();
  // Descriptors come back: the other service and /metrics answer again.
  await waitFor(
    async () => (await request(cli.proxyPort('default/web:http/TCP')).catch(() => '')) === 'web',
    10_000,
    'web to answer again',
  );
  const metrics = await cli.metrics();
  const accept = /kup_fd_exhausted_total\{operation="accept"\} (\d+)/.exec(metrics);
  assert.ok(Number(accept?.[1]) >= 1, `counted: ${accept?.[0]}`);
  assert.ok(cli.alive());
});
