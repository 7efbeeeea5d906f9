import assert from 'node:assert/strict';
import http from 'node:http';
import type net from 'node:net';
import { test } from 'node:test';
import { request as undiciRequest } from 'undici';
import { createSniffer, sniffLimits, startSniffer } from '../../../src/trace/sniff/classify.ts';
import type { Http1Info, SniffEvent, Sniffer } from '../../../src/trace/sniff/types.ts';
import { usedHeap } from '../../helpers/heap.ts';
import {
  assertSplitInvariant,
  bytewise,
  merge,
  mutate,
  prng,
  randomChunks,
  recordConversation,
  replay,
  type Step,
  truncated,
} from '../../helpers/sniff.ts';

const AUTH = 'Bearer SECRET-AUTH-7f3a9c';
const COOKIE = 'session=SECRET-COOKIE-4b2e81';
const QUERY_TOKEN = 'SECRET-QUERY-d41d8c';
const SECRETS = [AUTH, COOKIE, 'SECRET-AUTH', 'SECRET-COOKIE', 'SECRET-QUERY', 'SECRET-BODY'];

const c = (s: string): Step => ({ from: 'client', bytes: Buffer.from(s, 'latin1') });
const s = (str: string): Step => ({ from: 'server', bytes: Buffer.from(str, 'latin1') });

function sniffer(events?: SniffEvent[], maxRequests?: number, keepCounting?: boolean): Sniffer {
  return createSniffer({
    protocol: 'tcp',
    ...(maxRequests !== undefined ? { maxRequests } : {}),
    ...(keepCounting !== undefined ? { keepCounting } : {}),
    ...(events ? { onEvent: (e: SniffEvent) => events.push(e) } : {}),
  });
}

function http1(info: unknown): Http1Info {
  assert.equal((info as Http1Info).protocol, 'http1');
  return info as Http1Info;
}

function assertNoSecrets(...values: unknown[]): void {
  const text = JSON.stringify(values);
  for (const secret of SECRETS) assert.ok(!text.includes(secret), `${secret} leaked into ${text}`);
}

