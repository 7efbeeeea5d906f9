// The TCP relay on real loopback sockets: distinct 127.0.0.x addresses stand for distinct clients and
// endpoints.
import assert from 'node:assert/strict';
import net from 'node:net';
import { test } from 'node:test';
import type { ConnectionInfo, ConnectionObserver } from '../../src/relay/observer.ts';
import type { TcpRelayOptions } from '../../src/relay/tcp.ts';
import { DEFAULT_TCP_OPTIONS, TcpListener } from '../../src/relay/tcp.ts';
import { ep } from '../helpers/endpoints.ts';
import { contextFor, log, makeContext, makeDualStackContext } from '../helpers/relay.ts';
import { identityServer, request, tcpServer, waitFor } from '../helpers/servers.ts';

async function proxy(
  t: { after(fn: () => unknown): void },
  endpoints: ReturnType<typeof ep>[],
  options: Partial<TcpRelayOptions> = {},
  deps: Partial<ConstructorParameters<typeof TcpListener>[2]> = {},
) {
  const context = makeContext(endpoints);
  const listener = new TcpListener(context, { ...DEFAULT_TCP_OPTIONS, ...options }, { log, ...deps });
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.destroy());
  return { listener, context };
}

async function servers(t: { after(fn: () => unknown): void }, hosts: string[]) {
  const list = await Promise.all(hosts.map((h) => identityServer(h)));
  t.after(() => Promise.all(list.map((s) => s.close())));
  return list;
}

test('round robin spreads 300 connections evenly over 3 endpoints', async (t) => {
  const backends = await servers(t, ['127.0.0.11', '127.0.0.12', '127.0.0.13']);
  const { listener, context } = await proxy(
    t,
    backends.map((s) => ep(s.host, s.port)),
  );
  const seen = new Map<string, number>();
  for (let i = 0; i < 300; i++) {
    const who = await request(listener.port);
    seen.set(who, (seen.get(who) ?? 0) + 1);
  }
  assert.deepEqual([...seen.values()], [100, 100, 100]);
  assert.equal(context.stats.accepted, 300);
  await waitFor(() => context.stats.active === 0, 2000, 'connections to close');
});

test('ClientIP affinity: each client stays on its endpoint across many connections, then expires', async (t) => {
  const backends = await servers(t, ['127.0.0.11', '127.0.0.12', '127.0.0.13']);
  let now = 1_000_000;
  const { listener, context } = await proxy(
    t,
    backends.map((s) => ep(s.host, s.port)),
    {},
    { now: () => now },
  );
  context.balancer.setAffinity('ClientIP', 10);
  const clients = ['127.0.0.21', '127.0.0.22', '127.0.0.23', '127.0.0.24'];
  const first = new Map<string, string>();
  for (let round = 0; round < 10; round++) {
    for (const c of clients) {
      const who = await request(listener.port, { localAddress: c });
      if (!first.has(c)) first.set(c, who);
      assert.equal(who, first.get(c), `client ${c} moved in round ${round}`);
    }
  }
  assert.ok(new Set(first.values()).size >= 3, 'clients spread over the endpoints');
  // 10 s without use: the entry expires and the next connection is a fresh round-robin pick.
  now += 10_000;
  const moved = await Promise.all(
    [0, 1, 2].map(async () => {
      const c = clients[0]!;
      const who = await request(listener.port, { localAddress: c });
      now += 10_000;
      return who;
    }),
  );
  assert.ok(
    moved.some((w) => w !== first.get(clients[0]!)),
    'expired affinity picks again',
  );
});

