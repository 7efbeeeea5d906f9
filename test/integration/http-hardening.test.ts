// One request must never kill the proxy, on any of its HTTP surfaces (the health server, the metrics
// server, the health check node ports). Hostile request lines, throwing routes, accept errors, slow and
// idle clients, and more idle connections than the process has descriptors: each gets an answer or a
// closed connection, and the proxy lives and keeps serving.
import assert from 'node:assert/strict';
import net from 'node:net';
import { type TestContext, test } from 'node:test';
import { pino } from 'pino';
import { type Route, sendText, startHttpServer } from '../../src/server/http.ts';
import { exchange, get, type ProxyProcess, type Reply, startProxyProcess } from '../helpers/proxy-process.ts';
import { waitFor } from '../helpers/servers.ts';

const HOST = 'Host: x\r\n';
/** Well-formed requests close, so that each exchange ends when answered. */
const CLOSE = 'Host: x\r\nConnection: close\r\n';

async function proxyProcess(t: TestContext, options: Parameters<typeof startProxyProcess>[0] = {}) {
  const proxy = await startProxyProcess(options);
  t.after(() => proxy.stop());
  return proxy;
}

function assertServing(proxy: ProxyProcess, what: string) {
  assert.ok(proxy.alive(), `the proxy lives after ${what}; stderr: ${proxy.stderr()}`);
}

// Statuses on the health server, the metrics server and a health check node port (which answers any
// path, as kube-proxy's). 'closed': no answer, the server closed the connection.
const HOSTILE: {
  name: string;
  request: string;
  want: [number | 'closed', number | 'closed', number | 'closed'];
}[] = [
  // Crashed the process: new URL('//[', base) throws (issue 18, item 1).
  {
    name: 'GET //[ (a target WHATWG URL cannot parse)',
    request: `GET //[ HTTP/1.1\r\n${CLOSE}\r\n`,
    want: [404, 404, 200],
  },
  {
    name: 'absolute-form with a bad host',
    request: `GET http://[/healthz HTTP/1.1\r\n${CLOSE}\r\n`,
    want: [400, 400, 200],
  },
  {
    name: 'absolute-form',
    request: `GET http://example/healthz HTTP/1.1\r\n${CLOSE}\r\n`,
    want: [200, 200, 200],
  },
  { name: 'asterisk-form', request: `OPTIONS * HTTP/1.1\r\n${CLOSE}\r\n`, want: [400, 400, 200] },
  {
    name: 'CONNECT (authority-form)',
    request: `CONNECT localhost:80 HTTP/1.1\r\n${CLOSE}\r\n`,
    want: ['closed', 'closed', 'closed'],
  },
  // A leading // is a path, not another host: no route.
  {
    name: '//host/healthz',
    request: `GET //localhost/healthz HTTP/1.1\r\n${CLOSE}\r\n`,
    want: [404, 404, 200],
  },
  {
    name: '/\\host/healthz',
    request: `GET /\\localhost/healthz HTTP/1.1\r\n${CLOSE}\r\n`,
    want: [404, 404, 200],
  },
  {
    name: 'POST with a body',
    request: `POST /healthz HTTP/1.1\r\n${CLOSE}Content-Length: 5\r\n\r\nhello`,
    want: [405, 405, 200],
  },
  { name: 'an unknown method', request: `BREW /healthz HTTP/1.1\r\n${CLOSE}\r\n`, want: [400, 400, 400] },
  {
    name: 'a 20 KB header',
    request: `GET /healthz HTTP/1.1\r\n${CLOSE}X-Big: ${'a'.repeat(20_000)}\r\n\r\n`,
    want: [431, 431, 431],
  },
  {
    name: 'two Content-Lengths',
    request: `GET /healthz HTTP/1.1\r\n${CLOSE}Content-Length: 1\r\nContent-Length: 2\r\n\r\nab`,
    want: [400, 400, 400],
  },
  {
    name: 'a TLS ClientHello',
    request: `\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03${'x'.repeat(40)}`,
    want: [400, 400, 400],
  },
  { name: 'the HTTP/2 preface', request: 'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', want: [400, 400, 400] },
  {
    name: 'a NUL in the target',
    request: `GET /he\x00althz HTTP/1.1\r\n${CLOSE}\r\n`,
    want: [400, 400, 400],
  },
  {
    name: 'bad percent-escapes in the query',
    request: `GET /healthz?%zz&a=%ff HTTP/1.1\r\n${CLOSE}\r\n`,
    want: [200, 200, 200],
  },
  { name: '/__proto__', request: `GET /__proto__ HTTP/1.1\r\n${CLOSE}\r\n`, want: [404, 404, 200] },
  {
    name: 'pipelined, the bad one in the middle',
    request: `GET /healthz HTTP/1.1\r\n${HOST}\r\nGET //[ HTTP/1.1\r\n${HOST}\r\nGET /healthz HTTP/1.1\r\n${CLOSE}\r\n`,
    want: [200, 200, 200],
  },
];