/** A real node:http server behind a recording proxy, driven by node:http and undici clients. */
async function recordRealConversation(): Promise<{ steps: Step[]; proxyPort: number }> {
  const server = http.createServer((req, res) => {
    let body = 0;
    req.on('data', (d: Buffer) => {
      body += d.length;
    });
    req.on('end', () => {
      if (req.url === '/nocontent') {
        res.writeHead(204).end();
      } else if (req.method === 'HEAD') {
        res.writeHead(200, { 'content-length': '1234' }).end();
      } else if (req.method === 'POST') {
        res.writeHead(201, { 'content-type': 'text/plain' });
        res.write(`got ${body} bytes\n`);
        res.end('SECRET-BODY must not leak');
      } else {
        res.writeHead(200, { 'content-length': '2', 'set-cookie': 'SECRET-COOKIE=1' }).end('hi');
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const target = (server.address() as net.AddressInfo).port;
  let proxyPort = 0;
  try {
    const steps = await recordConversation(target, async (port) => {
      proxyPort = port;
      const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
      const call = (method: string, path: string, body?: string | string[]) =>
        new Promise<void>((resolve, reject) => {
          const req = http.request(
            {
              host: '127.0.0.1',
              port,
              method,
              path,
              agent,
              headers: { authorization: AUTH, cookie: COOKIE, 'user-agent': 'sniff-test' },
            },
            (res) => {
              res.resume();
              res.on('end', resolve);
            },
          );
          req.on('error', reject);
          if (Array.isArray(body))
            for (const part of body) req.write(part); // no length: chunked
          else if (body !== undefined) req.write(body);
          req.end();
        });
      await call('GET', `/hello?token=${QUERY_TOKEN}`);
      await call('POST', '/upload', 'x'.repeat(3000) + 'SECRET-BODY');
      await call('POST', '/stream', ['SECRET-BODY-1 ', 'part two ', 'part three']);
      await call('HEAD', '/head');
      await call('GET', '/nocontent');
      agent.destroy();
      const res = await undiciRequest(`http://127.0.0.1:${port}/from-undici`, {
        headers: { authorization: AUTH, cookie: COOKIE },
      });
      await res.body.text();
    });
    return { steps, proxyPort };
  } finally {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}

test('real node:http and undici keep-alive conversation: request lines, Host, statuses, no secrets', async () => {
  const { steps, proxyPort } = await recordRealConversation();
  // Both clients' bytes really carry the secrets we are about to check for.
  const clientBytes = Buffer.concat(steps.filter((x) => x.from === 'client').map((x) => x.bytes)).toString(
    'latin1',
  );
  assert.ok(clientBytes.includes(AUTH) && clientBytes.includes(COOKIE) && clientBytes.includes('undici'));

  // node:http and undici use separate connections: split the recording where undici's request starts.
  const merged = merge(steps);
  const undiciAt = merged.findIndex((x) => x.bytes.toString('latin1').startsWith('GET /from-undici'));
  assert.ok(undiciAt > 0);
  const nodeSteps = merged.slice(0, undiciAt);
  const undiciSteps = merged.slice(undiciAt);

  const events: SniffEvent[] = [];
  const info = http1(replay(sniffer(events), nodeSteps));
  const host = `127.0.0.1:${proxyPort}`;
  assert.deepEqual(
    info.exchanges.map((x) => [x.method, x.path, x.version, x.host, x.status]),
    [
      ['GET', '/hello', 'HTTP/1.1', host, 200],
      ['POST', '/upload', 'HTTP/1.1', host, 201],
      ['POST', '/stream', 'HTTP/1.1', host, 201],
      ['HEAD', '/head', 'HTTP/1.1', host, 200],
      ['GET', '/nocontent', 'HTTP/1.1', host, 204],
    ],
  );
  assert.equal(info.requests, 5);
  assert.equal(info.responses, 5);
  assert.equal(info.truncated, false);
  assert.equal(info.malformed, false);
  assert.ok(
    info.exchanges.every((x) => x.durationMs !== undefined),
    'every response was framed to its end',
  );
  assert.deepEqual(
    events.map((e) => e.type),
    Array.from({ length: 5 }, () => ['http-request', 'http-response']).flat(),
  );
  assertNoSecrets(info, events);

  const u = http1(replay(sniffer(events), undiciSteps));
  assert.deepEqual(
    u.exchanges.map((x) => [x.method, x.path, x.host, x.status]),
    [['GET', '/from-undici', host, 200]],
  );
  assertNoSecrets(u, events);

  // Same answer whatever the chunking: every split point of every step, and byte by byte.
  const want = assertSplitInvariant(
    () => sniffer(),
    nodeSteps,
    (got, w, how) => assert.deepStrictEqual(got, w, how),
  );
  assert.deepStrictEqual(want, info);
  const bytewiseEvents: SniffEvent[] = [];
  replay(sniffer(bytewiseEvents), nodeSteps, bytewise);
  assert.deepStrictEqual(bytewiseEvents, events.slice(0, 10));
  assertNoSecrets(bytewiseEvents);

  // A capture cut anywhere: no throw, and what was complete is still reported.
  const total = nodeSteps.reduce((n, x) => n + x.bytes.length, 0);
  for (let cut = 0; cut <= total; cut += 7) {
    const part = replay(sniffer(), truncated(nodeSteps, cut));
    assertNoSecrets(part);
  }
});

test('times: ttfb from the request line to the first response byte, duration to the last', () => {
  const sn = sniffer();
  sn.onClientData(Buffer.from('GET /a HTTP/1.1\r\nHost: h\r\n\r\n'), 100);
  sn.onEndpointData(Buffer.from('HTTP/1.1 100 Continue\r\n\r\n'), 110);
  sn.onEndpointData(Buffer.from('HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab'), 130);
  sn.onEndpointData(Buffer.from('cd'), 150);
  const x = http1(sn.info()).exchanges[0]!;
  assert.deepEqual([x.startMs, x.status, x.ttfbMs, x.durationMs], [100, 200, 10, 50]);
});

test('pipelined requests in one chunk are matched to responses in order', () => {
  const steps = [
    c(
      'GET /1 HTTP/1.1\r\nHost: a\r\n\r\nHEAD /2 HTTP/1.1\r\nHost: a\r\n\r\nPOST /3 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\nTrailer: x\r\n\r\n',
    ),
    s(
      'HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcHTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\nHTTP/1.1 404 Not Found\r\nTransfer-Encoding: gzip, chunked\r\n\r\na\r\n0123456789\r\n0\r\n\r\n',
    ),
  ];
  const info = http1(
    assertSplitInvariant(
      () => sniffer(),
      steps,
      (g, w, how) => assert.deepStrictEqual(g, w, how),
    ),
  );
  assert.deepEqual(
    info.exchanges.map((x) => [x.method, x.path, x.status]),
    [
      ['GET', '/1', 200],
      ['HEAD', '/2', 200],
      ['POST', '/3', 404],
    ],
  );
  assert.equal(info.responses, 3);
  assert.ok(info.exchanges.every((x) => x.durationMs !== undefined));
});

test('bounded: maxRequests recorded, the rest counted; then done', () => {
  const req = (i: number) => `GET /r${i} HTTP/1.1\r\nHost: h\r\n\r\n`;
  const res = 'HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n';
  // 20 pipelined requests: 16 recorded, all 20 counted, done once all answered.
  const pipelined = sniffer(undefined, 16);
  pipelined.onClientData(Buffer.from(Array.from({ length: 20 }, (_, i) => req(i)).join('')), 1);
  for (let i = 0; i < 19; i++) pipelined.onEndpointData(Buffer.from(res), 2);
  assert.equal(pipelined.done, false);
  pipelined.onEndpointData(Buffer.from(res), 2);
  assert.equal(pipelined.done, true);
  const p = http1(pipelined.info());
  assert.equal(p.exchanges.length, 16);
  assert.equal(p.requests, 20);
  assert.equal(p.responses, 20);

  // One at a time: done right after the 4th exchange.
  const seq = sniffer(undefined, 4);
  for (let i = 0; i < 4; i++) {
    assert.equal(seq.done, false);
    seq.onClientData(Buffer.from(req(i)), 1);
    seq.onEndpointData(Buffer.from(res), 2);
  }
  assert.equal(seq.done, true);

  // keepCounting: never done by count; events keep coming; records stay bounded.
  const events: SniffEvent[] = [];
  const counting = sniffer(events, 4, true);
  for (let i = 0; i < 50; i++) {
    counting.onClientData(Buffer.from(req(i)), 1);
    counting.onEndpointData(Buffer.from(res), 2);
  }
  const k = http1(counting.info());
  assert.equal(counting.done, false);
  assert.deepEqual([k.exchanges.length, k.requests, k.responses, events.length], [4, 50, 50, 100]);
});

test('between exchanges a sniffer holds no parse state: connections that interleave mid-message each trace their 2nd, 16th and pipelined requests', () => {
  // The parse state of a direction is given back once a message ends and taken again by the next byte (of
  // this connection or another): interleave two connections, each part-way through a line, a header, a
  // body and a chunk, at every point where the other one takes and gives back state.
  const req = (i: number, host: string) =>
    i % 3 === 0
      ? `POST /r${i}?token=x HTTP/1.1\r\nHost: ${host}\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nbody\r\n0\r\n\r\n`
      : `GET /r${i} HTTP/1.1\r\nHost: ${host}\r\nCookie: a=b\r\n\r\n`;
  const res = (i: number) => `HTTP/1.1 ${200 + (i % 4)} OK\r\nContent-Length: 3\r\nX: y\r\n\r\nabc`;
  const a = sniffer(undefined, 16);
  const b = sniffer(undefined, 16);
  const feed = (sn: Sniffer, text: string, client: boolean, at: number) =>
    client ? sn.onClientData(Buffer.from(text), at) : sn.onEndpointData(Buffer.from(text), at);
  for (let i = 0; i < 17; i++) {
    const [ra, rb] = [req(i, 'a.test'), req(i, 'b.test')];
    const cut = 3 + ((i * 7) % (ra.length - 4));
    feed(a, ra.slice(0, cut), true, 10 * i);
    feed(b, rb, true, 10 * i);
    feed(a, ra.slice(cut), true, 10 * i + 1);
    const [sa, sb] = [res(i), res(i)];
    const rcut = 2 + ((i * 5) % (sa.length - 3));
    feed(b, sb.slice(0, rcut), false, 10 * i + 2);
    feed(a, sa, false, 10 * i + 3);
    feed(b, sb.slice(rcut), false, 10 * i + 4);
  }
  for (const [sn, host] of [
    [a, 'a.test'],
    [b, 'b.test'],
  ] as const) {
    const info = http1(sn.info());
    assert.equal(sn.done, true, 'done after its 16th exchange');
    assert.deepEqual([info.requests, info.responses, info.exchanges.length], [16, 16, 16]);
    for (const [i, x] of info.exchanges.entries()) {
      assert.deepEqual(
        [x.index, x.method, x.path, x.host, x.status, x.durationMs !== undefined],
        [i, i % 3 === 0 ? 'POST' : 'GET', `/r${i}`, host, 200 + (i % 4), true],
      );
    }
    assert.equal(info.malformed || info.truncated, false);
  }
  // Pipelined after an idle gap: three requests in one chunk, their responses split mid-body.
  const p = sniffer();
  p.onClientData(Buffer.from(req(1, 'h')), 1);
  p.onEndpointData(Buffer.from(res(1)), 2);
  p.onClientData(Buffer.from(req(2, 'h') + req(3, 'h') + req(4, 'h')), 3);
  const all = res(2) + res(3) + res(4);
  p.onEndpointData(Buffer.from(all.slice(0, 40)), 4);
  a.onClientData(Buffer.from('GET /other'), 4); // done: takes nothing
  p.onEndpointData(Buffer.from(all.slice(40)), 5);
  assert.deepEqual(
    http1(p.info()).exchanges.map((x) => [x.path, x.status]),
    [
      ['/r1', 201],
      ['/r2', 202],
      ['/r3', 203],
      ['/r4', 200],
    ],
  );
});

test('an idle keep-alive sniffer after one exchange holds its exchange only (< 400 B: no parse state, no copy of a repeated path or Host)', async () => {
  const n = 4000;
  const kept: Sniffer[] = new Array(n);
  const request = Buffer.from('GET /api/v1/items HTTP/1.1\r\nHost: shop.prod.svc.cluster.local\r\n\r\n');
  const response = Buffer.from('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok');
  // As the tracer starts them: one shared limits object, the protocol's sniffer started by the first bytes.
  const limits = sniffLimits({ maxRequests: 16 });
  const before = await usedHeap();
  for (let i = 0; i < n; i++) {
    const sn = startSniffer(limits, 'tcp', true, request, 1_800_000_000_000 + i)!;
    sn.onEndpointData(response, 1_800_000_000_005 + i);
    kept[i] = sn;
  }
  const each = ((await usedHeap()) - before) / n;
  assert.equal(http1(kept[n - 1]!.info()).exchanges[0]!.status, 200);
  // Before: the sniffer 152 B, its two directions 320, the exchange 136, its path and Host 64 (~690 B).
  assert.ok(each < 400, `${each.toFixed(0)} B a sniffer`);
});

test('a sniffer done with part of one more request in hand lets go of it (< 400 B; ~560 while it kept the part)', async () => {
  const n = 4000;
  const kept: Sniffer[] = new Array(n);
  const limits = sniffLimits({ maxRequests: 1 });
  const request = Buffer.from('GET /a HTTP/1.1\r\nHost: h\r\n\r\n');
  const partOfNext = Buffer.from('GET /b HTTP/1.1\r\nHost: h\r\nCookie: ');
  const response = Buffer.from('HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n');
  const before = await usedHeap();
  for (let i = 0; i < n; i++) {
    const sn = startSniffer(limits, 'tcp', true, request, 1)!;
    sn.onClientData(partOfNext, 2);
    sn.onEndpointData(response, 3);
    kept[i] = sn;
  }
  const each = ((await usedHeap()) - before) / n;
  const info = http1(kept[0]!.info());
  assert.equal(kept[0]!.done, true);
  assert.deepEqual([info.requests, info.responses, info.exchanges[0]!.path], [1, 1, '/a']);
  assert.ok(each < 400, `${each.toFixed(0)} B a sniffer`);
});

test('upgrade to websocket and CONNECT tunnels end sniffing', () => {
  const ws = http1(
    replay(sniffer(), [
      c(
        'GET /chat HTTP/1.1\r\nHost: h\r\nUpgrade: WebSocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: SECRET-AUTH\r\n\r\n',
      ),
      s('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n\x81\x05hello'),
      c('\x81\x85garbage that is not http'),
    ]),
  );
  assert.deepEqual([ws.upgrade, ws.exchanges[0]?.status, ws.malformed], ['websocket', 101, false]);
  assertNoSecrets(ws);

  const sn = sniffer();
  replay(sn, [
    c('CONNECT db:5432 HTTP/1.1\r\nHost: db:5432\r\n\r\n'),
    s('HTTP/1.1 200 Connection established\r\n\r\n'),
  ]);
  assert.equal(sn.done, true);
  const t = http1(sn.info());
  assert.deepEqual(
    [t.upgrade, t.exchanges[0]?.method, t.exchanges[0]?.path],
    ['connect', 'CONNECT', 'db:5432'],
  );
});

test('a response without framing runs to close: recorded, then done', () => {
  const sn = sniffer();
  replay(sn, [
    c('GET / HTTP/1.0\r\nHost: old\r\n\r\n'),
    s('HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nbody...'),
  ]);
  assert.equal(sn.done, true);
  const info = http1(sn.info());
  assert.deepEqual(
    [info.exchanges[0]?.status, info.exchanges[0]?.durationMs, info.responses],
    [200, undefined, 1],
  );
});

test('long lines: a 64 KiB Cookie is skipped, never kept; an over-long request line or Host truncates', () => {
  const bigCookie = 'SECRET-COOKIE-' + 'z'.repeat(64 * 1024);
  const steps = [
    c(`GET /big HTTP/1.1\r\nHost: h\r\nCookie: ${bigCookie}\r\nAuthorization: ${AUTH}\r\n\r\n`),
    s('HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n'),
  ];
  const info = http1(replay(sniffer(), steps));
  assert.deepEqual([info.exchanges[0]?.status, info.truncated], [200, false]);
  assert.deepStrictEqual(replay(sniffer(), steps, bytewise), info);
  assertNoSecrets(info);

  for (const line of [
    `GET /${'p'.repeat(9000)} HTTP/1.1\r\n\r\n`,
    `GET / HTTP/1.1\r\nHost: ${'h'.repeat(9000)}\r\n\r\n`,
  ]) {
    const whole = replay(sniffer(), [c(line)]);
    const split = replay(sniffer(), [c(line)], bytewise);
    assert.equal(http1(whole).truncated, true);
    assert.deepStrictEqual(split, whole);
  }
});

test('garbage where HTTP is expected stops sniffing as malformed, without throwing', () => {
  const cases = [
    ['GET / HTTP/1.1\r\nHost: h\r\n\r\n', 'HTTP/1.1 abc\r\n\r\n'],
    ['GET / HTTP/1.1\r\nno colon here\r\n\r\n', ''],
    ['POST / HTTP/1.1\r\nContent-Length: 12x\r\n\r\n', ''],
    ['POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n', ''],
    ['GET / HTTP/1.1\r\n\r\n\x00\x01\x02 binary\r\n', ''],
  ];
  for (const [client, server] of cases) {
    const sn = sniffer();
    replay(sn, [c(client!), s(server!)]);
    assert.equal(http1(sn.info()).malformed, true, client);
    assert.equal(sn.done, true);
  }
});

test('fuzz: mutated real requests and random chunking never throw; secrets never leak', async () => {
  const rand = prng(0x5eed);
  const base = [
    `GET /a?token=${QUERY_TOKEN} HTTP/1.1\r\nHost: example.com\r\nAuthorization: ${AUTH}\r\nCookie: ${COOKIE}\r\n\r\n`,
    'POST /p HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nSECRET-BODY\r\n0\r\n\r\n',
    'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n',
  ].map((x) => Buffer.from(x));
  const deadline = Date.now() + 5000;
  for (let i = 0; i < 2000 && Date.now() < deadline; i++) {
    const events: SniffEvent[] = [];
    const sn = sniffer(events, 4);
    const client = mutate(rand, Buffer.concat([base[0]!, base[1]!, base[0]!]));
    const server = mutate(rand, Buffer.concat([base[2]!, base[2]!]));
    for (const part of randomChunks(rand, client)) sn.onClientData(part, i);
    for (const part of randomChunks(rand, server)) sn.onEndpointData(part, i);
    const info = sn.info();
    const text = JSON.stringify([info, events]);
    // A mutation can break a header name (then its value is skipped), never reveal it.
    assert.ok(
      !text.includes('SECRET-AUTH') && !text.includes('SECRET-COOKIE') && !text.includes('SECRET-BODY'),
      text,
    );
  }
});
