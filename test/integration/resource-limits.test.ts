// Resource limits on real loopback sockets: the per-service-port TCP connection cap, a connect that finds
// no file descriptor (EMFILE, injected), and the UDP session cap across service ports.
import assert from 'node:assert/strict';
import dgram from 'node:dgram';
import net from 'node:net';
import { test } from 'node:test';
import { DEFAULT_OUTLIER_OPTIONS } from '../../src/loadbalancer/outlier.ts';
import { RoundRobinBalancer } from '../../src/loadbalancer/round-robin.ts';
import { FdPressure } from '../../src/relay/fd-pressure.ts';
import type { Connector } from '../../src/relay/tcp.ts';
import { DEFAULT_TCP_OPTIONS, TcpListener } from '../../src/relay/tcp.ts';
import { DEFAULT_UDP_OPTIONS, UdpListener, UdpSessionBudget } from '../../src/relay/udp.ts';
import { ep } from '../helpers/endpoints.ts';
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
  assert.deepEqual(balancer.outlier!.ejected(now), [], 'the endpoint is not ejected');
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
