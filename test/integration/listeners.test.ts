// The listening sockets of the relays, idle: their handlers are shared by every listener of the process,
// listen() leaves nothing behind once settled, and a failed bind still rejects (and only that).
import assert from 'node:assert/strict';
import net from 'node:net';
import { test } from 'node:test';
import { FdPressure } from '../../src/relay/fd-pressure.ts';
import { KeepAliveSweeper } from '../../src/relay/keepalive.ts';
import { OwnTraffic } from '../../src/relay/own-traffic.ts';
import { IDLE_STATS, type ServicePortContext } from '../../src/relay/service-context.ts';
import { DEFAULT_TCP_OPTIONS, TcpListener } from '../../src/relay/tcp.ts';
import { DEFAULT_UDP_OPTIONS, UdpListener } from '../../src/relay/udp.ts';
import { collectGarbage, liveObjects, medianOf } from '../helpers/heap.ts';
import { log, makeContext } from '../helpers/relay.ts';

const EVENTS = ['connection', 'listening', 'error'] as const;

/** Binds `l` on loopback; the promise listen() returned, held weakly (no frame of ours keeps it). */
async function listenWeakly(l: { listen(host: string, port: number): Promise<void> }) {
  const p = l.listen('127.0.0.1', 0);
  const ref = new WeakRef(p);
  await p;
  return ref;
}

test('TCP: every listener has the same handlers, its settled listen() is let go, a failed bind rejects', async (t) => {
  const keepAlive = new KeepAliveSweeper();
  const listeners = [0, 1, 2].map(
    // The net.Server's (tcpAccept: null; the native listener has no handlers: tcp-accept.test.ts).
    () =>
      new TcpListener(makeContext([]), DEFAULT_TCP_OPTIONS, {
        log,
        keepAlive,
        tcpFin: null,
        tcpAccept: null,
      }),
  );
  t.after(() => {
    for (const l of listeners) l.destroy();
  });
  const [a, b, c] = listeners as [TcpListener, TcpListener, TcpListener];
  const settled = await listenWeakly(a);
  await b.listen('127.0.0.1', 0);
  assert.ok(a.port > 0 && b.port > 0 && a.server !== undefined && b.server !== undefined);
  for (const event of EVENTS) {
    assert.equal(a.server.listenerCount(event), 1, event);
    assert.equal(a.server.listeners(event)[0], b.server.listeners(event)[0], `one shared ${event} handler`);
  }
  await assert.rejects(c.listen('127.0.0.1', a.port), { code: 'EADDRINUSE' });
  // After a failed bind, an error is logged, not thrown (no listener would make it an uncaught one).
  c.server?.emit('error', Object.assign(new Error('late'), { code: 'EPROTO' }));
  await collectGarbage();
  assert.equal(settled.deref(), undefined, "nothing keeps listen()'s promise once it resolved");
});

test('UDP: every listener has the same handlers, its settled listen() is let go, a failed bind rejects', async (t) => {
  const listeners = [0, 1, 2].map(
    () => new UdpListener(makeContext([], 'UDP'), DEFAULT_UDP_OPTIONS, { log }, 'udp4'),
  );
  t.after(() => {
    for (const l of listeners) l.destroy();
  });
  const [a, b, c] = listeners as [UdpListener, UdpListener, UdpListener];
  const settled = await listenWeakly(a);
  await b.listen('127.0.0.1', 0);
  assert.ok(a.port > 0 && b.port > 0);
  for (const event of ['message', 'listening', 'error'] as const) {
    assert.equal(a.socket.listenerCount(event), 1, event);
    assert.equal(a.socket.listeners(event)[0], b.socket.listeners(event)[0], `one shared ${event} handler`);
  }
  await assert.rejects(c.listen('127.0.0.1', a.port), { code: 'EADDRINUSE' });
  await collectGarbage();
  assert.equal(settled.deref(), undefined, "nothing keeps listen()'s promise once it resolved");
});