test('hostile request lines on every HTTP surface: each is answered or closed, and the proxy lives', async (t) => {
  const proxy = await proxyProcess(t);
  const { health, metrics, healthCheck } = proxy.ports;
  for (const c of HOSTILE) {
    const got: (number | 'closed')[] = [];
    for (const port of [health, metrics, healthCheck]) {
      const reply = await exchange(port, c.request, { idleMs: 500 });
      got.push(reply.status === 0 && reply.closedByServer ? 'closed' : reply.status);
    }
    assertServing(proxy, c.name);
    assert.deepEqual(got, c.want, c.name);
    assert.equal(await get(health, '/healthz'), 200, `/healthz after ${c.name}`);
  }
  // The pipelined case answered all three (the middle one a 404).
  const pipelined = await exchange(health, HOSTILE.at(-1)!.request);
  assert.deepEqual(
    [...pipelined.text.matchAll(/HTTP\/1\.1 (\d{3}) /g)].map((m) => Number(m[1])),
    [200, 404, 200],
  );
});

function capture() {
  const lines: Record<string, unknown>[] = [];
  const log = pino({ level: 'debug' }, { write: (s: string) => lines.push(JSON.parse(s)) });
  return { lines, log };
}

test('a route that throws is a 500 (or, after its headers, a closed connection) and a log line', async (t) => {
  const { lines, log } = capture();
  const routes: Record<string, Route> = {
    '/sync': () => {
      throw new Error('sync boom');
    },
    '/async': async () => {
      await new Promise((r) => setImmediate(r));
      throw new Error('async boom');
    },
    '/late': (_req, res) => {
      res.writeHead(200, { 'Content-Length': 10 });
      res.write('12345');
      throw new Error('late boom');
    },
    '/thrown-string': () => {
      throw 'not an Error';
    },
    '/ok': (_req, res) => sendText(res, 200, 'ok'),
  };
  // One line per failure here: each route fails once, so that the throttle never holds one back.
  const server = await startHttpServer('127.0.0.1:0', routes, { log });
  t.after(() => server.close());
  const sync = await exchange(server.port, `GET /sync HTTP/1.1\r\n${CLOSE}\r\n`, { idleMs: 500 });
  assert.equal(sync.status, 500);
  assert.ok(!sync.text.includes('sync boom'), 'the error message stays in the log');
  const failures = () => lines.filter((l) => l.msg === 'HTTP handler failed');
  assert.equal(failures().length, 1);
  assert.equal((failures()[0]!.err as { message: string }).message, 'sync boom');
  assert.equal(failures()[0]!.target, '/sync');
  assert.equal(
    (await exchange(server.port, `GET /ok HTTP/1.1\r\n${CLOSE}\r\n`, { idleMs: 300 })).status,
    200,
  );
  // The throttle allows one line per 10 s; the later failures are counted into the next line.
  assert.equal(
    (await exchange(server.port, `GET /async HTTP/1.1\r\n${CLOSE}\r\n`, { idleMs: 500 })).status,
    500,
  );
  assert.equal(
    (await exchange(server.port, `GET /thrown-string HTTP/1.1\r\n${CLOSE}\r\n`, { idleMs: 500 })).status,
    500,
  );
  // Too late for a 500: the connection closes before the promised 10 bytes (the status line may or may
  // not have left).
  const late = await exchange(server.port, `GET /late HTTP/1.1\r\n${CLOSE}\r\n`, { idleMs: 1000 });
  assert.ok(late.closedByServer, 'a late failure closes the connection');
  assert.ok(!late.text.includes('500') && !/\r\n\r\n.{10}/s.test(late.text), 'and never completes');
  assert.equal(failures().length, 1, 'at most one line per interval');
  assert.equal(
    (await exchange(server.port, `GET /ok HTTP/1.1\r\n${CLOSE}\r\n`, { idleMs: 300 })).status,
    200,
  );
});

