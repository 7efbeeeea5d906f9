// The tap (native/tcp_relay.c, src/relay/tcp-offload.ts): a traced connection is handed to the native
// relay at connect, and its sniffer gets each chunk from C after it was written on, until it is done.
// What the tracer records must be what it records from the JavaScript relay (tcpOffload: null) and from
// the native relay without the tap (KUP_TCP_TAP=off: in JavaScript till the sniffer is done): the same
// events in the same order, the same table record. Also: a tap that ends mid-stream, an observer that
// throws in it, and 24 MiB each way with slow readers while every chunk is tapped.
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import http from 'node:http';
import net from 'node:net';
import { Writable } from 'node:stream';
import { test } from 'node:test';
import tls from 'node:tls';
import { Client } from 'undici';
import { createLogger, type Logger } from '../../src/lib/log.ts';
import type { ConnectionInfo, ConnectionObserver } from '../../src/relay/observer.ts';
import { noopObserver } from '../../src/relay/observer.ts';
import type { ServicePortContext } from '../../src/relay/service-context.ts';
import { DEFAULT_TCP_OPTIONS, TcpListener } from '../../src/relay/tcp.ts';
import { processTcpFin, socketFd } from '../../src/relay/tcp-fin.ts';
import { ownedRelays, processTcpRelay, TcpOffload, tapCalls } from '../../src/relay/tcp-offload.ts';
import type { Endpoint } from '../../src/state/endpoint.ts';
import { ConnectionTable } from '../../src/trace/connection-table.ts';
import type { Http1Info } from '../../src/trace/sniff/types.ts';
import { createTracer, type TraceEvent } from '../../src/trace/tracer.ts';
import { ep } from '../helpers/endpoints.ts';
import { log, makeContext } from '../helpers/relay.ts';
import { tcpServer, waitFor } from '../helpers/servers.ts';
import { recordingTracer } from '../helpers/tracer.ts';

type After = { after(fn: () => unknown): void };
/** The TcpConnection behind a ConnectionInfo: whether a side is held back. */
type Held = { clientHeld(): boolean; endpointHeld(): boolean };

/** Built by `npm run build` (scripts/build-native.ts); CI builds it before the tests. */
function offload(): TcpOffload {
  const o = processTcpRelay();
  assert.ok(o, 'build/native/tcp_relay.node (npm run build), and KUP_TCP_OFFLOAD not off');
  assert.ok(o.tap, 'KUP_TCP_TAP not off');
  return o;
}

type Mode = { name: string; tcpOffload: () => TcpOffload | null };
const TAP: Mode = { name: 'tap', tcpOffload: offload };
const MODES: readonly Mode[] = [
  TAP,
  { name: 'native relay without the tap', tcpOffload: () => new TcpOffload(offload().calls, false) },
  { name: 'JavaScript relay', tcpOffload: () => null },
];

async function listen(
  t: After,
  context: ServicePortContext,
  tcpOffload: TcpOffload | null,
  logger: Logger = log,
): Promise<TcpListener> {
  const listener = new TcpListener(context, DEFAULT_TCP_OPTIONS, { log: logger, tcpOffload });
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.destroy());
  return listener;
}

async function endpoint(t: After, onSocket: (s: net.Socket) => void, allowHalfOpen = false) {
  const pod = await tcpServer('127.0.0.12', onSocket, { allowHalfOpen });
  t.after(() => pod.close());
  return pod;
}

function connect(port: number): net.Socket {
  const c = net.connect({ host: '127.0.0.1', port });
  c.on('error', () => {});
  return c;
}

function reply(c: net.Socket, word: string): Promise<string> {
  c.write(word);
  return new Promise((resolve) => c.once('data', (d) => resolve(String(d))));
}

/** An event without what differs from run to run (ids, ports, times). */
function comparable(e: TraceEvent): Record<string, unknown> {
  const { id: _id, client: _client, ...rest } = e;
  return withoutTimes(rest);
}

/** A copy without the times (every key ending in Ms, at any depth). */
function withoutTimes(value: object): Record<string, unknown> {
  return JSON.parse(JSON.stringify(value, (k, v) => (k.endsWith('Ms') ? undefined : v)));
}

