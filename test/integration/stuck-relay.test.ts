// Stuck relays: a client fills the pipe to an endpoint that does not read, then leaves. The proxy has
// paused the client's socket (backpressure), and a paused socket is not polled: its peer's RST or FIN
// was never seen, and the connection stayed "active" for good (2 descriptors, ~5 MB of kernel buffers).
// Now an empty write on each sweep surfaces an RST, and a client kept waiting with no byte moving for
// stallTimeoutMs is closed with RST on both sides. A slow reader, or a client that does not read, stays.
import assert from 'node:assert/strict';
import net from 'node:net';
import { test } from 'node:test';
import { setTimeout as delay } from 'node:timers/promises';
import type { ConnectionInfo } from '../../src/relay/observer.ts';
import { DEFAULT_TCP_OPTIONS, TcpListener, type TcpRelayOptions } from '../../src/relay/tcp.ts';
import { ep } from '../helpers/endpoints.ts';
import { log, makeContext } from '../helpers/relay.ts';
import { identityServer, request, waitFor } from '../helpers/servers.ts';

type After = { after(fn: () => unknown): void };

/** An endpoint that accepts and never reads (until told to); its sockets, for the test to drive. */
async function deafEndpoint(t: After): Promise<{ port: number; sockets: net.Socket[] }> {
  const sockets: net.Socket[] = [];
  const server = net.createServer({ pauseOnConnect: true }, (s) => {
    s.on('error', () => {});
    sockets.push(s);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.12', r));
  t.after(() => {
    for (const s of sockets) s.destroy();
    server.close();
  });
  return { port: (server.address() as net.AddressInfo).port, sockets };
}

async function relay(t: After, endpointPort: number, options: Partial<TcpRelayOptions>) {
  const context = makeContext([ep('127.0.0.12', endpointPort)]);
  const closed: ConnectionInfo[] = [];
  context.observer = { wantsData: false, opened() {}, closed: (c) => closed.push(c) };
  const listener = new TcpListener(context, { ...DEFAULT_TCP_OPTIONS, ...options }, { log });
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.destroy());
  return { listener, context, closed };
}

/** A service port beside the stuck one, which must keep answering. */
async function bystander(t: After): Promise<number> {
  const pod = await identityServer('127.0.0.21');
  t.after(() => pod.close());
  const listener = new TcpListener(makeContext([ep(pod.host, pod.port)]), DEFAULT_TCP_OPTIONS, { log });
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.destroy());
  return listener.port;
}

/** Connects and writes 32 MiB, more than every buffer on the way holds; resolves once the proxy paused it. */
async function fillThePipe(t: After, listener: TcpListener): Promise<net.Socket> {
  const client = net.connect({ host: '127.0.0.1', port: listener.port });
  client.on('error', () => {});
  t.after(() => client.destroy());
  await new Promise((r) => client.once('connect', r));
  client.write(Buffer.alloc(32 << 20, 0x61));
  await waitFor(
    // Paused because the write to the endpoint returned false (not the pause of accept, while dialling).
    () => [...listener.connections].some((c) => c.clientHeld()) && client.writableLength > 0,
    10_000,
    'the proxy to pause the client (backpressure)',
  );
  return client;
}

const leaves = [
  {
    name: 'with RST: seen within a sweep (an empty write), long before the stall timeout',
    leave: (c: net.Socket) => c.resetAndDestroy(),
    // A 4 s stall timeout sweeps every second; the reset must be seen by the probe, not the timeout.
    options: { stallTimeoutMs: 4000 },
    withinMs: 2500,
    reason: 'client-reset',
  },
  {
    name: 'with FIN (close): closed as stalled after the stall timeout',
    leave: (c: net.Socket) => c.destroy(),
    options: { stallTimeoutMs: 800 },
    withinMs: 3000,
    reason: 'stalled',
  },
];

for (const c of leaves)
  test(`a client fills the pipe to an endpoint that does not read, then leaves ${c.name}`, async (t) => {
    const endpoint = await deafEndpoint(t);
    const { listener, context, closed } = await relay(t, endpoint.port, c.options);
    const other = await bystander(t);
    const client = await fillThePipe(t, listener);
    const conn = [...listener.connections][0]!;
    const started = Date.now();
    c.leave(client);
    await waitFor(() => listener.connections.size === 0, c.withinMs, 'the connection to leave the table');
    const tookMs = Date.now() - started;
    assert.equal(context.stats.active, 0);
    assert.equal(closed[0]?.closeReason, c.reason, `closed as ${c.reason} after ${tookMs} ms`);
    assert.ok(conn.socketsClosed(), 'both descriptors closed');
    assert.equal(await request(other), '127.0.0.21', 'the other service keeps serving');
  });

test('a slow endpoint that reads now and then is not stalled', async (t) => {
  const endpoint = await deafEndpoint(t);
  const { listener, context } = await relay(t, endpoint.port, { stallTimeoutMs: 1500 });
  const client = await fillThePipe(t, listener);
  // It reads in bursts of 20 ms every 300 ms: slow, but the bytes move.
  let read = 0;
  const sock = endpoint.sockets[0]!;
  sock.on('data', (d: Buffer) => (read += d.length));
  for (let i = 0; i < 8; i++) {
    sock.resume();
    await delay(20);
    sock.pause();
    await delay(300);
  }
  assert.equal(listener.connections.size, 1, 'still open after 2.6 s, beyond the stall timeout');
  assert.ok(read > 0);
  assert.equal(context.stats.active, 1);
  client.destroy();
});

test('a client that does not read is not stalled (it holds its own socket; if it leaves, our writes see it)', async (t) => {
  // The endpoint streams 16 MiB at once; the client reads nothing for 2 s (two and a half timeouts).
  const big = Buffer.alloc(16 << 20, 0x62);
  const pod = net.createServer((s) => {
    s.on('error', () => {});
    s.end(big);
  });
  await new Promise<void>((r) => pod.listen(0, '127.0.0.12', r));
  t.after(() => pod.close());
  const { listener, context } = await relay(t, (pod.address() as net.AddressInfo).port, {
    stallTimeoutMs: 800,
  });
  const client = net.connect({ host: '127.0.0.1', port: listener.port });
  client.pause();
  t.after(() => client.destroy());
  await waitFor(
    () => [...listener.connections].some((c) => c.endpointHeld()),
    5000,
    'the proxy to pause the endpoint (the client does not read)',
  );
  await delay(2000);
  assert.equal(context.stats.active, 1, 'still open');
  let got = 0;
  client.on('data', (d: Buffer) => (got += d.length));
  client.resume();
  await new Promise((r) => client.once('end', r));
  assert.equal(got, big.length, 'every byte arrives once it reads');
});