test('TCP: an idle listener holds no set of connections; its first connection gets it one', async (t) => {
  // What the process shares: the sweeper and the table of our own connections.
  const keepAlive = new KeepAliveSweeper();
  const ownTraffic = new OwnTraffic();
  await collectGarbage();
  const sets = liveObjects(Set);
  const listeners = Array.from(
    { length: 50 },
    () => new TcpListener(makeContext([]), DEFAULT_TCP_OPTIONS, { log, keepAlive, ownTraffic, tcpFin: null }),
  );
  t.after(() => {
    for (const l of listeners) l.destroy();
  });
  for (const l of listeners) await l.listen('127.0.0.1', 0);
  assert.ok(liveObjects(Set) - sets < 5, `${liveObjects(Set) - sets} Sets for 50 idle listeners`);
  const [a, b] = listeners as [TcpListener, TcpListener];
  assert.equal(a.connections.size, 0);
  await a.drained();
  // A connection (no endpoint: closed at once) is tracked in a set of a's own, and leaves it empty.
  const client = net.connect(a.port, '127.0.0.1');
  client.on('error', () => {}); // reset: nothing to connect to
  await new Promise((resolve) => client.once('close', resolve));
  const deadline = Date.now() + 5000;
  while (a.connections.size > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
  assert.equal(a.context.stats.accepted, 1);
  assert.equal(a.connections.size, 0);
  assert.notEqual(a.connections, b.connections, 'a set of its own');
  assert.equal(b.connections.size, 0, 'the shared empty set stays empty');
  await a.drained();
});

test('TCP: listeners of the same deps share what they take from them: an idle one is a small object', async () => {
  const ownTraffic = new OwnTraffic();
  const deps = {
    log,
    keepAlive: new KeepAliveSweeper(),
    ownTraffic,
    fdPressure: new FdPressure(log),
    tcpFin: null,
  };
  const context = makeContext([]);
  const n = 5000;
  let listeners: TcpListener[] = [];
  const measure = async () => {
    listeners = [];
    await collectGarbage();
    const before = process.memoryUsage().heapUsed;
    listeners = new Array(n);
    for (let i = 0; i < n; i++) listeners[i] = new TcpListener(context, DEFAULT_TCP_OPTIONS, deps);
    await collectGarbage();
    return (process.memoryUsage().heapUsed - before) / n;
  };
  // The first batch also pays for the code's first runs (bytecode, feedback, optimized code), and one
  // reading of the heap moves by a few hundred KB with where the collector's pages stand: a first batch
  // whose figure is dropped, then the median of three (CI read 261 bytes once from a single batch).
  await measure();
  const each = await medianOf(3, measure);
  // 13 fields of its own were 232 bytes; with one shared record 128 (and the array's slot).
  assert.ok(each < 180, `${each.toFixed(0)} bytes of heap per idle TcpListener`);
  const [a, b] = listeners as [TcpListener, TcpListener];
  assert.equal(a.fdPressure, deps.fdPressure);
  assert.equal(a.options, b.options);
  // Deps without a descriptor watch give each listener its own, as before.
  const own = { log, ownTraffic, tcpFin: null };
  const c = new TcpListener(context, DEFAULT_TCP_OPTIONS, own);
  const d = new TcpListener(context, DEFAULT_TCP_OPTIONS, own);
  assert.notEqual(c.fdPressure, d.fdPressure);
  assert.equal(c.ownTraffic, d.ownTraffic);
});

for (const [how, tcpAccept] of [
  ['the native listener', undefined],
  ['a net.Server', null],
] as const) {
  test(`TCP, ${how}: an idle service port's first connection is counted, also on its second listener`, async (t) => {
    const deps = {
      log,
      ownTraffic: new OwnTraffic(),
      fdPressure: new FdPressure(log),
      tcpFin: null,
      tcpAccept,
    };
    const primary = makeContext([]);
    primary.stats = IDLE_STATS;
    const second: ServicePortContext = { ...makeContext([]), stats: IDLE_STATS, statsOwner: primary };
    const other = { ...makeContext([]), stats: IDLE_STATS };
    const listeners = [primary, second, other].map((c) => new TcpListener(c, DEFAULT_TCP_OPTIONS, deps));
    t.after(() => {
      for (const l of listeners) l.destroy();
    });
    for (const l of listeners) await l.listen('127.0.0.1', 0);
    const [a, b] = listeners as [TcpListener, TcpListener];
    // No endpoint: each connection is counted (accepted, no endpoints) and closed at once.
    for (const l of [a, b]) {
      const client = net.connect(l.port, '127.0.0.1');
      client.on('error', () => {});
      await new Promise((resolve) => client.once('close', resolve));
    }
    const deadline = Date.now() + 5000;
    while (primary.stats.noEndpoints < 2 && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 10));
    assert.equal(primary.stats.accepted, 2, 'both listeners count on the primary context');
    assert.equal(primary.stats.noEndpoints, 2);
    assert.equal(second.stats, primary.stats);
    assert.equal(other.stats, IDLE_STATS, 'a service port without connections stays idle');
    assert.equal(IDLE_STATS.accepted, 0);
  });
}
