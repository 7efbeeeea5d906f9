// The native relay (src/relay/tcp-offload.ts, native/tcp_relay.c) takes an established connection over
// once JavaScript has nothing left to do with its bytes. The hand-over is checked directly; every
// behaviour after it runs twice, on the native relay and on the JavaScript one (tcpOffload: null), and
// must come out the same: bytes both ways under backpressure, half-close either way, resets, the idle
// and half-close timeouts, a shutdown, and what the observer hears at the close.
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { closeSync, openSync } from 'node:fs';
import net from 'node:net';
import { test } from 'node:test';
import { setTimeout as delay } from 'node:timers/promises';
import type { ConnectionInfo, ConnectionObserver } from '../../src/relay/observer.ts';
import { DEFAULT_TCP_OPTIONS, TcpListener, type TcpRelayOptions } from '../../src/relay/tcp.ts';
import { adoptRelay, ownedRelays, processTcpRelay, TcpOffload } from '../../src/relay/tcp-offload.ts';
import { ep } from '../helpers/endpoints.ts';
import { log, makeContext } from '../helpers/relay.ts';
import { tcpServer, waitFor } from '../helpers/servers.ts';

type After = { after(fn: () => unknown): void };

/** Built by `npm run build` (scripts/build-native.ts); CI builds it before the tests. */
function offload(): TcpOffload {
  const o = processTcpRelay();
  assert.ok(o, 'build/native/tcp_relay.node (npm run build), and KUP_TCP_OFFLOAD not off');
  return o;
}

const MODES = [
  { name: 'native relay', tcpOffload: undefined },
  { name: 'JavaScript relay', tcpOffload: null },
] as const;

async function relay(
  t: After,
  endpointPort: number,
  mode: { readonly tcpOffload: TcpOffload | null | undefined },
  options: Partial<TcpRelayOptions> = {},
  observer: Partial<ConnectionObserver> = {},
) {
  const context = makeContext([ep('127.0.0.12', endpointPort)]);
  const closed: ConnectionInfo[] = [];
  context.observer = { wantsData: false, opened() {}, closed: (c) => closed.push(c), ...observer };
  const listener = new TcpListener(
    context,
    { ...DEFAULT_TCP_OPTIONS, ...options },
    { log, tcpOffload: mode.tcpOffload === null ? null : (mode.tcpOffload ?? offload()) },
  );
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.destroy());
  return { listener, context, closed };
}

async function endpoint(t: After, onSocket: (s: net.Socket) => void, allowHalfOpen = false) {
  const pod = await tcpServer('127.0.0.12', onSocket, { allowHalfOpen });
  t.after(() => pod.close());
  return pod;
}

function connect(port: number, allowHalfOpen = false): net.Socket {
  const c = net.connect({ host: '127.0.0.1', port, allowHalfOpen });
  c.on('error', () => {});
  return c;
}

function sha(chunks: Buffer[]): string {
  return createHash('sha256').update(Buffer.concat(chunks)).digest('hex');
}

test('the hand-over: at connect without a sniffer, after the sniffer is done with one', async (t) => {
  const o = offload();
  const pod = await endpoint(t, (s) => s.on('data', (d) => s.write(d)));
  const before = o.started;
  const plain = await relay(t, pod.port, MODES[0]);
  const c1 = connect(plain.listener.port);
  t.after(() => c1.destroy());
  await waitFor(() => o.started === before + 1, 2000, 'the hand-over');
  const conn = [...plain.listener.connections][0]!;
  assert.ok(conn.relay >= 0 && conn.clientSocket === undefined && conn.upstream === undefined);
  c1.write('ping');
  assert.equal(String(await new Promise((r) => c1.once('data', r))), 'ping');
  assert.equal(conn.bytesFromClient, 4);
  assert.equal(conn.bytesToClient, 4);

  // A sniffer that wants the first two chunks from the client, without the tap (KUP_TCP_TAP=off): the
  // relay stays in JavaScript till then (with the tap: test/integration/tcp-tap.test.ts).
  const noTap = new TcpOffload(o.calls, false);
  let seen = 0;
  const sniffed = await relay(
    t,
    pod.port,
    { tcpOffload: noTap },
    {},
    { wantsData: true, clientData: () => ++seen < 2, endpointData: () => seen < 2 },
  );
  const c2 = connect(sniffed.listener.port);
  t.after(() => c2.destroy());
  for (const word of ['one', 'two', 'three']) {
    c2.write(word);
    assert.equal(String(await new Promise((r) => c2.once('data', r))), word);
    const c = [...sniffed.listener.connections][0]!;
    if (word === 'one') assert.equal(c.relay, -1, 'still sniffing');
    else assert.ok(c.relay >= 0, `handed over after the sniffer is done (${word})`);
  }
  assert.equal(o.started, before + 1);
  assert.equal(noTap.started, 1);
  assert.equal(noTap.tapped, 0);
  const c = [...sniffed.listener.connections][0]!;
  assert.equal(c.bytesFromClient, 11);
  assert.equal(c.bytesToClient, 11);
});