test('affinity is reset when its endpoint is removed, and when it refuses', async (t) => {
  const backends = await servers(t, ['127.0.0.11', '127.0.0.12', '127.0.0.13']);
  const endpoints = backends.map((s) => ep(s.host, s.port));
  const { listener, context } = await proxy(t, endpoints);
  context.balancer.setAffinity('ClientIP', 10800);
  const client = '127.0.0.31';
  const sticky = await request(listener.port, { localAddress: client });
  // Removed from the endpoint list: the client moves and sticks to its new endpoint.
  context.balancer.setEndpoints(endpoints.filter((e) => e.ip !== sticky));
  const second = await request(listener.port, { localAddress: client });
  assert.notEqual(second, sticky);
  assert.equal(await request(listener.port, { localAddress: client }), second);
  // Its endpoint now refuses: the connect fails, affinity resets, the client lands elsewhere.
  await backends.find((b) => b.host === second)!.close();
  const third = await request(listener.port, { localAddress: client });
  assert.notEqual(third, second);
  assert.ok(third.startsWith('127.0.0.1'));
  assert.equal(await request(listener.port, { localAddress: client }), third);
  assert.ok((context.stats.connectFailures['refused'] ?? 0) >= 1);
});

test('a refused connect goes to the next endpoint: 100 of 100 requests succeed with 1 of 3 refusing', async (t) => {
  const backends = await servers(t, ['127.0.0.11', '127.0.0.12']);
  // A port nothing listens on: connects are refused.
  const dead = await identityServer('127.0.0.13');
  const deadPort = dead.port;
  await dead.close();
  const { listener, context } = await proxy(t, [
    ...backends.map((s) => ep(s.host, s.port)),
    ep('127.0.0.13', deadPort),
  ]);
  for (let i = 0; i < 100; i++) {
    const who = await request(listener.port);
    assert.ok(who === '127.0.0.11' || who === '127.0.0.12', `request ${i} got "${who}"`);
  }
  assert.ok((context.stats.connectFailures['refused'] ?? 0) >= 30);
  assert.equal(context.stats.connectFailed, 0);
});

test('a hanging endpoint costs one connect timeout and does not delay other clients', async (t) => {
  const [good] = await servers(t, ['127.0.0.11']);
  const hanging = ep('127.0.0.99', 9);
  // The connector never completes the connect for the hanging endpoint (a blackhole).
  const connect = (options: net.TcpNetConnectOpts) =>
    options.host === hanging.ip ? new net.Socket() : net.connect(options);
  const { listener, context } = await proxy(
    t,
    [hanging, ep(good!.host, good!.port)],
    { connectTimeoutsMs: [300, 300] },
    { connect },
  );
  const started = Date.now();
  const results: Promise<{ who: string; ms: number }>[] = [];
  for (let i = 0; i < 4; i++) {
    results.push(request(listener.port).then((who) => ({ who, ms: Date.now() - started })));
  }
  const done = await Promise.all(results);
  for (const r of done) assert.equal(r.who, '127.0.0.11');
  const fast = done.filter((r) => r.ms < 250);
  const slow = done.filter((r) => r.ms >= 250);
  // Two of four picks hit the hanging endpoint first and paid one timeout; the others were not held up.
  assert.equal(slow.length, 2, `timings ${done.map((r) => r.ms)}`);
  assert.equal(fast.length, 2, `timings ${done.map((r) => r.ms)}`);
  for (const r of slow) assert.ok(r.ms < 300 + 250, `slow one took ${r.ms} ms`);
  assert.equal(context.stats.connectFailures['timeout'], 2);
});

test('no endpoints: the connection is reset at once (ECONNRESET, not a clean end) and counted', async (t) => {
  const { listener, context } = await proxy(t, []);
  const started = Date.now();
  const outcome = await new Promise<string>((resolve) => {
    const socket = net.connect({ host: '127.0.0.1', port: listener.port });
    socket.on('error', (err: NodeJS.ErrnoException) => resolve(`error:${err.code}`));
    socket.on('end', () => resolve('clean end'));
    socket.resume();
    socket.write('hello');
  });
  // kube-proxy REJECTs; the nearest a listener can do is an RST, never an empty clean response.
  assert.equal(outcome, 'error:ECONNRESET');
  assert.ok(Date.now() - started < 1000);
  assert.equal(context.stats.noEndpoints, 1);
  await waitFor(() => context.stats.active === 0, 1000, 'the connection to be accounted');
});

