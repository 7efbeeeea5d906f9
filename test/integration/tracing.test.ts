// Tracing end to end on loopback: real TCP/UDP listeners with the tracer's observer, HTTP (undici), TLS
// (node tls, PSK), DNS over UDP; the table, close reasons, events, the access log, the debug routes on a
// real HTTP server, and the connections/trace CLIs against it. Secrets in headers must appear nowhere.
import assert from 'node:assert/strict';
import dgram from 'node:dgram';
import http from 'node:http';
import net from 'node:net';
import { Writable } from 'node:stream';
import { test } from 'node:test';
import tls from 'node:tls';
import { Client, request } from 'undici';
import { createLogger } from '../../src/lib/log.ts';
import { noopObserver } from '../../src/relay/observer.ts';
import { Sweeper } from '../../src/relay/sweeper.ts';
import type { TcpRelayOptions } from '../../src/relay/tcp.ts';
import { DEFAULT_TCP_OPTIONS, TcpListener } from '../../src/relay/tcp.ts';
import { DEFAULT_UDP_OPTIONS, UdpListener } from '../../src/relay/udp.ts';
import { startHttpServer } from '../../src/server/http.ts';
import { traceRoutes } from '../../src/server/trace-routes.ts';
import type { Endpoint } from '../../src/state/endpoint.ts';
import type { TraceMode } from '../../src/state/service-port.ts';
import { runConnections, runTrace } from '../../src/trace/cli.ts';
import type { ConnectionRecord } from '../../src/trace/connection-table.ts';
import { ConnectionTable } from '../../src/trace/connection-table.ts';
import type { Http1Info, PostgresInfo, TlsInfo } from '../../src/trace/sniff/types.ts';
import type { TraceEvent, Tracer, TracerOptions } from '../../src/trace/tracer.ts';
import { createTracer } from '../../src/trace/tracer.ts';
import { dnsAnswer, dnsQuery } from '../helpers/dns.ts';
import { ep } from '../helpers/endpoints.ts';
import { log, makeContext } from '../helpers/relay.ts';
import { echoServer, identityServer, tcpServer, udpServer, waitFor } from '../helpers/servers.ts';

type T = { after(fn: () => unknown): void };

const SECRETS = ['s3cr3t-auth', 's3cr3t-cookie', 's3cr3t-token'];

function assertNoSecrets(text: string, where: string): void {
  for (const s of SECRETS) assert.ok(!text.includes(s), `${s} leaked into ${where}`);
}

/** A tracer, its table, a collected event stream and a captured access log. */
function tracing(t: T, mode: TraceMode, extra: Partial<TracerOptions> = {}) {
  const table = new ConnectionTable();
  const accessLines: string[] = [];
  const accessLog = createLogger({
    destination: new Writable({
      write(chunk, _enc, cb) {
        accessLines.push(chunk.toString());
        cb();
      },
    }),
  });
  const tracer = createTracer({ mode, table, accessLog, ...extra });
  const events: TraceEvent[] = [];
  const sub = tracer.subscribe({}, (e) => events.push(e))!;
  t.after(() => sub.close());
  return { table, tracer, events, accessLines };
}

async function tcpProxy(
  t: T,
  tracer: Tracer,
  endpoints: Endpoint[],
  options: { trace?: TraceMode; name?: string; tcp?: Partial<TcpRelayOptions> } = {},
) {
  const context = makeContext(endpoints, 'TCP', options.name ?? 'prod/shop:web');
  context.observer = tracer.observerFor({ trace: options.trace });
  const listener = new TcpListener(context, { ...DEFAULT_TCP_OPTIONS, ...options.tcp }, { log });
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.destroy());
  return { listener, context };
}

async function httpBackend(t: T, host: string) {
  const server = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(req.method === 'POST' ? 201 : 200, { 'content-type': 'text/plain', 'set-cookie': 'x=y' });
      res.end('ok');
    });
  });
  await new Promise<void>((resolve) => server.listen(0, host, resolve));
  t.after(
    () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  );
  return ep(host, (server.address() as net.AddressInfo).port);
}