for (const mode of MODES) {
  test(`${mode.name}: 24 MiB each way, a slow reader on both ends: every byte, in order, counted`, async (t) => {
    const up = randomBytes(24 << 20);
    const down = randomBytes(24 << 20);
    const atEndpoint: Buffer[] = [];
    const endpointDone = Promise.withResolvers<void>();
    const pod = await endpoint(t, (s) => {
      s.end(down);
      // Reads in bursts: paused 30 ms of every 40.
      const timer = setInterval(() => {
        s.pause();
        setTimeout(() => s.resume(), 30);
      }, 40);
      s.on('data', (d: Buffer) => atEndpoint.push(d));
      s.on('end', () => {
        clearInterval(timer);
        endpointDone.resolve();
      });
    });
    const { listener, closed } = await relay(t, pod.port, mode);
    const client = connect(listener.port);
    t.after(() => client.destroy());
    const atClient: Buffer[] = [];
    client.on('data', (d: Buffer) => {
      atClient.push(d);
      client.pause();
      setTimeout(() => client.resume(), 2);
    });
    client.end(up);
    await new Promise((r) => client.once('end', r));
    await endpointDone.promise;
    assert.equal(sha(atClient), sha([down]), 'the endpoint bytes, intact');
    assert.equal(sha(atEndpoint), sha([up]), 'the client bytes, intact');
    await waitFor(() => closed.length === 1, 3000, 'the close');
    assert.equal(closed[0]!.bytesFromClient, up.length);
    assert.equal(closed[0]!.bytesToClient, down.length);
    assert.ok(['client-fin', 'endpoint-fin'].includes(closed[0]!.closeReason!));
  });

  test(`${mode.name}: half-close by the client: the answer still comes, then the close (client-fin)`, async (t) => {
    const pod = await endpoint(
      t,
      (s) => {
        const got: Buffer[] = [];
        s.on('data', (d: Buffer) => got.push(d));
        s.on('end', () => setTimeout(() => s.end(`got ${Buffer.concat(got).length}`), 50));
      },
      true,
    );
    const { listener, closed } = await relay(t, pod.port, mode);
    const client = connect(listener.port, true);
    await delay(50);
    client.end('x'.repeat(100_000));
    let answer = '';
    client.on('data', (d: Buffer) => {
      answer += d;
    });
    await new Promise((r) => client.once('end', r));
    assert.equal(answer, 'got 100000');
    await waitFor(() => closed.length === 1, 3000, 'the close');
    assert.equal(closed[0]!.closeReason, 'client-fin');
    client.destroy();
  });

  test(`${mode.name}: half-close by the endpoint: the client may still send everything (endpoint-fin)`, async (t) => {
    const received = Promise.withResolvers<number>();
    const pod = await endpoint(
      t,
      (s) => {
        let n = 0;
        s.end('bye');
        s.on('data', (d: Buffer) => {
          n += d.length;
        });
        s.on('end', () => received.resolve(n));
      },
      true,
    );
    const { listener, closed } = await relay(t, pod.port, mode);
    const client = connect(listener.port, true);
    client.resume();
    await new Promise((r) => client.once('end', r));
    client.end(Buffer.alloc(4 << 20, 1));
    assert.equal(await received.promise, 4 << 20);
    await waitFor(() => closed.length === 1, 3000, 'the close');
    assert.equal(closed[0]!.closeReason, 'endpoint-fin');
    assert.equal(closed[0]!.bytesFromClient, 4 << 20);
  });

  test(`${mode.name}: a reset on either side closes the other (endpoint-reset, client-reset)`, async (t) => {
    const sockets: net.Socket[] = [];
    const pod = await endpoint(t, (s) => {
      s.on('error', () => {});
      sockets.push(s);
    });
    const { listener, closed } = await relay(t, pod.port, mode);
    const c1 = connect(listener.port);
    await waitFor(() => sockets.length === 1 && listener.connections.size === 1, 2000, 'connected');
    await delay(20);
    sockets[0]!.resetAndDestroy();
    await new Promise((r) => c1.once('close', r));
    await waitFor(() => closed.length === 1, 2000, 'the close');
    assert.equal(closed[0]!.closeReason, 'endpoint-reset');

    const c2 = connect(listener.port);
    await waitFor(() => sockets.length === 2 && listener.connections.size === 1, 2000, 'connected');
    await delay(20);
    const gone = new Promise((r) => sockets[1]!.once('close', r));
    c2.resetAndDestroy();
    await gone;
    await waitFor(() => closed.length === 2, 2000, 'the close');
    assert.equal(closed[1]!.closeReason, 'client-reset');
  });

  test(`${mode.name}: bytes sent just before a reset still reach the other side (both ways)`, async (t) => {
    // A peer that writes its last bytes and resets at once (SO_LINGER 0): both are in the relay's socket
    // by the time it reads. The JavaScript relay reads the bytes, writes them on, then sees the reset.
    const sockets: net.Socket[] = [];
    const atEndpoint: Buffer[] = [];
    const pod = await endpoint(t, (s) => {
      s.on('error', () => {});
      sockets.push(s);
      s.on('data', (d: Buffer) => {
        atEndpoint.push(d);
        if (String(d) === 'go') {
          s.write('last words');
          s.resetAndDestroy();
        }
      });
    });
    const { listener, closed } = await relay(t, pod.port, mode);
    const c1 = connect(listener.port);
    const atClient: Buffer[] = [];
    c1.on('data', (d: Buffer) => atClient.push(d));
    await waitFor(() => sockets.length === 1 && listener.connections.size === 1, 2000, 'connected');
    await delay(20);
    c1.write('go');
    await new Promise((r) => c1.once('close', r));
    assert.equal(String(Buffer.concat(atClient)), 'last words');
    await waitFor(() => closed.length === 1, 2000, 'the close');
    assert.equal(closed[0]!.closeReason, 'endpoint-reset');
    assert.equal(closed[0]!.bytesToClient, 10);

    // The other way: the client's last bytes, then its reset.
    const c2 = connect(listener.port);
    await waitFor(() => sockets.length === 2 && listener.connections.size === 1, 2000, 'connected');
    await delay(20);
    const gone = new Promise((r) => sockets[1]!.once('close', r));
    c2.write('parting words');
    c2.resetAndDestroy();
    await gone;
    assert.equal(String(Buffer.concat(atEndpoint.slice(1))), 'parting words');
    await waitFor(() => closed.length === 2, 2000, 'the close');
    assert.equal(closed[1]!.closeReason, 'client-reset');
    assert.equal(closed[1]!.bytesFromClient, 13);
  });

  test(`${mode.name}: the idle and half-close timeouts close, with their reasons`, async (t) => {
    const pod = await endpoint(t, (s) => s.on('error', () => {}), true);
    const { listener, closed } = await relay(t, pod.port, mode, {
      idleTimeoutMs: 300,
      halfCloseTimeoutMs: 300,
    });
    const idle = connect(listener.port);
    idle.resume();
    idle.write('hello');
    const t0 = Date.now();
    await new Promise((r) => idle.once('close', r));
    assert.ok(Date.now() - t0 >= 250, `idle for ${Date.now() - t0} ms`);
    await waitFor(() => closed.length === 1, 2000, 'the close');
    assert.equal(closed[0]!.closeReason, 'idle-timeout');

    const half = connect(listener.port, true);
    half.resume();
    await new Promise((r) => half.once('connect', r));
    await delay(50);
    half.end();
    await new Promise((r) => half.once('close', r));
    await waitFor(() => closed.length === 2, 2000, 'the close');
    assert.equal(closed[1]!.closeReason, 'half-close-timeout');
  });

  test(`${mode.name}: an idle timeout past 2^32 ms is a long one, not its low 32 bits`, async (t) => {
    const pod = await endpoint(t, (s) => s.on('data', (d) => s.write(d)));
    // Node's timers take at most 2^31 - 1 ms and say so on stderr when given more: the relay cuts it.
    const warnings: string[] = [];
    const onWarning = (w: Error) => warnings.push(w.name);
    process.on('warning', onWarning);
    t.after(() => process.off('warning', onWarning));
    // 2^32 + 300 ms: kept as its low 32 bits it would be 300 ms.
    const { listener, closed } = await relay(t, pod.port, mode, { idleTimeoutMs: 2 ** 32 + 300 });
    const c = connect(listener.port);
    t.after(() => c.destroy());
    c.write('ping');
    assert.equal(String(await new Promise((r) => c.once('data', r))), 'ping');
    await delay(700);
    assert.equal(closed.length, 0, 'still open');
    assert.equal(listener.connections.size, 1);
    assert.deepEqual(warnings, [], 'no TimeoutOverflowWarning');
  });

  test(`${mode.name}: without a half-close timeout, the idle timeout still closes a half-closed connection`, async (t) => {
    const pod = await endpoint(t, (s) => s.on('error', () => {}), true);
    const { listener, closed } = await relay(t, pod.port, mode, {
      idleTimeoutMs: 300,
      halfCloseTimeoutMs: 0,
    });
    const half = connect(listener.port, true);
    half.resume();
    await new Promise((r) => half.once('connect', r));
    await delay(50);
    half.end();
    await new Promise((r) => half.once('close', r));
    await waitFor(() => closed.length === 1, 2000, 'the close');
    assert.equal(closed[0]!.closeReason, 'idle-timeout');
  });

  test(`${mode.name}: a shutdown closes the running connections with their bytes; drained() resolves`, async (t) => {
    const pod = await endpoint(t, (s) => s.on('data', (d) => s.write(d)));
    const { listener, closed, context } = await relay(t, pod.port, mode);
    const client = connect(listener.port);
    client.write('0123456789');
    await new Promise((r) => client.once('data', r));
    await listener.close();
    const drained = listener.drained();
    listener.destroy('shutdown');
    await drained;
    await new Promise((r) => client.once('close', r));
    assert.equal(closed.length, 1);
    assert.equal(closed[0]!.closeReason, 'shutdown');
    assert.equal(closed[0]!.bytesFromClient, 10);
    assert.equal(closed[0]!.bytesToClient, 10);
    assert.equal(context.stats.active, 0);
    assert.equal(context.stats.bytesFromClients, 10);
  });
}