test('dual-stack: an IPv4 client goes to the IPv4 endpoints, an IPv6 client to the IPv6 ones', async (t) => {
  const v4 = await identityServer('127.0.0.11', 'v4');
  t.after(() => v4.close());
  let v6: Awaited<ReturnType<typeof identityServer>> | undefined;
  try {
    v6 = await identityServer('::1', 'v6');
    t.after(() => v6!.close());
  } catch {
    // No ::1 here (IPv6 disabled): only the IPv4 half can be checked.
  }
  const context = makeDualStackContext({
    IPv4: [ep(v4.host, v4.port)],
    IPv6: v6 === undefined ? [] : [ep('::1', v6.port)],
  });
  const listener = new TcpListener(context, DEFAULT_TCP_OPTIONS, { log });
  await listener.listen(v6 === undefined ? '0.0.0.0' : '::', 0);
  t.after(() => listener.destroy());
  // On `::` the IPv4 client is seen as ::ffff:127.0.0.1: still IPv4.
  for (let i = 0; i < 5; i++) assert.equal(await request(listener.port), 'v4');
  assert.deepEqual([...context.stats.picks.keys()], [`127.0.0.11:${v4.port}`]);
  if (v6 === undefined) {
    t.skip('::1 is not available: the IPv6 half is not checked');
    return;
  }
  for (let i = 0; i < 5; i++) assert.equal(await request(listener.port, { host: '::1' }), 'v6');
  assert.equal(context.stats.picks.get(`[::1]:${v6.port}`), 5);
});

test('half-close: a client that shuts down its write side still receives the whole response', async (t) => {
  // The endpoint answers only after the client's FIN, then sends 1 MiB and closes.
  const big = Buffer.alloc(1 << 20, 'x');
  const server = await tcpServer(
    '127.0.0.11',
    (socket) => {
      let got = 0;
      socket.on('data', (c) => {
        got += c.length;
      });
      socket.on('end', () => {
        socket.write(`got ${got}\n`);
        socket.end(big);
      });
    },
    { allowHalfOpen: true },
  );
  t.after(() => server.close());
  const { listener, context } = await proxy(t, [ep(server.host, server.port)]);
  const reply = await request(listener.port, { send: 'x'.repeat(100_000) });
  assert.ok(reply.startsWith('got 100000\n'));
  assert.equal(reply.length, 'got 100000\n'.length + big.length);
  await waitFor(() => context.stats.active === 0, 2000, 'both sockets closed');
});

test('backpressure: a slow reader does not make the proxy buffer without bound', async (t) => {
  const total = 64 << 20;
  let pushed = 0;
  const server = await tcpServer('127.0.0.11', (socket) => {
    const chunk = Buffer.alloc(64 * 1024, 'y');
    const pump = () => {
      while (pushed < total) {
        pushed += chunk.length;
        if (!socket.write(chunk)) {
          socket.once('drain', pump);
          return;
        }
      }
      socket.end();
    };
    pump();
  });
  t.after(() => server.close());
  const { listener } = await proxy(t, [ep(server.host, server.port)]);
  const client = net.connect({ host: '127.0.0.1', port: listener.port });
  t.after(() => client.destroy());
  client.pause();
  await new Promise((r) => client.once('connect', r));
  await new Promise((r) => setTimeout(r, 500));
  const conn = [...listener.connections][0]!;
  // After the hand-over to the native relay (tcp-offload.ts) Node holds no socket: at most one read waits.
  const buffered = (conn.clientSocket?.writableLength ?? 0) + (conn.upstream?.readableLength ?? 0);
  assert.ok(pushed < total / 2, `the endpoint was held back (pushed ${pushed} of ${total})`);
  assert.ok(buffered < 1 << 20, `proxy buffers ${buffered} bytes`);
  // Reading resumes the flow and every byte arrives.
  let received = 0;
  client.on('data', (c: Buffer) => {
    received += c.length;
  });
  client.resume();
  await new Promise((r) => client.once('end', r));
  assert.equal(received, total);
});