test('an accept error after listen (EMFILE, ENOMEM) is logged and counted, not thrown', async (t) => {
  const { lines, log } = capture();
  const exhausted: string[] = [];
  const server = await startHttpServer(
    '127.0.0.1:0',
    { '/ok': (_req, res) => sendText(res, 200, 'ok') },
    { log, onFdExhausted: (err) => exhausted.push(err.code ?? '') },
  );
  t.after(() => server.close());
  // What libuv hands the server when it cannot accept and its reserve descriptor is gone too. Without a
  // listener, 'error' throws out of the event loop: the process exits.
  const acceptError = (code: string) =>
    Object.assign(new Error(`accept ${code}`), { code, syscall: 'accept' });
  for (let i = 0; i < 100; i++) server.server.emit('error', acceptError('EMFILE'));
  server.server.emit('error', acceptError('ENOMEM'));
  assert.equal(exhausted.length, 100);
  assert.equal(
    lines.filter((l) => l.msg === 'Accepting a connection failed').length,
    1,
    'one line per interval',
  );
  assert.equal(
    (await exchange(server.port, `GET /ok HTTP/1.1\r\n${CLOSE}\r\n`, { idleMs: 300 })).status,
    200,
  );
});

test('idle, slowloris and slow-body connections are closed within seconds on every surface', async (t) => {
  const proxy = await proxyProcess(t);
  const { health, metrics, healthCheck } = proxy.ports;
  const started = Date.now();
  /** How long after the start the server closed it (Infinity: it did not, the client gave up at 30 s). */
  const closedAfter = async (reply: Promise<Reply>) =>
    (await reply).closedByServer ? Date.now() - started : Number.POSITIVE_INFINITY;
  const idle = (port: number) => closedAfter(exchange(port, '', { idleMs: 30_000 }));
  // One byte every 250 ms: the headers would take ~12 s to arrive.
  const slowHeaders = (port: number) =>
    closedAfter(
      exchange(port, `GET /healthz HTTP/1.1\r\n${HOST}X-Pad: ${'p'.repeat(20)}\r\n\r\n`, {
        pieces: 48,
        delayMs: 250,
        idleMs: 30_000,
      }),
    );
  // A kept-alive connection that never sends its second request.
  const keptAlive = (port: number) =>
    closedAfter(exchange(port, `GET /healthz HTTP/1.1\r\n${HOST}\r\n`, { idleMs: 30_000 }));
  // The headers at once, then the body one byte every 250 ms (~25 s for all of it).
  const slowBody = (port: number) =>
    new Promise<number>((resolve) => {
      const socket = net.connect({ host: '127.0.0.1', port }, () => {
        socket.write(`POST /healthz HTTP/1.1\r\n${HOST}Content-Length: 100\r\n\r\n`);
        const timer = setInterval(() => socket.write('b'), 250);
        const giveUp = setTimeout(() => socket.destroy(), 30_000);
        socket.on('close', () => {
          clearInterval(timer);
          clearTimeout(giveUp);
          resolve(Date.now() - started);
        });
      });
      socket.on('error', () => {});
      socket.resume();
    });
  const ports = [health, metrics, healthCheck];
  const [idles, slows, keeps, bodies] = await Promise.all([
    Promise.all(ports.map(idle)),
    Promise.all(ports.map(slowHeaders)),
    Promise.all(ports.map(keptAlive)),
    Promise.all(ports.map(slowBody)),
  ]);
  // Headers 5 s, keep-alive 5 s, request 10 s, checked every second; Node's defaults are 60 s, 5 s and
  // 300 s checked every 30 s (a slowloris connection lived 70-90 s). Slack for a loaded machine.
  for (const [what, times] of [
    ['idle', idles],
    ['slowloris', slows],
    ['kept-alive', keeps],
  ] as const)
    for (const ms of times) assert.ok(ms < 10_000, `${what}: closed after ${ms} ms`);
  for (const ms of bodies) assert.ok(ms < 20_000, `slow body: closed after ${ms} ms`);
  t.diagnostic(`closed after (ms) idle ${idles} slowloris ${slows} kept-alive ${keeps} slow body ${bodies}`);
  assertServing(proxy, 'slow clients');
  assert.equal(await get(health, '/healthz'), 200);
});

