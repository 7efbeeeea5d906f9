// Dialling in native code (native/tcp_relay.c's dial, src/relay/tcp-offload.ts): a connection the native
// relay would take over at connect anyway is connected by the addon itself, while JavaScript still picks
// every endpoint and decides every retry. Checked here on the addon: that it dials, and that a refused
// connect, a connect timeout, running out of endpoints, a shutdown while connecting and the observer's
// view come out as they do with net.connect (tcpDial: false runs the same checks the old way).
import assert from 'node:assert/strict';
import { type ChildProcess, spawn } from 'node:child_process';
import net from 'node:net';
import { test } from 'node:test';
import { setTimeout as delay } from 'node:timers/promises';
import type { ConnectionInfo } from '../../src/relay/observer.ts';
import { DEFAULT_TCP_OPTIONS, TcpListener, type TcpRelayOptions } from '../../src/relay/tcp.ts';
import { processTcpRelay, type TcpOffload } from '../../src/relay/tcp-offload.ts';
import type { Endpoint } from '../../src/state/endpoint.ts';
import { ep } from '../helpers/endpoints.ts';
import { log, makeContext } from '../helpers/relay.ts';
import { echoServer, exchange, waitFor } from '../helpers/servers.ts';

type After = { after(fn: () => unknown): void };

function offload(): TcpOffload {
  const o = processTcpRelay();
  assert.ok(o?.dial, 'build/native/tcp_relay.node (npm run build), KUP_TCP_OFFLOAD and KUP_TCP_DIAL not off');
  return o;
}

const MODES = [
  { name: 'native dial', tcpDial: true },
  { name: 'net.connect', tcpDial: false },
] as const;

async function relay(
  t: After,
  endpoints: Endpoint[],
  tcpDial: boolean,
  options: Partial<TcpRelayOptions> = {},
) {
  const context = makeContext(endpoints);
  const opened: ConnectionInfo[] = [];
  const closed: ConnectionInfo[] = [];
  context.observer = { wantsData: false, opened: (c) => opened.push(c), closed: (c) => closed.push(c) };
  const listener = new TcpListener(
    context,
    { ...DEFAULT_TCP_OPTIONS, ...options },
    { log, tcpOffload: offload(), tcpDial },
  );
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.destroy());
  return { listener, context, opened, closed };
}

/** A port nobody listens on (refuses). */
async function deadPort(host: string): Promise<number> {
  const s = net.createServer();
  await new Promise<void>((r) => s.listen({ host, port: 0 }, () => r()));
  const port = (s.address() as net.AddressInfo).port;
  await new Promise((r) => s.close(r));
  return port;
}

/**
 * An endpoint that never answers a SYN: a listener (in a stopped child process) whose accept queue is
 * full, so the kernel drops new SYNs and a connect to it times out.
 */
