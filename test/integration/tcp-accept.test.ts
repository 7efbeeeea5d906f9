// The native listening socket (native/tcp_listen.c, src/relay/tcp-accept.ts): a service port listens
// without a net.Server, and what it accepts is decided in JavaScript as before: dialled by the native
// relay with its own descriptor, or wrapped in a net.Socket for the JavaScript relay (a sniffer). A bind
// error rejects listen() as net.Server's does, close() frees the port at once, no endpoints is an RST,
// the cap closes, and running out of descriptors at accept is counted where it happens.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import net from 'node:net';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { test } from 'node:test';
import type { ConnectionInfo, ConnectionObserver } from '../../src/relay/observer.ts';
import { DEFAULT_TCP_OPTIONS, TcpListener, type TcpRelayOptions } from '../../src/relay/tcp.ts';
import { processTcpAccept, type TcpAccept } from '../../src/relay/tcp-accept.ts';
import { processTcpRelay } from '../../src/relay/tcp-offload.ts';
import type { Endpoint } from '../../src/state/endpoint.ts';
import { ep } from '../helpers/endpoints.ts';
import { log, makeContext } from '../helpers/relay.ts';
import { echoServer, exchange, waitFor } from '../helpers/servers.ts';

type After = { after(fn: () => unknown): void };

function accept(): TcpAccept {
  const a = processTcpAccept();
  assert.ok(a, 'build/native/tcp_listen.node (npm run build), and KUP_TCP_ACCEPT not off');
  return a;
}

async function relay(
  t: After,
  endpoints: Endpoint[],
  options: Partial<TcpRelayOptions> = {},
  observer: Partial<ConnectionObserver> = {},
  host = '127.0.0.1',
) {
  const context = makeContext(endpoints);
  const closed: ConnectionInfo[] = [];
  context.observer = { wantsData: false, opened() {}, closed: (c) => closed.push(c), ...observer };
  const listener = new TcpListener(
    context,
    { ...DEFAULT_TCP_OPTIONS, ...options },
    { log, tcpAccept: accept() },
  );
  await listener.listen(host, 0);
  t.after(() => listener.destroy());
  return { listener, context, closed };
}

test('a service port listens without a net.Server; its connection is dialled with the accepted descriptor', async (t) => {
  const pod = await echoServer('127.0.0.12');
  t.after(() => pod.close());
  const o = processTcpRelay()!;
  const before = o.dialled;
  const { listener, context, closed } = await relay(t, [ep('127.0.0.12', pod.port)]);
  assert.equal(listener.server, undefined, 'no net.Server');
  assert.ok(listener.port > 0);
  assert.equal(await exchange(listener.port, 'ping'), 'ping');
  await waitFor(() => closed.length === 1, 2000, 'the close');
  assert.equal(o.dialled, before + 1);
  assert.equal(closed[0]!.clientAddress, '127.0.0.1');
  assert.ok(closed[0]!.clientPort > 0);
  assert.equal(closed[0]!.bytesFromClient, 4);
  assert.equal(context.stats.accepted, 1);
  assert.equal(context.stats.active, 0);
});

test("the client's address as the kernel gave it, every width of octet, also on a dual-stack socket (the addon formats IPv4 itself)", async (t) => {
  const pod = await echoServer('127.0.0.12');
  t.after(() => pod.close());
  const clients = ['127.0.0.1', '127.9.10.99', '127.100.200.255', '127.255.0.10'];
  // 127.0.0.1: an IPv4 socket; `::` (as the proxier listens by default): IPv4 clients arrive v4-mapped,
  // and are named by their IPv4 address all the same.
  for (const host of ['127.0.0.1', '::']) {
    const { listener, closed } = await relay(t, [ep('127.0.0.12', pod.port)], {}, {}, host);
    for (const localAddress of clients) {
      const socket = net.connect({ host: '127.0.0.1', port: listener.port, localAddress });
      await new Promise<void>((resolve, reject) => {
        socket.once('connect', () => socket.end('x'));
        socket.once('error', reject);
        socket.once('close', () => resolve());
        socket.resume();
      });
    }
    await waitFor(() => closed.length === clients.length, 2000, 'the closes');
    assert.deepEqual(
      closed.map((c) => c.clientAddress),
      clients,
      `listening on ${host}`,
    );
  }
});

test('a sniffing observer: the accepted descriptor becomes a paused net.Socket for the JavaScript relay', async (t) => {
  const pod = await echoServer('127.0.0.12');
  t.after(() => pod.close());
  const seen: string[] = [];
  const { listener, closed } = await relay(
    t,
    [ep('127.0.0.12', pod.port)],
    {},
    {
      wantsData: true,
      clientData: (_c, chunk) => {
        seen.push(String(chunk));
        return true;
      },
    },
  );
  assert.equal(await exchange(listener.port, 'hello'), 'hello');
  await waitFor(() => closed.length === 1, 2000, 'the close');
  assert.deepEqual(seen, ['hello']);
  assert.equal(closed[0]!.bytesToClient, 5);
  assert.equal(closed[0]!.closeReason, 'client-fin');
});

