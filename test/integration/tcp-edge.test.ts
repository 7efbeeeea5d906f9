// The native relay watches each side edge-triggered for its whole life (native/tcp_relay.c's watch): a
// side is reported when something changes, not for as long as it has something. What a side still has
// after its event was handled must be read all the same: here the proxy's loop is held (Atomics.wait) while
// an endpoint in another process sends, so that it comes to the relay in one event with something else
// (the connect; a reset).
import assert from 'node:assert/strict';
import { type ChildProcess, spawn } from 'node:child_process';
import net from 'node:net';
import { test } from 'node:test';
import type { ConnectionInfo } from '../../src/relay/observer.ts';
import { DEFAULT_TCP_OPTIONS, TcpListener } from '../../src/relay/tcp.ts';
import { processTcpRelay, type TcpOffload } from '../../src/relay/tcp-offload.ts';
import { ep } from '../helpers/endpoints.ts';
import { log, makeContext } from '../helpers/relay.ts';
import { waitFor } from '../helpers/servers.ts';

type After = { after(fn: () => unknown): void };

function offload(): TcpOffload {
  const o = processTcpRelay();
  assert.ok(o?.dial, 'build/native/tcp_relay.node (npm run build), KUP_TCP_OFFLOAD and KUP_TCP_DIAL not off');
  return o;
}

/** Blocks this process's loop (the relay's) for `ms`. */
function holdLoop(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

/** An endpoint in a child process (it runs while this one is held): `onSocket` is its connection handler. */
async function childEndpoint(t: After, host: string, onSocket: string): Promise<number> {
  const child: ChildProcess = spawn(
    process.execPath,
    [
      '-e',
      `const s = require('node:net').createServer(${onSocket}); s.listen({ host: '${host}', port: 0 }, () => console.log(s.address().port));`,
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  t.after(() => child.kill('SIGKILL'));
  return new Promise<number>((resolve, reject) => {
    child.stdout!.once('data', (d) => resolve(Number(String(d).trim())));
    child.once('exit', () => reject(new Error('the endpoint exited')));
  });
}

async function relay(t: After, port: number) {
  const context = makeContext([ep('127.0.0.12', port)]);
  const closed: ConnectionInfo[] = [];
  context.observer = { wantsData: false, opened() {}, closed: (c) => closed.push(c) };
  // A connect timeout longer than the loop is held: the attempt is not given up meanwhile.
  const options = { ...DEFAULT_TCP_OPTIONS, connectTimeoutsMs: [5000] };
  const listener = new TcpListener(context, options, { log, tcpOffload: offload(), tcpDial: true });
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.destroy());
  return { listener, context, closed };
}

/** A client that reads everything: its bytes and whether the proxy's FIN came. */
function client(port: number) {
  const c = net.connect({ host: '127.0.0.1', port, allowHalfOpen: true });
  const got = { bytes: 0, text: '', ended: false, closed: false };
  c.on('data', (d: Buffer) => {
    got.bytes += d.length;
    if (got.text.length < 64) got.text += String(d);
  });
  c.on('end', () => {
    got.ended = true;
  });
  c.on('close', () => {
    got.closed = true;
  });
  c.on('error', () => {});
  return { socket: c, got };
}

test('what the endpoint sent before the relay heard of its connect (a greeting and its FIN) reaches the client', async (t) => {
  const port = await childEndpoint(t, '127.0.0.12', `(s) => { s.on('error', () => {}); s.end('hello'); }`);
  const { listener, context, closed } = await relay(t, port);
  const balancer = context.balancers.IPv4;
  const pick = balancer.pick.bind(balancer);
  // The first pick dials; the loop is held just after it (at the accept wake's end), so that the connect,
  // the greeting and the endpoint's FIN are all there when the relay first hears of the endpoint.
  let held = false;
  balancer.pick = (...args) => {
    if (!held) {
      held = true;
      queueMicrotask(() => holdLoop(300));
    }
    return pick(...args);
  };
  const { socket, got } = client(listener.port);
  t.after(() => socket.destroy());
  await waitFor(() => got.ended, 3000, "the endpoint's greeting and FIN");
  assert.equal(got.text, 'hello');
  socket.end();
  await waitFor(() => closed.length === 1, 2000, 'the close');
  assert.equal(closed[0]!.closeReason, 'endpoint-fin');
  assert.equal(closed[0]!.bytesToClient, 5);
});

test("an endpoint's reset behind more bytes than one read takes: every byte reaches the client, then the reset ends it", async (t) => {
  // 100 KiB (more than the relay's 64 KiB read), then a reset once they are surely in the proxy's kernel.
  const size = 100 * 1024;
  const port = await childEndpoint(
    t,
    '127.0.0.12',
    `(s) => { s.on('error', () => {}); setTimeout(() => s.write(Buffer.alloc(${size}, 120), () => setTimeout(() => s.resetAndDestroy(), 150)), 50); }`,
  );
  const { listener, context, closed } = await relay(t, port);
  // Held from the connect until the bytes and the reset are both there: one event says both.
  context.observer = {
    wantsData: false,
    opened: () => queueMicrotask(() => holdLoop(600)),
    closed: (c) => closed.push(c),
  };
  const { socket, got } = client(listener.port);
  t.after(() => socket.destroy());
  await waitFor(() => closed.length === 1, 3000, 'the close');
  assert.equal(closed[0]!.closeReason, 'endpoint-reset');
  await waitFor(() => got.ended || got.closed, 2000, "the client's end");
  assert.equal(got.bytes, size);
});