async function hangingEndpoint(t: After, host: string): Promise<number> {
  const child: ChildProcess = spawn(
    process.execPath,
    [
      '-e',
      `const s = require('node:net').createServer(() => {}); s.listen({ host: '${host}', port: 0, backlog: 1 }, () => console.log(s.address().port));`,
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  t.after(() => {
    child.kill('SIGCONT');
    child.kill('SIGKILL');
  });
  const port = await new Promise<number>((resolve, reject) => {
    child.stdout!.once('data', (d) => resolve(Number(String(d).trim())));
    child.once('exit', () => reject(new Error('the hanging endpoint exited')));
  });
  child.kill('SIGSTOP');
  const fillers: net.Socket[] = [];
  t.after(() => {
    for (const f of fillers) f.destroy();
  });
  // Until a connect does not complete (the queue is full): a few at most.
  for (let i = 0; i < 8; i++) {
    const f = net.connect({ host, port });
    f.on('error', () => {});
    fillers.push(f);
    const done = await Promise.race([
      new Promise<boolean>((r) => f.once('connect', () => r(true))),
      delay(300).then(() => false),
    ]);
    if (!done) return port;
  }
  throw new Error('the accept queue never filled');
}

test('a connection without a sniffer is dialled by the addon: no upstream socket, opened and closed with its bytes', async (t) => {
  const o = offload();
  const pod = await echoServer('127.0.0.12');
  t.after(() => pod.close());
  const before = o.dialled;
  const { listener, context, opened, closed } = await relay(t, [ep('127.0.0.12', pod.port)], true);
  assert.equal(await exchange(listener.port, 'ping'), 'ping');
  await waitFor(() => closed.length === 1, 2000, 'the close');
  assert.equal(o.dialled, before + 1, 'dialled natively');
  assert.equal(opened.length, 1);
  assert.equal(closed[0]!.bytesFromClient, 4);
  assert.equal(closed[0]!.bytesToClient, 4);
  assert.equal(closed[0]!.closeReason, 'client-fin');
  assert.equal(context.stats.accepted, 1);
  assert.equal(context.stats.active, 0);
  // The other way: net.connect, and the hand-over at connect.
  const js = await relay(t, [ep('127.0.0.12', pod.port)], false);
  assert.equal(await exchange(js.listener.port, 'pong'), 'pong');
  assert.equal(o.dialled, before + 1, 'net.connect with tcpDial: false');
});

test('while the addon connects, the connection stays connecting (no bytes), and a shutdown closes it', async (t) => {
  const hanging = await hangingEndpoint(t, '127.0.0.14');
  const o = offload();
  const before = o.dialled;
  const active = o.calls.active();
  const { listener, closed } = await relay(t, [ep('127.0.0.14', hanging)], true, {
    connectTimeoutsMs: [5000],
  });
  const c = net.connect({ host: '127.0.0.1', port: listener.port });
  c.on('error', () => {});
  t.after(() => c.destroy());
  await waitFor(() => listener.connections.size === 1, 2000, 'the accept');
  const conn = [...listener.connections][0]!;
  assert.equal(o.dialled, before + 1);
  assert.ok(conn.relay >= 0 && conn.clientSocket === undefined, 'the client is in the addon');
  assert.equal(conn.state, 0, 'connecting');
  assert.equal(conn.bytesFromClient, 0);
  const gone = new Promise((r) => c.once('close', r));
  listener.destroy();
  await gone;
  assert.equal(closed[0]!.closeReason, 'shutdown');
  assert.equal(o.calls.active(), active, 'the slot is free');
});

for (const mode of MODES) {
  test(`${mode.name}: a refused connect is retried on another endpoint, recorded and counted`, async (t) => {
    const o = offload();
    const pod = await echoServer('127.0.0.12');
    t.after(() => pod.close());
    const dead = await deadPort('127.0.0.13');
    const before = o.dialled;
    const { listener, context, closed } = await relay(
      t,
      [ep('127.0.0.13', dead), ep('127.0.0.12', pod.port)],
      mode.tcpDial,
    );
    for (let i = 0; i < 4; i++) assert.equal(await exchange(listener.port, `m${i}`), `m${i}`);
    await waitFor(() => closed.length === 4, 2000, 'the closes');
    const failed = closed.flatMap((c) => c.failedAttempts);
    assert.ok(failed.length >= 1, 'the dead endpoint was tried');
    for (const a of failed) assert.deepEqual(a, { endpoint: `127.0.0.13:${dead}`, error: 'ECONNREFUSED' });
    assert.equal(context.stats.connectFailures.refused, failed.length);
    for (const c of closed) assert.equal(c.endpoint?.ip, '127.0.0.12');
    assert.equal(o.dialled, before + (mode.tcpDial ? 4 : 0));
  });

  test(`${mode.name}: a connect timeout moves on to the next endpoint; none left closes the client`, async (t) => {
    const hanging = await hangingEndpoint(t, '127.0.0.14');
    const pod = await echoServer('127.0.0.12');
    t.after(() => pod.close());
    const timeouts = { connectTimeoutsMs: [150, 150] };
    const both = await relay(
      t,
      [ep('127.0.0.14', hanging), ep('127.0.0.12', pod.port)],
      mode.tcpDial,
      timeouts,
    );
    for (let i = 0; i < 2; i++) assert.equal(await exchange(both.listener.port, 'x'), 'x');
    await waitFor(() => both.closed.length === 2, 2000, 'the closes');
    const failed = both.closed.flatMap((c) => c.failedAttempts);
    assert.ok(failed.length >= 1, 'the hanging endpoint was tried');
    for (const a of failed)
      assert.deepEqual(a, { endpoint: `127.0.0.14:${hanging}`, error: 'KUP_CONNECT_TIMEOUT' });
    assert.equal(both.context.stats.connectFailures.timeout, failed.length);

    const only = await relay(t, [ep('127.0.0.14', hanging)], mode.tcpDial, timeouts);
    const start = Date.now();
    assert.equal(await exchange(only.listener.port, ''), '', 'closed without an answer');
    assert.ok(Date.now() - start >= 250, 'after both attempts');
    await waitFor(() => only.closed.length === 1, 2000, 'the close');
    assert.equal(only.closed[0]!.closeReason, 'connect-failed');
    assert.equal(only.opened.length, 0);
    assert.equal(only.context.stats.connectFailed, 1);
    assert.equal(only.context.stats.active, 0);
  });

  test(`${mode.name}: every attempt refused: connect-failed, the client closed, nothing left behind`, async (t) => {
    const dead = await deadPort('127.0.0.13');
    const { listener, context, closed } = await relay(t, [ep('127.0.0.13', dead)], mode.tcpDial, {
      connectTimeoutsMs: [200, 200, 200],
    });
    const active = offload().calls.active();
    assert.equal(await exchange(listener.port, ''), '');
    await waitFor(() => closed.length === 1, 2000, 'the close');
    assert.equal(closed[0]!.closeReason, 'connect-failed');
    assert.equal(closed[0]!.failedAttempts.length, 3);
    assert.equal(context.stats.connectFailures.refused, 3);
    assert.equal(context.stats.connectFailed, 1);
    assert.equal(offload().calls.active(), active);
    assert.equal(listener.ownTraffic.tcpSize, 0);
  });
}