/** Two keep-alive requests carrying secrets in Authorization, Cookie and the query string. */
async function shopRequests(port: number): Promise<void> {
  const client = new Client(`http://127.0.0.1:${port}`);
  try {
    const headers = {
      host: 'shop.example',
      authorization: 'Bearer s3cr3t-auth',
      cookie: 'session=s3cr3t-cookie',
    };
    const a = await client.request({ path: '/cart?token=s3cr3t-token', method: 'GET', headers });
    assert.equal(await a.body.text(), 'ok');
    const b = await client.request({ path: '/checkout', method: 'POST', headers, body: 'card=s3cr3t-token' });
    assert.equal(b.statusCode, 201);
    await b.body.text();
  } finally {
    await client.close();
  }
}

async function recentOne(table: ConnectionTable, n = 1): Promise<ConnectionRecord[]> {
  await waitFor(() => table.list().recent.length >= n, 3000, `${n} closed connection(s)`);
  return table.list().recent;
}

async function closedPort(host: string): Promise<number> {
  const s = net.createServer();
  await new Promise<void>((resolve) => s.listen(0, host, resolve));
  const { port } = s.address() as net.AddressInfo;
  await new Promise<void>((resolve) => s.close(() => resolve()));
  return port;
}

function connectTo(port: number): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ host: '127.0.0.1', port, allowHalfOpen: true }, () => resolve(s));
    s.on('error', reject);
  });
}

test('HTTP/1.1 through the proxy: exchanges in app, events, one access-log line, no secrets anywhere', async (t) => {
  const { table, tracer, events, accessLines } = tracing(t, 'protocols');
  const backend = await httpBackend(t, '127.0.0.11');
  const { listener } = await tcpProxy(t, tracer, [backend]);
  await shopRequests(listener.port);
  const [r] = await recentOne(table);
  assert.equal(r!.service, 'prod/shop:web');
  assert.equal(r!.endpoint, backend.key);
  assert.match(r!.client, /^127\.0\.0\.1:\d+$/);
  assert.ok(r!.bytesFromClient > 100 && r!.bytesToClient > 100);
  assert.equal(r!.closeReason, 'client-fin');
  const app = r!.app as Http1Info;
  assert.equal(app.protocol, 'http1');
  assert.deepEqual(
    app.exchanges.map((x) => [x.method, x.path, x.host, x.status]),
    [
      ['GET', '/cart', 'shop.example', 200],
      ['POST', '/checkout', 'shop.example', 201],
    ],
  );
  await waitFor(() => events.some((e) => e.type === 'closed'), 2000, 'the closed event');
  assert.deepEqual(
    events.map((e) => e.type),
    ['opened', 'http-request', 'http-response', 'http-request', 'http-response', 'closed'],
  );
  for (const e of events) {
    assert.equal(e.id, r!.id);
    assert.equal(e.service, 'prod/shop:web');
    assert.equal(e.client, r!.client);
    assert.equal(e.endpoint, backend.key);
    assert.equal(typeof e.atMs, 'number');
  }
  const resp = events.find((e) => e.type === 'http-response');
  assert.ok(resp?.type === 'http-response' && resp.status === 200 && resp.path === '/cart');
  assert.equal(accessLines.length, 1);
  const line = JSON.parse(accessLines[0]!) as Record<string, unknown>;
  assert.deepEqual(
    [line.msg, line.id, line.service, line.closeReason],
    ['Connection closed', r!.id, 'prod/shop:web', r!.closeReason],
  );
  assertNoSecrets(JSON.stringify(table.list()), 'the table');
  assertNoSecrets(JSON.stringify(events), 'the events');
  assertNoSecrets(JSON.stringify(tracer.recentEvents()), 'the recent events');
  assertNoSecrets(accessLines.join(''), 'the access log');
});