test('an endpoint reset mid-transfer ends the client connection; the listener keeps serving', async (t) => {
  const server = await tcpServer('127.0.0.11', (socket) => {
    socket.write('partial');
    setTimeout(() => socket.resetAndDestroy(), 50);
  });
  const other = await identityServer('127.0.0.12', 'ok');
  t.after(() => Promise.all([server.close(), other.close()]));
  const closed: ConnectionInfo[] = [];
  const { listener, context } = await proxy(t, [ep(server.host, server.port)]);
  const observer: ConnectionObserver = { opened() {}, closed: (c) => closed.push(c), wantsData: false };
  context.observer = observer;
  const got = await request(listener.port, { send: 'hi' }).catch(
    (e: NodeJS.ErrnoException) => `error:${e.code}`,
  );
  assert.ok(got === 'partial' || got === 'error:ECONNRESET', `got ${got}`);
  await waitFor(() => closed.length === 1, 2000, 'close to be observed');
  assert.equal(closed[0]!.closeReason, 'endpoint-reset');
  context.balancer.setEndpoints([ep(other.host, other.port)]);
  assert.equal(await request(listener.port), 'ok');
});

test('existing connections keep running after the listener closes (service removed)', async (t) => {
  const server = await tcpServer('127.0.0.11', (socket) => socket.pipe(socket), { allowHalfOpen: true });
  t.after(() => server.close());
  const { listener } = await proxy(t, [ep(server.host, server.port)]);
  const client = net.connect({ host: '127.0.0.1', port: listener.port });
  t.after(() => client.destroy());
  await new Promise((r) => client.once('connect', r));
  client.write('one');
  await new Promise((r) => client.once('data', r));
  await listener.close();
  // New connections are refused...
  await assert.rejects(request(listener.port), /ECONNREFUSED/);
  // ...the established one still relays.
  client.write('two');
  const echoed = await new Promise<Buffer>((r) => client.once('data', r));
  assert.equal(echoed.toString(), 'two');
});

test('observer sees open and close with byte counts and the close reason', async (t) => {
  const server = await identityServer('127.0.0.11', 'hello world');
  t.after(() => server.close());
  const { listener, context } = await proxy(t, [ep(server.host, server.port)]);
  const events: string[] = [];
  let last: ConnectionInfo | undefined;
  context.observer = {
    opened: (c) => events.push(`open ${c.endpoint?.key}`),
    clientData: (_c, chunk) => events.push(`client ${chunk.length}`) > 0,
    endpointData: (_c, chunk) => events.push(`endpoint ${chunk.length}`) > 0,
    closed: (c) => {
      events.push('closed');
      last = c;
    },
    wantsData: true,
  };
  assert.equal(await request(listener.port, { send: 'ping' }), 'hello world');
  await waitFor(() => last !== undefined, 2000, 'close');
  assert.equal(events[0], `open 127.0.0.11:${server.port}`);
  assert.ok(events.includes('client 4'));
  assert.ok(events.includes('endpoint 11'));
  assert.equal(last!.bytesFromClient, 4);
  assert.equal(last!.bytesToClient, 11);
  assert.ok(last!.closeReason === 'endpoint-fin' || last!.closeReason === 'client-fin');
  assert.equal(context.stats.bytesToClients, 11);
});