/** Opens `n` connections to `port` from `from(i)` and keeps them open and silent; resolves once all are settled. */
async function holdIdle(t: TestContext, port: number, n: number, from: (i: number) => string) {
  const sockets: net.Socket[] = [];
  t.after(() => {
    for (const s of sockets) s.destroy();
  });
  let closedByServer = 0;
  await Promise.all(
    Array.from(
      { length: n },
      (_, i) =>
        new Promise<void>((resolve) => {
          const s = net.connect({ host: '127.0.0.1', port, localAddress: from(i) }, () => resolve());
          s.on('error', () => resolve());
          s.on('close', () => {
            closedByServer++;
            resolve();
          });
          sockets.push(s);
        }),
    ),
  );
  return { sockets, closed: () => closedByServer };
}

test('2,000 idle connections to a server of a 512-descriptor proxy: it holds its cap, and everything else serves', async (t) => {
  const FD_LIMIT = 512;
  const proxy = await proxyProcess(t, { fdLimit: FD_LIMIT });
  const { health, metrics, healthCheck, proxy: relay } = proxy.ports;
  const baseline = await proxy.openFds();
  // One client (a pod) on the health port: past its 32, closed at once. The check connects after all
  // 2,000 (accept is in order), and well within the 5 s that idle ones are given.
  const one = await holdIdle(t, health, 2000, () => '127.0.0.2');
  assert.equal(
    await get(health, '/healthz', '127.0.0.1'),
    200,
    'another client of the health server is served',
  );
  assertServing(proxy, '2,000 idle connections from one client');
  // Many clients on the health check node port: past the cap (64 at this limit), closed at once.
  const many = await holdIdle(t, healthCheck, 2000, (i) => `127.0.1.${1 + (i % 200)}`);
  assertServing(proxy, '2,000 idle connections from 200 clients');
  const relayed = await exchange(relay, '', { idleMs: 2000 });
  assert.equal(relayed.text, 'pod', 'the relay serves');
  assert.equal(await get(metrics, '/metrics'), 200, 'the metrics server serves');
  const fds = await proxy.openFds();
  assert.ok(
    fds - baseline <= 32 + 64 + 8,
    `the proxy holds ${fds - baseline} more descriptors (caps: 32 + 64)`,
  );
  // Refused at once and said so, for each reason (the descriptors above show none is held); how many
  // of the 4,000 have seen their close by now depends on the machine's load (SYN retries of a full
  // backlog), so it is reported, not asserted.
  const refusals = () =>
    new Set(
      proxy.lines.filter((l) => l.msg === 'Too many connections, closing new ones').map((l) => l.reason),
    );
  await waitFor(() => refusals().size === 2, 10_000, 'the refusals to be logged');
  assert.deepEqual(refusals(), new Set(['client-full', 'server-full']));
  t.diagnostic(
    `closed by the server so far: ${one.closed()} of 2,000 (one client), ${many.closed()} of 2,000 (200 clients)`,
  );
});
