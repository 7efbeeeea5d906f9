// The listening sockets of the relays, idle: their handlers are shared by every listener of the process,
// listen() leaves nothing behind once settled, and a failed bind still rejects (and only that).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KeepAliveSweeper } from '../../src/relay/keepalive.ts';
import { DEFAULT_TCP_OPTIONS, TcpListener } from '../../src/relay/tcp.ts';
import { DEFAULT_UDP_OPTIONS, UdpListener } from '../../src/relay/udp.ts';
import { collectGarbage } from '../helpers/heap.ts';
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
    () => new TcpListener(makeContext([]), DEFAULT_TCP_OPTIONS, { log, keepAlive, tcpFin: null }),
  );
  t.after(() => {
    for (const l of listeners) l.destroy();
  });
  const [a, b, c] = listeners as [TcpListener, TcpListener, TcpListener];
  const settled = await listenWeakly(a);
  await b.listen('127.0.0.1', 0);
  assert.ok(a.port > 0 && b.port > 0);
  for (const event of EVENTS) {
    assert.equal(a.server.listenerCount(event), 1, event);
    assert.equal(a.server.listeners(event)[0], b.server.listeners(event)[0], `one shared ${event} handler`);
  }
  await assert.rejects(c.listen('127.0.0.1', a.port), { code: 'EADDRINUSE' });
  // After a failed bind, an error is logged, not thrown (no listener would make it an uncaught one).
  c.server.emit('error', Object.assign(new Error('late'), { code: 'EPROTO' }));
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