test('outlier ejection: a refusing endpoint is skipped after 3 failures and returns after it recovers', async (t) => {
  const backends = await servers(t, ['127.0.0.11', '127.0.0.12']);
  const dead = await identityServer('127.0.0.13');
  const deadPort = dead.port;
  await dead.close();
  let now = 1_000_000;
  const { RoundRobinBalancer } = await import('../../src/loadbalancer/round-robin.ts');
  const balancer = new RoundRobinBalancer(Math.random, {
    consecutiveFailures: 3,
    baseEjectionMs: 5000,
    maxEjectionMs: 60_000,
    maxEjectionPercent: 50,
  });
  balancer.setEndpoints([...backends.map((s) => ep(s.host, s.port)), ep('127.0.0.13', deadPort)]);
  const listener = new TcpListener(contextFor(balancer), DEFAULT_TCP_OPTIONS, { log, now: () => now });
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.destroy());
  const stats = listener.context.stats;
  for (let i = 0; i < 30; i++) assert.match(await request(listener.port), /^127\.0\.0\.1[12]$/);
  assert.equal(stats.connectFailures['refused'], 3, 'three refusals, then the endpoint is skipped');
  assert.equal(stats.ejections, 1);
  // It comes back to life on the same address; once the ejection time is over it gets traffic again.
  const revived = net.createServer((s) => s.end('127.0.0.13'));
  await new Promise<void>((resolve) =>
    revived.listen({ host: '127.0.0.13', port: deadPort }, () => resolve()),
  );
  t.after(() => new Promise((r) => revived.close(r)));
  const before = new Set<string>();
  for (let i = 0; i < 9; i++) before.add(await request(listener.port));
  assert.ok(!before.has('127.0.0.13'), 'still ejected');
  now += 5000;
  const seen = new Set<string>();
  for (let i = 0; i < 9; i++) seen.add(await request(listener.port));
  assert.ok(seen.has('127.0.0.13'), 'back after the ejection time');
  assert.equal(balancer.outlier!.ejectedCount, 0);
});

test('drained() resolves when the last connection of a closed listener ends, not before', async (t) => {
  const echo = await tcpServer('127.0.0.11', (s) => s.pipe(s), { allowHalfOpen: true });
  t.after(() => echo.close());
  const { listener } = await proxy(t, [ep('127.0.0.11', echo.port)]);
  const soon = new Promise((r) => setTimeout(() => r('pending'), 50));
  assert.equal(await Promise.race([listener.drained().then(() => 'drained'), soon]), 'drained');
  const client = net.connect({ host: '127.0.0.1', port: listener.port });
  t.after(() => client.destroy());
  await new Promise<void>((r) => client.once('connect', () => r()));
  client.write('x');
  await new Promise((r) => client.once('data', r));
  await listener.close();
  let drained = false;
  const waiting = listener.drained().then(() => (drained = true));
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(drained, false, 'a connection is still open');
  client.end();
  await waiting;
  assert.equal(listener.connections.size, 0);
});

test('TCP: a half-close timeout is reported as such when an idle timeout is also set', async (t) => {
  // The endpoint reads but never answers nor closes: the client's FIN leaves the connection half-closed.
  const server = await tcpServer('127.0.0.11', (s) => s.resume(), { allowHalfOpen: true });
  t.after(() => server.close());
  const context = makeContext([ep(server.host, server.port)]);
  const closed: ConnectionInfo[] = [];
  context.observer = { opened() {}, closed: (c) => closed.push(c), wantsData: false };
  const listener = new TcpListener(
    context,
    { ...DEFAULT_TCP_OPTIONS, idleTimeoutMs: 10_000, halfCloseTimeoutMs: 200 },
    { log },
  );
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.destroy());
  const client = net.connect({ host: '127.0.0.1', port: listener.port, allowHalfOpen: true });
  client.on('error', () => {});
  t.after(() => client.destroy());
  await waitFor(() => context.stats.active === 1 && context.stats.picks.size === 1, 2000, 'the connection');
  await waitFor(() => [...listener.connections][0]?.state === 1, 2000, 'the upstream connect');
  client.end('request');
  await waitFor(() => closed.length === 1, 3000, 'the half-close timeout');
  assert.equal(closed[0]!.closeReason, 'half-close-timeout');
  assert.equal(context.stats.active, 0);
});