test('a bind error rejects listen() as net.Server does; close() frees the port at once', async (t) => {
  const holder = await relay(t, []);
  const port = holder.listener.port;
  const errors: NodeJS.ErrnoException[] = [];
  for (const tcpAccept of [accept(), null]) {
    const l = new TcpListener(makeContext([]), DEFAULT_TCP_OPTIONS, { log, tcpAccept });
    t.after(() => l.destroy());
    errors.push(
      await l.listen('127.0.0.1', port).then(
        () => assert.fail('bound'),
        (err) => err,
      ),
    );
  }
  const [native, server] = errors as [NodeJS.ErrnoException, NodeJS.ErrnoException];
  for (const key of ['code', 'errno', 'syscall', 'message', 'address', 'port'] as const)
    assert.equal(
      (native as unknown as Record<string, unknown>)[key],
      (server as unknown as Record<string, unknown>)[key],
      key,
    );
  assert.equal(native.code, 'EADDRINUSE');
  await holder.listener.close();
  const again = new TcpListener(makeContext([]), DEFAULT_TCP_OPTIONS, { log, tcpAccept: accept() });
  t.after(() => again.destroy());
  await again.listen('127.0.0.1', port);
  assert.equal(again.port, port);
});

test('no endpoints: an RST; past the cap: closed and counted', async (t) => {
  const none = await relay(t, []);
  assert.equal(await exchange(none.listener.port, ''), 'error ECONNRESET');
  await waitFor(() => none.closed.length === 1, 2000, 'the close');
  assert.equal(none.closed[0]!.closeReason, 'no-endpoints');
  assert.equal(none.context.stats.noEndpoints, 1);

  const pod = await echoServer('127.0.0.12');
  t.after(() => pod.close());
  const capped = await relay(t, [ep('127.0.0.12', pod.port)], { maxConnections: 1 });
  const first = net.connect({ host: '127.0.0.1', port: capped.listener.port });
  first.on('error', () => {});
  t.after(() => first.destroy());
  first.write('a');
  await new Promise((r) => first.once('data', r));
  assert.equal(await exchange(capped.listener.port, ''), '');
  await waitFor(() => capped.context.stats.rejected.limit === 1, 2000, 'the rejection');
  assert.equal(capped.context.stats.accepted, 1);
});

// The child: a listener whose process has no descriptor left when a client connects.
const CHILD = `
import { openSync, closeSync } from 'node:fs';
import { FdPressure } from ${JSON.stringify(path.resolve(import.meta.dirname, '../../src/relay/fd-pressure.ts'))};
import { DEFAULT_TCP_OPTIONS, TcpListener } from ${JSON.stringify(path.resolve(import.meta.dirname, '../../src/relay/tcp.ts'))};
import { ep } from ${JSON.stringify(path.resolve(import.meta.dirname, '../helpers/endpoints.ts'))};
import { log, makeContext } from ${JSON.stringify(path.resolve(import.meta.dirname, '../helpers/relay.ts'))};
const fdPressure = new FdPressure();
const listener = new TcpListener(makeContext([ep('127.0.0.12', Number(process.argv[1]))]), DEFAULT_TCP_OPTIONS, { log, fdPressure });
await listener.listen('127.0.0.1', 0);
const held = [];
for (let i = 0; i < 200; i++) { try { held.push(openSync('/dev/null', 'r')); } catch { break; } }
console.log(JSON.stringify({ port: listener.port, held: held.length }));
const deadline = Date.now() + 5000;
const timer = setInterval(() => {
  if (fdPressure.counts.accept === 0 && Date.now() < deadline) return;
  clearInterval(timer);
  for (const fd of held) closeSync(fd);
  console.log(JSON.stringify({ counts: fdPressure.counts }));
  setTimeout(() => { listener.destroy(); process.exit(0); }, 1500);
}, 20);
`;

test('out of descriptors at accept: counted under accept where it happens, and the next connection is served', async (t) => {
  const pod = await echoServer('127.0.0.12');
  t.after(() => pod.close());
  const child = spawn(
    'sh',
    [
      '-c',
      'ulimit -n 64 && exec "$0" "$@"',
      process.execPath,
      '--input-type=module',
      '-e',
      CHILD,
      String(pod.port),
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  t.after(() => child.kill('SIGKILL'));
  const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
  const first = JSON.parse(String((await lines.next()).value)) as { port: number; held: number };
  assert.ok(first.held > 0 && first.held < 64);
  // Shed: closed by the listener without a descriptor for it.
  const shed = await exchange(first.port, '');
  assert.ok(shed === '' || shed === 'error ECONNRESET', shed);
  const second = JSON.parse(String((await lines.next()).value)) as { counts: Record<string, number> };
  assert.ok((second.counts.accept ?? 0) >= 1, `counted: ${JSON.stringify(second.counts)}`);
  // Once the shed period (100 ms at first) is over.
  await waitFor(async () => (await exchange(first.port, 'back')) === 'back', 1200, 'a connection served');
});