test('TLS through the proxy: SNI, offered and selected ALPN and version', async (t) => {
  const { table, tracer } = tracing(t, 'protocols');
  const psk = Buffer.from('000102030405060708090a0b0c0d0e0f', 'hex');
  const ciphers = 'PSK-AES128-GCM-SHA256';
  const server = tls.createServer(
    { pskCallback: () => psk, ciphers, ALPNProtocols: ['h2', 'http/1.1'], maxVersion: 'TLSv1.2' },
    (sock) => sock.end('hello'),
  );
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.12', resolve));
  t.after(() => server.close());
  const { listener } = await tcpProxy(t, tracer, [
    ep('127.0.0.12', (server.address() as net.AddressInfo).port),
  ]);
  const got = await new Promise<string>((resolve, reject) => {
    const sock = tls.connect({
      host: '127.0.0.1',
      port: listener.port,
      servername: 'shop.example',
      ALPNProtocols: ['http/1.1', 'h2'],
      ciphers,
      maxVersion: 'TLSv1.2',
      pskCallback: () => ({ psk, identity: 'client-1' }),
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
  assert.equal(got, 'hello');
  const [r] = await recentOne(table);
  const app = r!.app as TlsInfo;
  assert.deepEqual(
    [app.protocol, app.sni, app.alpn, app.selectedVersion, app.selectedAlpn],
    ['tls', 'shop.example', ['http/1.1', 'h2'], 'TLS1.2', 'h2'],
  );
  assert.equal(r!.closeReason, 'endpoint-fin');
});

test('DNS over UDP: query and response events, app exchanges, then the session idles out', async (t) => {
  const { table, tracer, events } = tracing(t, 'protocols');
  const server = await udpServer('127.0.0.13', (msg) => dnsAnswer(msg));
  t.after(() => server.close());
  const context = makeContext([ep(server.host, server.port)], 'UDP', 'kube-system/kube-dns:dns');
  context.observer = tracer.observerFor({ trace: undefined });
  const sweeper = new Sweeper(10);
  t.after(() => sweeper.stop());
  const listener = new UdpListener(
    context,
    { ...DEFAULT_UDP_OPTIONS, idleTimeoutMs: 100 },
    { log, sweeper },
    'udp4',
  );
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.close());
  const socket = dgram.createSocket('udp4');
  t.after(() => socket.close());
  const reply = await new Promise<Buffer>((resolve) => {
    socket.once('message', resolve);
    socket.send(dnsQuery(0x4242, 'shop.prod.svc.cluster.local'), listener.port, '127.0.0.1');
  });
  assert.equal(reply.readUInt16BE(0), 0x4242);
  assert.equal(table.list().active.length, 1, 'the session is active');
  const [r] = await recentOne(table);
  assert.equal(r!.closeReason, 'idle-timeout');
  assert.equal(r!.protocol, 'UDP');
  assert.equal(r!.service, 'kube-system/kube-dns:dns');
  assert.ok(r!.app?.protocol === 'dns');
  assert.deepEqual(
    r!.app.exchanges.map((x) => [x.id, x.qname, x.qtype, x.rcode, x.answers]),
    [[0x4242, 'shop.prod.svc.cluster.local', 'A', 'NOERROR', 1]],
  );
  await waitFor(() => events.some((e) => e.type === 'closed'), 2000, 'the closed event');
  assert.deepEqual(
    events.map((e) => e.type),
    ['opened', 'dns-query', 'dns-response', 'closed'],
  );
  const resp = events[2]!;
  assert.ok(resp.type === 'dns-response');
  assert.deepEqual(
    [resp.dnsId, resp.id, resp.qname, resp.rcode],
    [0x4242, r!.id, 'shop.prod.svc.cluster.local', 'NOERROR'],
  );
});

test('UDP sessions are closed as service-removed when the listener closes', async (t) => {
  const { table, tracer } = tracing(t, 'connections');
  const server = await udpServer('127.0.0.13');
  t.after(() => server.close());
  const context = makeContext([ep(server.host, server.port)], 'UDP', 'prod/echo:udp');
  context.observer = tracer.observerFor({ trace: undefined });
  const listener = new UdpListener(
    context,
    DEFAULT_UDP_OPTIONS,
    { log, sweeper: new Sweeper(60_000) },
    'udp4',
  );
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.close());
  const socket = dgram.createSocket('udp4');
  t.after(() => socket.close());
  await new Promise<void>((resolve) => {
    socket.once('message', () => resolve());
    socket.send('ping', listener.port, '127.0.0.1');
  });
  await listener.close();
  const [r] = await recentOne(table);
  assert.deepEqual(
    [r!.closeReason, r!.bytesFromClient, r!.bytesToClient, r!.app],
    ['service-removed', 4, 4, null],
  );
});

test('TCP close reasons: client FIN, endpoint FIN, resets, no endpoints, connect failure, service removed', async (t) => {
  const { table, tracer, events } = tracing(t, 'connections');
  /** The only closed connection of `service`, once there is one. */
  const closedOf = async (service: string) => {
    await waitFor(() => table.list({ service }).recent.length === 1, 3000, `${service} to close`);
    return table.list({ service }).recent[0]!;
  };
  const reasonOf = async (id: number) => {
    await waitFor(() => table.list({ id, state: 'closed' }).recent.length === 1, 3000, `connection ${id}`);
    return table.list({ id }).recent[0]!;
  };
  const lastId = () =>
    Math.max(...table.list().active.map((r) => r.id), ...table.list().recent.map((r) => r.id));

  // Client FIN: the echo server only ends after the client does.
  const echo = await echoServer('127.0.0.11');
  t.after(() => echo.close());
  const p1 = await tcpProxy(t, tracer, [ep(echo.host, echo.port)], { name: 'prod/echo:tcp' });
  const s1 = await connectTo(p1.listener.port);
  s1.end('bye');
  s1.resume();
  const r1 = await closedOf('prod/echo');
  assert.deepEqual([r1.closeReason, r1.bytesFromClient, r1.bytesToClient], ['client-fin', 3, 3]);
  s1.destroy();

  // Endpoint FIN: the server answers and ends first.
  const ident = await identityServer('127.0.0.12');
  t.after(() => ident.close());
  const p2 = await tcpProxy(t, tracer, [ep(ident.host, ident.port)], { name: 'prod/ident:tcp' });
  const s2 = await connectTo(p2.listener.port);
  s2.on('end', () => s2.end());
  s2.resume();
  const r2 = await closedOf('prod/ident');
  assert.equal(r2.closeReason, 'endpoint-fin');
  assert.equal(r2.bytesToClient, '127.0.0.12'.length);

  // Resets both ways.
  const hold = await tcpServer('127.0.0.13', (sock) => {
    sock.on('data', (d) => {
      if (d.toString() === 'reset-me') sock.resetAndDestroy();
    });
  });
  t.after(() => hold.close());
  const p3 = await tcpProxy(t, tracer, [ep(hold.host, hold.port)], { name: 'prod/hold:tcp' });
  const s3 = await connectTo(p3.listener.port);
  s3.on('error', () => {});
  await waitFor(() => table.activeCount === 1, 2000, 'opened');
  const id3 = lastId();
  s3.resetAndDestroy();
  assert.equal((await reasonOf(id3)).closeReason, 'client-reset');
  const s4 = await connectTo(p3.listener.port);
  s4.on('error', () => {});
  await waitFor(() => table.activeCount === 1, 2000, 'opened');
  const id4 = lastId();
  s4.write('reset-me');
  assert.equal((await reasonOf(id4)).closeReason, 'endpoint-reset');
  s4.destroy();

  // No endpoints: closed without ever opening (no opened event), no endpoint.
  const p5 = await tcpProxy(t, tracer, [], { name: 'prod/empty:tcp' });
  const s5 = await connectTo(p5.listener.port).catch(() => undefined);
  s5?.on('error', () => {});
  await waitFor(() => table.list({ service: 'prod/empty' }).recent.length === 1, 2000, 'no-endpoints');
  const r5 = table.list({ service: 'prod/empty' }).recent[0]!;
  assert.deepEqual([r5.closeReason, r5.endpoint, r5.attempts], ['no-endpoints', null, []]);
  assert.ok(!events.some((e) => e.type === 'opened' && e.id === r5.id));
  s5?.destroy();

  // Connect failure: both endpoints refuse; each attempt is recorded.
  const dead1 = ep('127.0.0.14', await closedPort('127.0.0.14'));
  const dead2 = ep('127.0.0.15', await closedPort('127.0.0.15'));
  const p6 = await tcpProxy(t, tracer, [dead1, dead2], {
    name: 'prod/dead:tcp',
    tcp: { connectTimeoutsMs: [500, 500] },
  });
  const s6 = await connectTo(p6.listener.port).catch(() => undefined);
  s6?.on('error', () => {});
  await waitFor(() => table.list({ service: 'prod/dead' }).recent.length === 1, 3000, 'connect-failed');
  const r6 = table.list({ service: 'prod/dead' }).recent[0]!;
  assert.equal(r6.closeReason, 'connect-failed');
  assert.deepEqual(
    r6.attempts.map((a) => a.error),
    ['ECONNREFUSED', 'ECONNREFUSED'],
  );
  assert.deepEqual(new Set(r6.attempts.map((a) => a.endpoint)), new Set([dead1.key, dead2.key]));
  s6?.destroy();

  // Service removed: the proxier tears the listener's connections down.
  const s7 = await connectTo(p3.listener.port);
  s7.on('error', () => {});
  await waitFor(() => table.activeCount === 1, 2000, 'opened');
  const id7 = lastId();
  p3.listener.destroy('service-removed');
  assert.equal((await reasonOf(id7)).closeReason, 'service-removed');
  s7.destroy();
});

test('trace=none creates no entries and no events; the annotation overrides the default both ways', async (t) => {
  const { table, tracer, events } = tracing(t, 'protocols');
  const backend = await httpBackend(t, '127.0.0.11');
  const off = await tcpProxy(t, tracer, [backend], { trace: 'none', name: 'prod/off:web' });
  assert.equal(off.context.observer, noopObserver);
  await shopRequests(off.listener.port);
  await waitFor(() => off.context.stats.active === 0, 2000, 'closed');
  assert.deepEqual(
    [table.activeCount, table.recentCount, tracer.stats().events, events.length],
    [0, 0, 0, 0],
  );

  const conn = await tcpProxy(t, tracer, [backend], { trace: 'connections', name: 'prod/conn:web' });
  assert.equal(conn.context.observer.wantsData, false);
  await shopRequests(conn.listener.port);
  const [r] = await recentOne(table);
  assert.equal(r!.app, null, 'connections mode does not sniff');

  const quiet = tracing(t, 'none');
  const { observerFor } = quiet.tracer; // handed to the proxier unbound
  assert.equal(observerFor({ trace: undefined }), noopObserver);
  assert.equal(observerFor({ trace: 'connections' }).wantsData, false);
  assert.equal(observerFor({ trace: 'protocols' }).wantsData, true);
  const on = await tcpProxy(t, quiet.tracer, [backend], { trace: 'protocols', name: 'prod/on:web' });
  await shopRequests(on.listener.port);
  const [q] = await recentOne(quiet.table);
  assert.equal(q!.app?.protocol, 'http1');
});

test('a slow subscriber drops what overflows its queue and counts it; the others are unaffected', async (t) => {
  const table = new ConnectionTable();
  const tracer = createTracer({ mode: 'protocols', table, maxPending: 2 });
  const slow: TraceEvent[] = [];
  const fast: TraceEvent[] = [];
  const s = tracer.subscribe({}, (e) => slow.push(e))!;
  const f = tracer.subscribe({}, (e) => fast.push(e))!;
  t.after(() => {
    s.close();
    f.close();
  });
  s.pause();
  const backend = await httpBackend(t, '127.0.0.11');
  const { listener } = await tcpProxy(t, tracer, [backend]);
  await shopRequests(listener.port);
  await waitFor(() => table.recentCount === 1 && tracer.stats().events === 6, 2000, 'all events');
  await waitFor(() => fast.length + f.dropped === 6, 2000, 'the other subscriber');
  // The paused one kept its first 2 and dropped the other 4.
  s.resume();
  await waitFor(() => slow.length === 2, 2000, 'the slow subscriber catching up');
  assert.deepEqual(
    slow.map((e) => e.type),
    ['opened', 'http-request'],
  );
  assert.equal(s.dropped, 4);
  assert.equal(tracer.stats().droppedEvents >= 4, true);
  s.close();
  f.close();
  assert.equal(tracer.stats().subscribers, 0);
});

test('debug routes and the CLIs against a real metrics-style server', async (t) => {
  const { table, tracer } = tracing(t, 'protocols');
  const server = await startHttpServer('127.0.0.1:0', traceRoutes(tracer, table));
  t.after(() => server.close());
  const base = `http://127.0.0.1:${server.port}`;
  const address = `127.0.0.1:${server.port}`;
  const backend = await httpBackend(t, '127.0.0.11');
  const shop = await tcpProxy(t, tracer, [backend], { name: 'prod/shop:web' });
  const other = await tcpProxy(t, tracer, [backend], { name: 'dev/blog:http' });

  // /debug/trace streams events as they happen, filtered.
  const ac = new AbortController();
  t.after(() => ac.abort());
  const stream = await request(`${base}/debug/trace?service=prod/shop&limit=0`, {
    signal: ac.signal,
    bodyTimeout: 0,
  });
  assert.equal(stream.statusCode, 200);
  assert.equal(stream.headers['content-type'], 'application/x-ndjson');
  const lines: TraceEvent[] = [];
  let rest = '';
  stream.body.on('data', (d: Buffer) => {
    const parts = (rest + d.toString()).split('\n');
    rest = parts.pop()!;
    for (const p of parts) lines.push(JSON.parse(p) as TraceEvent);
  });
  stream.body.on('error', () => {});
  await waitFor(() => tracer.stats().subscribers === 2, 2000, 'the route to subscribe');

  await shopRequests(shop.listener.port);
  await shopRequests(other.listener.port);
  await waitFor(() => lines.some((e) => e.type === 'closed'), 3000, 'streamed closed event');
  assert.deepEqual(
    lines.map((e) => e.type),
    ['opened', 'http-request', 'http-response', 'http-request', 'http-response', 'closed'],
  );
  assert.ok(lines.every((e) => e.service === 'prod/shop:web'));
  ac.abort();
  await waitFor(() => tracer.stats().subscribers === 1, 2000, 'the route to unsubscribe on disconnect');

  // /debug/connections with filters.
  await waitFor(() => table.recentCount === 2, 2000, 'both closed');
  const get = async (q: string) => {
    const res = await request(`${base}/debug/connections${q}`);
    const text = await res.body.text();
    return {
      status: res.statusCode,
      body: (res.statusCode === 200 ? JSON.parse(text) : { text }) as Record<string, unknown>,
    };
  };
  const all = await get('');
  assert.equal(all.status, 200);
  assert.deepEqual(Object.keys(all.body).sort(), ['active', 'dropped', 'recent', 'totals']);
  assert.equal((all.body.recent as ConnectionRecord[]).length, 2);
  const byService = await get('?service=dev/blog:http');
  assert.deepEqual(
    (byService.body.recent as ConnectionRecord[]).map((r) => r.service),
    ['dev/blog:http'],
  );
  assert.equal(((await get('?state=active')).body.recent as unknown[]).length, 0);
  assert.equal(((await get('?client=127.0.0.9')).body.recent as unknown[]).length, 0);
  assert.equal(((await get('?client=127.0.0.1')).body.recent as unknown[]).length, 2);
  assert.equal(((await get('?limit=1')).body.recent as unknown[]).length, 1);
  assert.equal((await get('?state=sideways')).status, 400);
  assert.equal((await get('?limit=-1')).status, 400);
  assertNoSecrets(JSON.stringify(all.body), '/debug/connections');

  // /debug/trace?follow=false returns the buffer and ends.
  const buffered = await request(`${base}/debug/trace?follow=false&service=dev/blog`);
  const text = await buffered.body.text();
  const types = text
    .trim()
    .split('\n')
    .map((l) => (JSON.parse(l) as TraceEvent).type);
  assert.deepEqual(types, [
    'opened',
    'http-request',
    'http-response',
    'http-request',
    'http-response',
    'closed',
  ]);
  assertNoSecrets(text, '/debug/trace');

  // The connections CLI.
  let out = '';
  const sink = { write: (s: string) => (out += s) };
  let err = '';
  const errSink = { write: (s: string) => (err += s) };
  assert.equal(await runConnections(['--metrics-address', address], sink, errSink), 0);
  assert.match(out, /^SERVICE\s+CLIENT\s+ENDPOINT\s+PROTO\/APP\s+BYTES IN\/OUT\s+AGE\s+STATE/);
  assert.match(
    out,
    /prod\/shop:web\s+127\.0\.0\.1:\d+\s+127\.0\.0\.11:\d+\s+TCP\/http1 .* GET \/cart host=shop\.example 200/,
  );
  assert.match(out, /dev\/blog:http/);
  out = '';
  assert.equal(
    await runConnections(['--metrics-address', address, '--service', 'prod/shop', '--json'], sink, errSink),
    0,
  );
  const listing = JSON.parse(out) as { recent: ConnectionRecord[] };
  assert.deepEqual(
    listing.recent.map((r) => r.service),
    ['prod/shop:web'],
  );

  // The trace CLI, buffered and followed.
  out = '';
  assert.equal(
    await runTrace(['--metrics-address', address, '--service', 'prod/shop:web'], sink, undefined, errSink),
    0,
  );
  assert.match(
    out,
    /^prod\/shop:web 127\.0\.0\.1:\d+ → 127\.0\.0\.11:\d+ GET \/cart host=shop\.example 200 \d+ms$/m,
  );
  assert.match(
    out,
    /^prod\/shop:web 127\.0\.0\.1:\d+ → 127\.0\.0\.11:\d+ POST \/checkout host=shop\.example 201 \d+ms$/m,
  );
  assert.match(out, / closed client-fin in=\d+ out=\d+ \d+ms http1 requests=2$/m);
  assert.doesNotMatch(out, /^.* GET \/cart host=shop\.example$/m, 'requests only with --requests');
  out = '';
  const follow = new AbortController();
  const running = runTrace(
    ['--metrics-address', address, '--follow', '--limit', '0', '--service', 'dev/blog', '--json'],
    sink,
    follow.signal,
    errSink,
  );
  await waitFor(() => tracer.stats().subscribers === 2, 2000, 'the CLI to subscribe');
  await shopRequests(other.listener.port);
  await waitFor(() => out.includes('"type":"closed"'), 3000, 'the followed closed event');
  follow.abort();
  assert.equal(await running, 0);
  assert.deepEqual(
    out
      .trim()
      .split('\n')
      .map((l) => (JSON.parse(l) as TraceEvent).type),
    ['opened', 'http-request', 'http-response', 'http-request', 'http-response', 'closed'],
  );

  // Usage and connection errors.
  assert.equal(await runTrace(['--bogus'], sink, undefined, errSink), 2);
  assert.equal(await runConnections(['--limit', 'lots'], sink, errSink), 2);
  const dead = await closedPort('127.0.0.1');
  assert.equal(await runConnections(['--metrics-address', `127.0.0.1:${dead}`], sink, errSink), 1);
  assert.match(err, /ECONNREFUSED/);
});

/** A ClientHello (TLS 1.2 record, TLS_AES_128_GCM_SHA256) whose server_name is `sni`'s latin1 bytes. */
function clientHello(sni: string): Buffer {
  const name = Buffer.from(sni, 'latin1');
  const u16 = (n: number) => Buffer.from([n >> 8, n & 0xff]);
  const serverName = Buffer.concat([
    u16(0),
    u16(name.length + 5),
    u16(name.length + 3),
    Buffer.from([0]),
    u16(name.length),
    name,
  ]);
  const body = Buffer.concat([
    Buffer.from([3, 3]),
    Buffer.alloc(32),
    Buffer.from([0]),
    u16(2),
    Buffer.from([0x13, 0x01]),
    Buffer.from([1, 0]),
    u16(serverName.length),
    serverName,
  ]);
  const handshake = Buffer.concat([Buffer.from([1, 0, body.length >> 8, body.length & 0xff]), body]);
  return Buffer.concat([Buffer.from([0x16, 3, 1]), u16(handshake.length), handshake]);
}

/** A Postgres StartupMessage (protocol 3.0) with these parameters, as latin1 bytes. */
function pgStartup(params: Record<string, string>): Buffer {
  const body = Buffer.concat([
    Buffer.from([0, 3, 0, 0]),
    ...Object.entries(params).map(([k, v]) => Buffer.from(`${k}\0${v}\0`, 'latin1')),
    Buffer.from([0]),
  ]);
  const len = Buffer.alloc(4);
  len.writeUInt32BE(body.length + 4);
  return Buffer.concat([len, body]);
}

/** Sends `bytes` on a new connection and waits for the other side to close it. */
function sendAndWait(port: number, bytes: Buffer): Promise<void> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ host: '127.0.0.1', port }, () => s.write(bytes));
    s.on('data', () => {});
    s.on('error', reject);
    s.on('close', () => resolve());
  });
}