async function httpBackend(t: After): Promise<Endpoint> {
  const server = http.createServer((req, res) => {
    let n = 0;
    req.on('data', (d: Buffer) => {
      n += d.length;
    });
    req.on('end', () => {
      res.writeHead(req.method === 'POST' ? 201 : 200, { 'content-type': 'text/plain' });
      // A body of several reads for the large upload, two bytes for the others.
      res.end(n > 0 ? Buffer.alloc(200_000, 'r') : 'ok');
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.12', resolve));
  t.after(
    () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  );
  return ep('127.0.0.12', (server.address() as net.AddressInfo).port);
}

/** Three keep-alive requests (one a 300 KB upload with a 200 KB answer), then a TLS exchange. */
async function traffic(t: After, mode: Mode, http1: Endpoint, tlsEndpoint: Endpoint) {
  const { table, tracer, events } = recordingTracer(t);
  const tcpOffload = mode.tcpOffload();
  const tapped = tcpOffload?.tapped ?? 0;
  const dialled = tcpOffload?.dialled ?? 0;
  const web = makeContext([http1], 'TCP', 'prod/shop:web');
  web.observer = tracer.observerFor({ trace: undefined });
  const webListener = await listen(t, web, tcpOffload);
  const client = new Client(`http://127.0.0.1:${webListener.port}`);
  try {
    const headers = { host: 'shop.example' };
    const a = await client.request({ path: '/cart', method: 'GET', headers });
    assert.equal(await a.body.text(), 'ok');
    const b = await client.request({ path: '/upload', method: 'POST', headers, body: randomBytes(300_000) });
    assert.equal((await b.body.arrayBuffer()).byteLength, 200_000);
    const c = await client.request({ path: '/checkout', method: 'GET', headers });
    assert.equal(await c.body.text(), 'ok');
  } finally {
    await client.close();
  }
  await waitFor(() => events.some((e) => e.type === 'closed'), 3000, 'the HTTP connection closed');
  const secure = makeContext([tlsEndpoint], 'TCP', 'prod/shop:tls');
  secure.observer = tracer.observerFor({ trace: undefined });
  const tlsListener = await listen(t, secure, tcpOffload);
  assert.equal(await tlsHello(tlsListener.port), 'hello');
  await waitFor(() => events.filter((e) => e.type === 'closed').length === 2, 3000, 'both closed');
  const records = table.list().recent.map((r) => {
    const { id: _id, client: _client, ...rest } = r;
    return withoutTimes(rest);
  });
  return {
    events: events.map(comparable),
    records,
    tapped: (tcpOffload?.tapped ?? 0) - tapped,
    dialled: (tcpOffload?.dialled ?? 0) - dialled,
  };
}

const PSK = Buffer.from('000102030405060708090a0b0c0d0e0f', 'hex');
const CIPHERS = 'PSK-AES128-GCM-SHA256';

async function tlsBackend(t: After): Promise<Endpoint> {
  const server = tls.createServer(
    { pskCallback: () => PSK, ciphers: CIPHERS, ALPNProtocols: ['h2', 'http/1.1'], maxVersion: 'TLSv1.2' },
    (sock) => sock.end('hello'),
  );
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.12', resolve));
  t.after(() => server.close());
  return ep('127.0.0.12', (server.address() as net.AddressInfo).port);
}

function tlsHello(port: number): Promise<string> {
  return new Promise<string>((resolve, reject) => {
    const sock = tls.connect({
      host: '127.0.0.1',
      port,
      servername: 'shop.example',
      ALPNProtocols: ['http/1.1', 'h2'],
      ciphers: CIPHERS,
      maxVersion: 'TLSv1.2',
      pskCallback: () => ({ psk: PSK, identity: 'client-1' }),
      checkServerIdentity: () => undefined,
    });
    let text = '';
    sock.on('data', (d) => {
      text += d;
    });
    sock.on('end', () => {
      sock.end();
      resolve(text);
    });
    sock.on('error', reject);
  });
}

test('a traced connection is dialled by the native relay, with the tap on from its first byte', async (t) => {
  const o = offload();
  const pod = await endpoint(t, (s) => s.on('data', (d) => s.write(d)));
  const context = makeContext([ep('127.0.0.12', pod.port)]);
  context.observer = createTracer({ mode: 'protocols', table: new ConnectionTable() }).observerFor({
    trace: undefined,
  });
  const listener = await listen(t, context, o);
  const [started, tapped, dialled] = [o.started, o.tapped, o.dialled];
  const c = connect(listener.port);
  t.after(() => c.destroy());
  // Before any byte: the sniffer has seen nothing yet and still wants everything.
  await waitFor(
    () => o.tapped === tapped + 1 && [...listener.connections][0]?.sniffing === true,
    2000,
    'the hand-over with the tap, connected',
  );
  assert.equal(o.started, started + 1);
  // Accepted and dialled by the addon: no net.Socket on either side at any time.
  assert.equal(o.dialled, dialled + 1);
  const conn = [...listener.connections][0]!;
  assert.ok(conn.relay >= 0 && conn.clientSocket === undefined && conn.sniffing);
  assert.equal(await reply(c, 'GET / HTTP/1.1\r\nHost: a\r\n\r\n'), 'GET / HTTP/1.1\r\nHost: a\r\n\r\n');
  assert.equal(conn.bytesFromClient, 27);
});

test('the tracer records the same through the tap as through the JavaScript relay: HTTP, TLS SNI', async (t) => {
  const http1 = await httpBackend(t);
  const tlsEndpoint = await tlsBackend(t);
  const runs = [];
  for (const mode of MODES) runs.push({ mode: mode.name, ...(await traffic(t, mode, http1, tlsEndpoint)) });
  const [tap, ...others] = runs;
  assert.equal(tap!.tapped, 2, 'both connections tapped');
  assert.equal(tap!.dialled, 2, 'both connections dialled by the addon, tapped from their first byte');
  assert.deepEqual(
    tap!.events.map((e) => e.type),
    [
      'opened',
      'http-request',
      'http-response',
      'http-request',
      'http-response',
      'http-request',
      'http-response',
      'closed',
      'opened',
      'closed',
    ],
  );
  const app = tap!.records.find((r) => r.service === 'prod/shop:tls')!.app as { sni?: string };
  assert.equal(app.sni, 'shop.example');
  for (const other of others) {
    assert.equal(other.tapped, 0);
    assert.deepEqual(tap!.events, other.events, `events as with the ${other.mode}`);
    assert.deepEqual(tap!.records, other.records, `records as with the ${other.mode}`);
  }
});

test("the chunks an epoll batch read for traced connections reach JavaScript together, each its connection's", async (t) => {
  const o = offload();
  const pod = await endpoint(t, (s) => s.on('data', () => {}));
  const context = makeContext([ep('127.0.0.12', pod.port)]);
  const { table, tracer, events } = recordingTracer(t);
  context.observer = tracer.observerFor({ trace: undefined });
  const listener = await listen(t, context, o);
  // 24 requests of ~1.5 KB: more than the queue's area (16 KiB) holds at once.
  const n = 24;
  const clients: net.Socket[] = [];
  for (let i = 0; i < n; i++) clients.push(connect(listener.port));
  t.after(() => {
    for (const c of clients) c.destroy();
  });
  await waitFor(() => table.activeCount === n, 3000, 'every connection relayed, and opened');
  const before = { ...tapCalls };
  // Written at once: the relay reads them in one batch of its epoll set (one wake-up of the loop).
  for (let i = 0; i < n; i++)
    clients[i]!.write(`GET /item/${i} HTTP/1.1\r\nHost: h${i}\r\nX-Pad: ${'p'.repeat(1500)}\r\n\r\n`);
  await waitFor(() => events.filter((e) => e.type === 'http-request').length === n, 3000, 'every request');
  const requests = events.filter((e) => e.type === 'http-request');
  for (const r of requests) {
    const i = r.path.slice('/item/'.length);
    assert.equal(r.host, `h${i}`, 'the request of the connection that sent it');
    assert.equal(table.list({ id: r.id }).active[0]!.client, r.client);
  }
  assert.deepEqual(new Set(requests.map((r) => r.path)).size, n);
  assert.equal(tapCalls.chunks - before.chunks, n);
  // One call a chunk before; now one a batch, and one more each time the area is full (~1.5 KB × 24).
  assert.ok(tapCalls.calls - before.calls <= 6, `${tapCalls.calls - before.calls} calls for ${n} chunks`);
});

test('every relay lets go of its owner at its end: told in a batch, told alone, or aborted', async (t) => {
  const o = offload();
  const owned = ownedRelays();
  // The endpoint answers a request and closes (the relays end by themselves, their ends told in the
  // tap's batch); it echoes a ping and stays.
  const pod = await endpoint(t, (s) =>
    s.on('data', (d) => (String(d).startsWith('ping') ? s.write(d) : s.end(d))),
  );
  const context = makeContext([ep('127.0.0.12', pod.port)]);
  const { table, tracer } = recordingTracer(t);
  context.observer = tracer.observerFor({ trace: undefined });
  const listener = await listen(t, context, o);
  const n = 30;
  const answers = await Promise.all(
    Array.from({ length: n }, async (_, i) => {
      const c = connect(listener.port);
      const answer = await reply(c, `GET /${i} HTTP/1.1\r\nHost: h\r\n\r\n`);
      c.end();
      return answer;
    }),
  );
  assert.equal(answers.length, n);
  await waitFor(() => table.activeCount === 0 && listener.connections.size === 0, 3000, 'every close');
  assert.equal(ownedRelays(), owned, 'the ends told in the batch let go of their owners');
  // Untraced (told alone, not queued), then aborted by the listener's destroy().
  context.observer = noopObserver;
  const open: net.Socket[] = [];
  for (let i = 0; i < 10; i++) open.push(connect(listener.port));
  t.after(() => {
    for (const c of open) c.destroy();
  });
  await Promise.all(open.map((c, i) => reply(c, `ping ${i}`)));
  assert.equal(ownedRelays(), owned + 10, 'one owner a running relay');
  open[0]!.end();
  await waitFor(() => ownedRelays() === owned + 9, 2000, 'the end told alone');
  listener.destroy();
  assert.equal(ownedRelays(), owned, 'the aborted ones let go at once');
});

test('a tap that ends mid-stream: the sniffer gets its chunks, then none; the relay goes on', async (t) => {
  const o = offload();
  const pod = await endpoint(t, (s) => s.on('data', (d) => s.write(d)));
  const context = makeContext([ep('127.0.0.12', pod.port)]);
  const fromClient: string[] = [];
  const fromEndpoint: string[] = [];
  const closed: ConnectionInfo[] = [];
  context.observer = {
    wantsData: true,
    opened() {},
    // Copied during the call: the chunk is the relay's read buffer.
    clientData: (_c, chunk) => fromClient.push(String(chunk)) < 3,
    endpointData: (_c, chunk) => fromEndpoint.push(String(chunk)) > 0 && fromClient.length < 3,
    closed: (c) => closed.push(c),
  };
  const listener = await listen(t, context, o);
  const c = connect(listener.port);
  await waitFor(() => listener.connections.size === 1 && [...listener.connections][0]!.relay >= 0);
  const conn = [...listener.connections][0]!;
  for (const word of ['one', 'two', 'three', 'four', 'five']) assert.equal(await reply(c, word), word);
  assert.deepEqual(fromClient, ['one', 'two', 'three']);
  assert.deepEqual(fromEndpoint, ['one', 'two']);
  assert.equal(conn.sniffing, false);
  assert.ok(conn.relay >= 0, 'still in the native relay');
  c.end();
  await waitFor(() => closed.length === 1, 3000, 'the close');
  assert.equal(closed[0]!.closeReason, 'client-fin');
  assert.equal(closed[0]!.bytesFromClient, 19);
  assert.equal(closed[0]!.bytesToClient, 19);
});

test('an observer that throws in the tap costs only its tracing: logged once, the connection goes on', async (t) => {
  const o = offload();
  const pod = await endpoint(t, (s) => {
    s.on('data', (d) => s.write(d));
    s.on('end', () => s.end('bye'));
  });
  const lines: string[] = [];
  const logger = createLogger({
    destination: new Writable({
      write(chunk, _enc, cb) {
        lines.push(String(chunk));
        cb();
      },
    }),
  });
  const context = makeContext([ep('127.0.0.12', pod.port)]);
  const calls = { clientData: 0, endpointData: 0, closed: 0 };
  const observer: ConnectionObserver = {
    wantsData: true,
    opened() {},
    clientData: () => {
      if (++calls.clientData === 2) throw new Error('boom in the tap');
      return true;
    },
    endpointData: () => ++calls.endpointData > 0,
    closed: () => {
      calls.closed++;
    },
  };
  context.observer = observer;
  const listener = await listen(t, context, o, logger);
  const tapped = o.tapped;
  const c = connect(listener.port);
  const got: string[] = [];
  c.on('data', (d) => got.push(String(d)));
  for (const word of ['one', 'two', 'three']) {
    c.write(word);
    await waitFor(() => got.join('').endsWith(word), 2000, word);
  }
  assert.equal(o.tapped, tapped + 1);
  assert.deepEqual(calls, { clientData: 2, endpointData: 1, closed: 0 });
  assert.equal(context.observer, noopObserver, 'tracing off for the service port');
  const failures = lines.filter((l) => l.includes('Connection observer failed'));
  assert.equal(failures.length, 1);
  assert.match(failures[0]!, /"callback":"clientData"/);
  c.end();
  await new Promise((r) => c.once('end', r));
  assert.equal(got.join(''), 'onetwothreebye');
  await waitFor(() => calls.closed === 1, 2000, 'still told of the close');
});

test('24 MiB each way, slow readers on both ends, every chunk tapped: intact, in order, held back', async (t) => {
  const o = offload();
  const up = randomBytes(24 << 20);
  const down = randomBytes(24 << 20);
  const atEndpoint = createHash('sha256');
  const endpointDone = Promise.withResolvers<void>();
  const pod = await endpoint(t, (s) => {
    s.end(down);
    // Reads in bursts: paused 30 ms of every 40.
    const timer = setInterval(() => {
      s.pause();
      setTimeout(() => s.resume(), 30);
    }, 40);
    s.on('data', (d: Buffer) => atEndpoint.update(d));
    s.on('end', () => {
      clearInterval(timer);
      endpointDone.resolve();
    });
  });
  const context = makeContext([ep('127.0.0.12', pod.port)]);
  // The sniffer's view of both directions, hashed during each call; it never says it is done.
  const tappedUp = createHash('sha256');
  const tappedDown = createHash('sha256');
  let held = 0;
  const closed: ConnectionInfo[] = [];
  context.observer = {
    wantsData: true,
    opened() {},
    clientData: (conn, chunk) => {
      tappedUp.update(chunk);
      if ((conn as unknown as Held).clientHeld()) held |= 1;
      return true;
    },
    endpointData: (conn, chunk) => {
      tappedDown.update(chunk);
      if ((conn as unknown as Held).endpointHeld()) held |= 2;
      return true;
    },
    closed: (c) => closed.push(c),
  };
  const tapped = o.tapped;
  const listener = await listen(t, context, o);
  const client = connect(listener.port);
  t.after(() => client.destroy());
  const atClient = createHash('sha256');
  client.on('data', (d: Buffer) => {
    atClient.update(d);
    client.pause();
    setTimeout(() => client.resume(), 2);
  });
  client.end(up);
  await new Promise((r) => client.once('end', r));
  await endpointDone.promise;
  const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');
  assert.equal(o.tapped, tapped + 1);
  assert.equal(atClient.digest('hex'), sha(down), 'the endpoint bytes, intact');
  assert.equal(atEndpoint.digest('hex'), sha(up), 'the client bytes, intact');
  assert.equal(tappedDown.digest('hex'), sha(down), 'the tap saw the endpoint bytes, in order');
  assert.equal(tappedUp.digest('hex'), sha(up), 'the tap saw the client bytes, in order');
  assert.equal(held, 3, 'both sides held back by the slow readers while tapped');
  await waitFor(() => closed.length === 1, 3000, 'the close');
  assert.equal(closed[0]!.bytesFromClient, up.length);
  assert.equal(closed[0]!.bytesToClient, down.length);
  assert.ok(['client-fin', 'endpoint-fin'].includes(closed[0]!.closeReason!));
});

test("while tapped, the endpoint's FIN still reaches the client with its answer, after the sniffer saw it", async (t) => {
  const fin = processTcpFin().calls;
  assert.ok(fin, 'build/native/tcp_fin.node');
  const o = offload();
  const answer = 'HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok';
  const pod = await endpoint(t, (s) => s.once('data', () => s.end(answer)));
  const context = makeContext([ep('127.0.0.12', pod.port)]);
  const { table, tracer, events } = recordingTracer(t);
  context.observer = tracer.observerFor({ trace: undefined });
  const listener = await listen(t, context, o);
  const tapped = o.tapped;
  const n = 50;
  let finWithAnswer = 0;
  for (let i = 0; i < n; i++) {
    finWithAnswer += await new Promise<number>((resolve, reject) => {
      const client = net.connect({ host: '127.0.0.1', port: listener.port });
      let got = '';
      client.setTimeout(5000, () => client.destroy(new Error('no answer within 5 s')));
      client.on('error', reject);
      client.on('connect', () => client.write('GET /a HTTP/1.1\r\nHost: x\r\n\r\n'));
      client.on('data', (chunk: Buffer) => {
        got += chunk.toString();
        if (got.length < answer.length) return;
        const queued = fin.peekEnd(socketFd(client)) === 1 ? 1 : 0;
        client.destroy();
        resolve(queued);
      });
    });
  }
  assert.equal(o.tapped, tapped + n);
  assert.ok(finWithAnswer >= n * 0.95, `FIN with the answer: ${finWithAnswer}/${n}`);
  await waitFor(() => table.list().recent.length === n, 3000, 'every close');
  for (const r of table.list().recent) {
    assert.equal(r.closeReason, 'endpoint-fin');
    assert.deepEqual(
      (r.app as Http1Info).exchanges.map((x) => [x.path, x.status]),
      [['/a', 200]],
    );
  }
  // Each connection's events in order: the response (from the tap) before the close.
  await waitFor(() => events.length === n * 4, 3000, 'every event');
  const byId = new Map<number, string[]>();
  for (const e of events) byId.set(e.id, [...(byId.get(e.id) ?? []), e.type]);
  for (const types of byId.values())
    assert.deepEqual(types, ['opened', 'http-request', 'http-response', 'closed']);
});

test('with a PROXY protocol header, a traced connection is handed over with the tap once the header is out', async (t) => {
  const o = offload();
  let atEndpoint = '';
  const pod = await endpoint(t, (s) =>
    s.on('data', (d) => {
      atEndpoint += d;
      if (atEndpoint.endsWith('hello')) s.write('world');
    }),
  );
  const context = makeContext([ep('127.0.0.12', pod.port)]);
  context.proxyProtocol = {
    version: 'v1',
    clusterIPs: { IPv4: '10.96.0.10', IPv6: '' },
    port: 80,
    nodePort: 0,
  };
  const seen: string[] = [];
  context.observer = {
    wantsData: true,
    opened() {},
    clientData: (_c, chunk) => seen.push(`client ${chunk}`) > 0,
    endpointData: (_c, chunk) => seen.push(`endpoint ${chunk}`) > 0,
    closed() {},
  };
  const listener = await listen(t, context, o);
  const tapped = o.tapped;
  const c = connect(listener.port);
  t.after(() => c.destroy());
  await new Promise((r) => c.once('connect', r));
  await waitFor(() => o.tapped === tapped + 1, 2000, 'the hand-over with the tap');
  assert.equal(await reply(c, 'hello'), 'world');
  assert.match(atEndpoint, /^PROXY TCP4 127\.0\.0\.1 127\.0\.0\.1 \d+ \d+\r\nhello$/);
  // The sniffer sees the client's bytes and the endpoint's, never the header we wrote.
  assert.deepEqual(seen, ['client hello', 'endpoint world']);
  assert.ok([...listener.connections][0]!.relay >= 0);
});