test('descriptors epoll cannot watch: start() and dial() say so and leave nothing behind, the process goes on', async () => {
  const o = offload();
  // Regular files: epoll refuses them (EPERM), as it would a socket past the per-user watch limit.
  const a = openSync(import.meta.filename, 'r');
  const b = openSync(import.meta.filename, 'r');
  try {
    const active = o.calls.active();
    const owned = ownedRelays();
    const owner = { relayEnded() {}, attemptEnded() {}, relayTapped: () => false };
    assert.ok(
      adoptRelay(o.calls.start(a, b, 0, 0, 0, 0), owner) < 0,
      'start() refuses them (it crashed on the poll)',
    );
    const dial = o.dial!;
    assert.ok(adoptRelay(dial.dial(a, '127.0.0.1', 9, 1000, 0, 0, 0, 0, 0, 0), owner) < 0, 'dial() too');
    assert.equal(ownedRelays(), owned, 'no owner kept for them');
    assert.equal(o.calls.active(), active, 'no relay left running');
    // The relay still works (the slots it took are free again).
    const pod = await tcpServer('127.0.0.12', (s) => s.on('data', (d) => s.write(d)));
    try {
      const context = makeContext([ep('127.0.0.12', pod.port)]);
      context.observer = { wantsData: false, opened() {}, closed() {} };
      const listener = new TcpListener(context, DEFAULT_TCP_OPTIONS, { log, tcpOffload: o });
      await listener.listen('127.0.0.1', 0);
      try {
        const c = net.connect({ host: '127.0.0.1', port: listener.port });
        c.write('ping');
        const [echo] = (await Promise.all([new Promise((r) => c.once('data', r))])) as Buffer[];
        assert.equal(String(echo), 'ping');
        c.destroy();
      } finally {
        listener.destroy();
      }
    } finally {
      await pod.close();
    }
  } finally {
    closeSync(a);
    closeSync(b);
  }
});
