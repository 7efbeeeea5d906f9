// TCP keep-alive is turned on by the sweeper for connections that live, on both sockets, and not for
// the ones that end first. What the kernel holds is read back from /proc/net/tcp: an idle established
// socket with keep-alive on has its keep-alive timer armed ("tr" 02).
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import net from 'node:net';
import { test } from 'node:test';
import { KeepAliveSweeper } from '../../src/relay/keepalive.ts';
import { Sweeper } from '../../src/relay/sweeper.ts';
import { DEFAULT_TCP_OPTIONS, TcpListener } from '../../src/relay/tcp.ts';
import { ep } from '../helpers/endpoints.ts';
import { log, makeContext } from '../helpers/relay.ts';
import { tcpServer, waitFor } from '../helpers/servers.ts';

/** The "tr" (timer) field of the established loopback sockets whose local or remote port is `port`. */
function timers(port: number, side: 'local' | 'remote'): string[] {
  const hex = port.toString(16).toUpperCase().padStart(4, '0');
  const out: string[] = [];
  for (const line of readFileSync('/proc/net/tcp', 'utf8').split('\n').slice(1)) {
    const f = line.trim().split(/\s+/);
    if (f.length < 6 || f[3] !== '01') continue; // 01 = ESTABLISHED
    const addr = side === 'local' ? f[1] : f[2];
    if (addr?.endsWith(`:${hex}`)) out.push(f[5]!.split(':')[0]!);
  }
  return out;
}

test('keep-alive goes on for connections open one sweep interval, on both sockets; not before', async (t) => {
  const backend = await tcpServer('127.0.0.11', (s) => s.on('data', (d) => s.write(d)));
  t.after(() => backend.close());
  let now = 1_000_000;
  // Swept by hand below: the shared sweeper's clock never fires.
  const clock = { now: () => now, setTimeout: () => ({}), clearTimeout: () => {} };
  const sweeper = new KeepAliveSweeper(1000, new Sweeper(25, clock));
  const listener = new TcpListener(
    makeContext([ep(backend.host, backend.port)]),
    { ...DEFAULT_TCP_OPTIONS, keepAliveDelayMs: 60_000 },
    { log, keepAlive: sweeper, now: () => now },
  );
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.destroy());
  const client = net.connect({ host: '127.0.0.1', port: listener.port });
  t.after(() => client.destroy());
  client.write('ping');
  await new Promise((r) => client.once('data', r));

  // Accepted side (local port = the listener's) and upstream side (remote port = the backend's).
  assert.deepEqual(timers(listener.port, 'local'), ['00'], 'no keep-alive at accept');
  assert.deepEqual(timers(backend.port, 'remote'), ['00'], 'no keep-alive at connect');
  sweeper.sweep(now);
  assert.deepEqual(timers(listener.port, 'local'), ['00'], 'younger than one interval: still off');

  now += 1000;
  sweeper.sweep(now);
  assert.deepEqual(timers(listener.port, 'local'), ['02'], 'the keep-alive timer is armed');
  assert.deepEqual(timers(backend.port, 'remote'), ['02']);

  // A closed listener stays swept while its connections run, and is dropped after the last one ends.
  await listener.close();
  sweeper.sweep(now);
  assert.equal(sweeper.size, 1, 'closed, one connection still running');
  client.destroy();
  await waitFor(() => listener.connections.size === 0, 2000, 'the connection to end');
  sweeper.sweep(now);
  assert.equal(sweeper.size, 0);
});

test('a listener joins the keep-alive sweep with its first connection: an idle one is not swept', async (t) => {
  const backend = await tcpServer('127.0.0.11', (s) => s.on('data', (d) => s.write(d)));
  t.after(() => backend.close());
  let now = 1_000_000;
  const clock = { now: () => now, setTimeout: () => ({}), clearTimeout: () => {} };
  const sweeper = new KeepAliveSweeper(1000, new Sweeper(25, clock));
  const listener = new TcpListener(
    makeContext([ep(backend.host, backend.port)]),
    { ...DEFAULT_TCP_OPTIONS, keepAliveDelayMs: 60_000 },
    { log, keepAlive: sweeper, now: () => now },
  );
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.destroy());
  assert.equal(sweeper.size, 0, 'listening, nothing accepted: not swept');
  const client = net.connect({ host: '127.0.0.1', port: listener.port });
  t.after(() => client.destroy());
  client.write('ping');
  await new Promise((r) => client.once('data', r));
  assert.equal(sweeper.size, 1, 'swept from its first connection on');
  now += 1000;
  sweeper.sweep(now);
  assert.deepEqual(timers(listener.port, 'local'), ['02'], 'and that connection gets keep-alive');
});