// What a terminal acts on: C0 but the newline, DEL, C1 (the latin1 bytes 0x80-0x9f), the bidi override.
const RAW_CONTROLS = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u202e]/;

test('bytes from clients reach the CLIs escaped (HTTP path, TLS server name, Postgres user); the JSON is exact', async (t) => {
  const { table, tracer } = tracing(t, 'protocols');
  const server = await startHttpServer('127.0.0.1:0', traceRoutes(tracer, table));
  t.after(() => server.close());
  const address = `127.0.0.1:${server.port}`;
  // Answers anything with an empty 200 and closes.
  const backend = await tcpServer('127.0.0.13', (s) =>
    s.once('data', () => s.end('HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n')),
  );
  t.after(() => backend.close());
  const web = await tcpProxy(t, tracer, [ep('127.0.0.13', backend.port)], { name: 'prod/web:http' });
  // Set the window title, clear the screen, 8-bit CSI, hide text, reverse the line.
  const PATH = '/\x1b]0;owned\x07\x1b[2J\x9b31m';
  // (The sniffer takes only visible ASCII as a Host.)
  const HOST = 'shop.example';
  const SNI = 'x\x1b[41m.example';
  const USER = 'root\x1b[8m\x9b2J';
  await sendAndWait(
    web.listener.port,
    Buffer.from(`GET ${PATH} HTTP/1.1\r\nHost: ${HOST}\r\n\r\n`, 'latin1'),
  );
  await sendAndWait(web.listener.port, clientHello(SNI));
  await sendAndWait(web.listener.port, pgStartup({ user: USER, database: 'db' }));
  await recentOne(table, 3);

  let out = '';
  const sink = { write: (s: string) => (out += s) };
  const errSink = { write: (s: string) => (out += s) };
  assert.equal(await runConnections(['--metrics-address', address], sink, errSink), 0);
  assert.doesNotMatch(out, RAW_CONTROLS, 'the connections table');
  assert.ok(out.includes('GET /\\x1b]0;owned\\x07\\x1b[2J\\x9b31m host=shop.example 200'), out);
  assert.ok(out.includes('sni=x\\x1b[41m.example'), out);
  assert.ok(out.includes('user=root\\x1b[8m\\x9b2J db=db'), out);

  out = '';
  assert.equal(await runTrace(['--metrics-address', address, '--requests'], sink, undefined, errSink), 0);
  assert.doesNotMatch(out, RAW_CONTROLS, 'the trace lines');
  assert.match(out, / GET \/\\x1b\]0;owned\\x07\\x1b\[2J\\x9b31m host=shop\.example 200 \d+ms$/m);

  // --json: the same values, exactly, and still nothing raw on the terminal.
  out = '';
  assert.equal(await runConnections(['--metrics-address', address, '--json'], sink, errSink), 0);
  assert.doesNotMatch(out, RAW_CONTROLS, 'the connections JSON');
  const apps = (JSON.parse(out) as { recent: ConnectionRecord[] }).recent.map((r) => r.app);
  const http1 = apps.find((a) => a?.protocol === 'http1') as Http1Info;
  assert.deepEqual([http1.exchanges[0]!.path, http1.exchanges[0]!.host], [PATH, HOST]);
  assert.equal((apps.find((a) => a?.protocol === 'tls') as TlsInfo).sni, SNI);
  assert.equal((apps.find((a) => a?.protocol === 'postgres') as PostgresInfo).user, USER);
  out = '';
  assert.equal(await runTrace(['--metrics-address', address, '--json'], sink, undefined, errSink), 0);
  assert.doesNotMatch(out, RAW_CONTROLS, 'the trace NDJSON');
  const request = out
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as TraceEvent)
    .find((e) => e.type === 'http-request');
  assert.deepEqual(request && [request.path, request.host], [PATH, HOST]);
});
