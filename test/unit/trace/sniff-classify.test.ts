import assert from 'node:assert/strict';
import { test } from 'node:test';
import tls from 'node:tls';
import { createSniffer, sniffLimits, startSniffer } from '../../../src/trace/sniff/classify.ts';
import { H2_PREFACE } from '../../../src/trace/sniff/h2.ts';
import type { AppInfo, AppProtocol, SniffEvent, Sniffer } from '../../../src/trace/sniff/types.ts';
import {
  bytewise,
  captureClientBytes,
  prng,
  randomBytes,
  randomChunks,
  replay,
  type Step,
} from '../../helpers/sniff.ts';

const c = (x: string | Buffer): Step => ({
  from: 'client',
  bytes: typeof x === 'string' ? Buffer.from(x, 'latin1') : x,
});
const s = (x: string | Buffer): Step => ({
  from: 'server',
  bytes: typeof x === 'string' ? Buffer.from(x, 'latin1') : x,
});
const tcp = (): Sniffer => createSniffer({ protocol: 'tcp' });
const udp = (): Sniffer => createSniffer({ protocol: 'udp' });

/** A connection's sniffer as the tracer runs it: nothing until the first bytes, which start it. */
function started(transport: 'tcp' | 'udp', events?: SniffEvent[]): Sniffer {
  const limits = sniffLimits({ onEvent: events === undefined ? undefined : (e) => events.push(e) });
  let inner: Sniffer | undefined;
  const feed = (fromClient: boolean, buf: Buffer, now: number): void => {
    if (inner === undefined) inner = startSniffer(limits, transport, fromClient, buf, now);
    else if (fromClient) inner.onClientData(buf, now);
    else inner.onEndpointData(buf, now);
  };
  return {
    onClientData: (buf, now) => feed(true, buf, now),
    onEndpointData: (buf, now) => feed(false, buf, now),
    get done() {
      return inner?.done ?? false;
    },
    info: () => inner?.info() ?? { protocol: 'unknown', reason: 'no-data' },
  };
}

const dnsQuery = Buffer.from(
  '12340100000100000000000003777777076578616d706c6503636f6d0000010001', // www.example.com A, RD
  'hex',
);
const dnsQueryEdns = Buffer.concat([
  Buffer.from(dnsQuery).fill(0, 10, 12).fill(1, 11, 12),
  Buffer.from('0000291000000000000000', 'hex'), // OPT
]);
const mysqlGreeting = Buffer.concat([
  Buffer.from([0x2e, 0, 0, 0, 0x0a]),
  Buffer.from('5.7.44\0'),
  Buffer.alloc(0x2e - 1 - 7, 1),
]);
const pgStartup = Buffer.from('0000001b000300007573657200616c696365006461746162617365006400' + '00', 'hex');

type Case = { name: string; make: () => Sniffer; steps: Step[]; want: AppProtocol; done?: boolean };

const cases: Case[] = [
  {
    name: 'h2c preface',
    make: tcp,
    steps: [c(H2_PREFACE + '\x00\x00\x00\x04\x00\x00\x00\x00\x00')],
    want: 'h2c',
    done: true,
  },
  { name: 'HTTP/1.1 GET', make: tcp, steps: [c('GET / HTTP/1.1\r\nHost: a\r\n\r\n')], want: 'http1' },
  { name: 'HTTP OPTIONS *', make: tcp, steps: [c('OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n')], want: 'http1' },
  { name: 'HTTP absolute-form', make: tcp, steps: [c('GET http://a/ HTTP/1.1\r\n\r\n')], want: 'http1' },
  {
    name: 'HTTP absolute-form https',
    make: tcp,
    steps: [c('GET https://a/ HTTP/1.1\r\n\r\n')],
    want: 'http1',
  },
  { name: 'HTTP CONNECT', make: tcp, steps: [c('CONNECT a:443 HTTP/1.1\r\n\r\n')], want: 'http1' },
  {
    name: 'HTTP PRI that is not the h2 preface',
    make: tcp,
    steps: [c('PRI * HTTP/1.1\r\n\r\n')],
    want: 'http1',
  },
  { name: 'WebDAV method', make: tcp, steps: [c('PROPFIND /dav HTTP/1.1\r\n\r\n')], want: 'http1' },
  { name: 'Redis RESP', make: tcp, steps: [c('*1\r\n$4\r\nPING\r\n')], want: 'redis' },
  { name: 'Redis inline PING', make: tcp, steps: [c('PING\r\n')], want: 'redis' },
  { name: 'Redis inline GET (not a path)', make: tcp, steps: [c('GET somekey\r\n')], want: 'redis' },
  { name: 'Redis inline lower case', make: tcp, steps: [c('set k v\r\n')], want: 'redis' },
  {
    name: 'Redis HELLO (a RESP array)',
    make: tcp,
    steps: [c('*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n')],
    want: 'redis',
  },
  {
    name: 'a plain "hello" line is not Redis',
    make: tcp,
    steps: [c('hello\r\n')],
    want: 'unknown',
    done: true,
  },
  { name: 'nor is "HELLO there"', make: tcp, steps: [c('HELLO there\n')], want: 'unknown', done: true },
  { name: 'Postgres StartupMessage', make: tcp, steps: [c(pgStartup)], want: 'postgres' },
  {
    name: 'Postgres SSLRequest',
    make: tcp,
    steps: [c(Buffer.from('0000000804d2162f', 'hex'))],
    want: 'postgres',
  },
  {
    name: 'DNS over TCP',
    make: tcp,
    steps: [c(Buffer.concat([Buffer.from([0, dnsQuery.length]), dnsQuery]))],
    want: 'dns',
  },
  { name: 'MySQL greeting (server first)', make: tcp, steps: [s(mysqlGreeting)], want: 'mysql' },
  {
    name: 'SSH banner from the server',
    make: tcp,
    steps: [s('SSH-2.0-OpenSSH_9.6\r\n')],
    want: 'unknown',
    done: true,
  },
  {
    name: 'SSH banner from the client',
    make: tcp,
    steps: [c('SSH-2.0-OpenSSH_9.6\r\n')],
    want: 'unknown',
    done: true,
  },
  { name: 'SMTP-like text', make: tcp, steps: [c('EHLO mail.example\r\n')], want: 'unknown', done: true },
  {
    name: 'lower-case method is not HTTP',
    make: tcp,
    steps: [c('post / HTTP/1.1\r\n')],
    want: 'unknown',
    done: true,
  },
  {
    name: 'binary',
    make: tcp,
    steps: [c(Buffer.from('deadbeef'.repeat(4), 'hex'))],
    want: 'unknown',
    done: true,
  },
  {
    name: 'too few bytes to tell',
    make: tcp,
    steps: [c(Buffer.from('deadbeef', 'hex'))],
    want: 'unknown',
    done: false,
  },
  { name: 'UDP DNS query', make: udp, steps: [c(dnsQuery)], want: 'dns' },
  { name: 'UDP DNS query with EDNS', make: udp, steps: [c(dnsQueryEdns)], want: 'dns' },
  {
    name: 'UDP DNS response from a client is not a query',
    make: udp,
    steps: [c(Buffer.from(dnsQuery).fill(0x81, 2, 3))],
    want: 'unknown',
  },
  {
    name: 'UDP QUIC long header',
    make: udp,
    steps: [c(Buffer.from('c300000001088394c8f03e5157080000449e', 'hex'))],
    want: 'unknown',
  },
];

for (const k of cases) {
  test(`classify: ${k.name}`, () => {
    const sn = k.make();
    const info = replay(sn, k.steps);
    assert.equal(info.protocol, k.want, JSON.stringify(info));
    if (k.done !== undefined) assert.equal(sn.done, k.done);
    // Byte by byte: same classification and same info.
    assert.deepStrictEqual(replay(k.make(), k.steps, k.make === udp ? (b) => [b] : bytewise), info);
  });
}

test('startSniffer: the same info, events and done as createSniffer, for every case and chunking', () => {
  const conversations: { name: string; transport: 'tcp' | 'udp'; steps: Step[] }[] = cases.map((k) => ({
    name: k.name,
    transport: k.make === udp ? 'udp' : 'tcp',
    steps: k.steps,
  }));
  conversations.push(
    {
      name: 'HTTP exchange, then a second request',
      transport: 'tcp',
      steps: [
        c('GET /a?x=1 HTTP/1.1\r\nHost: shop\r\n\r\n'),
        s('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok'),
        c('POST /b HTTP/1.1\r\nHost: shop\r\nContent-Length: 3\r\n\r\nabc'),
        s('HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n'),
      ],
    },
    {
      name: 'server speaks while the client is undecided',
      transport: 'tcp',
      steps: [c('GE'), s('HTTP/1.1 408 Request Timeout\r\n\r\n'), c('T / HTTP/1.1\r\n\r\n')],
    },
    { name: 'UDP reply before any query is ignored', transport: 'udp', steps: [s(dnsQuery), c(dnsQuery)] },
    {
      name: 'UDP query and response',
      transport: 'udp',
      steps: [c(dnsQuery), s(Buffer.from(dnsQuery).fill(0x81, 2, 3))],
    },
    {
      name: 'an empty chunk first',
      transport: 'tcp',
      steps: [c(Buffer.alloc(0)), c('GET / HTTP/1.1\r\n\r\n')],
    },
  );
  const rand = prng(5);
  for (const conv of conversations) {
    const splits: ((b: Buffer) => Buffer[])[] =
      conv.transport === 'udp' ? [(b) => [b]] : [(b) => [b], bytewise, (b) => randomChunks(rand, b)];
    for (const split of splits) {
      const wantEvents: SniffEvent[] = [];
      const want = createSniffer({ protocol: conv.transport, onEvent: (e) => wantEvents.push(e) });
      const gotEvents: SniffEvent[] = [];
      const got = started(conv.transport, gotEvents);
      // Chunk by chunk in lockstep: done must agree at every point, since the relay stops on it.
      for (const step of conv.steps) {
        for (const part of split(step.bytes)) {
          for (const sn of [want, got]) {
            if (sn.done) continue;
            if (step.from === 'client') sn.onClientData(Buffer.from(part), 1000);
            else sn.onEndpointData(Buffer.from(part), 1000);
          }
          assert.equal(got.done, want.done, conv.name);
        }
      }
      assert.deepStrictEqual(got.info(), want.info(), conv.name);
      assert.deepStrictEqual(gotEvents, wantEvents, conv.name);
    }
  }
});

test('startSniffer: a first chunk that decides gives that protocol its own sniffer, no classifier', () => {
  const limits = sniffLimits();
  const http = startSniffer(limits, 'tcp', true, Buffer.from('GET / HTTP/1.1\r\n'), 1);
  assert.equal(http?.constructor.name, 'Http1Sniffer');
  const mysql = startSniffer(limits, 'tcp', false, mysqlGreeting, 1);
  assert.equal(mysql?.constructor.name, 'MysqlSniffer');
  // Nothing recognisable: one shared sniffer that is done and says so.
  const a = startSniffer(limits, 'tcp', true, Buffer.from('SSH-2.0-OpenSSH_9.6\r\n'), 1);
  const b = startSniffer(limits, 'udp', true, Buffer.from('deadbeef', 'hex'), 1);
  assert.equal(a, b);
  assert.equal(a?.done, true);
  assert.deepEqual(a?.info(), { protocol: 'unknown', reason: 'unrecognized' });
  // Too few bytes to tell: the classifier holds them.
  const undecided = startSniffer(limits, 'tcp', true, Buffer.from('GE'), 1)!;
  assert.deepEqual(undecided.info(), { protocol: 'unknown', reason: 'incomplete' });
  undecided.onClientData(Buffer.from('T /x HTTP/1.1\r\n\r\n'), 2);
  assert.equal(undecided.info().protocol, 'http1');
  assert.equal(startSniffer(limits, 'tcp', true, Buffer.alloc(0), 1), undefined);
});

test('classify: a real ClientHello is TLS whatever the chunking', async () => {
  const hello = await captureClientBytes(
    (port) => {
      const sock = tls.connect({ host: '127.0.0.1', port, servername: 'classify.test' });
      sock.on('error', () => {});
      return sock;
    },
    (got) => got.length >= 5 && got.length >= 5 + got.readUInt16BE(3),
  );
  for (const split of [(b: Buffer) => [b], bytewise, (b: Buffer) => [b.subarray(0, 2), b.subarray(2)]]) {
    const info = replay(tcp(), [c(hello)], split);
    assert.equal(info.protocol, 'tls');
    assert.equal(info.protocol === 'tls' && info.sni, 'classify.test');
  }
});

test('classify: nothing yet, too little yet, then decided', () => {
  const sn = tcp();
  assert.deepEqual(sn.info(), { protocol: 'unknown', reason: 'no-data' });
  sn.onClientData(Buffer.from('GE'), 1);
  assert.deepEqual([sn.info(), sn.done], [{ protocol: 'unknown', reason: 'incomplete' }, false]);
  // The server speaking while the client is undecided: held, then replayed after the client's bytes.
  sn.onEndpointData(Buffer.from('HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n'), 2);
  sn.onClientData(Buffer.from('T /late HTTP/1.1\r\nHost: h\r\n\r\n'), 3);
  const info = sn.info();
  assert.equal(info.protocol, 'http1');
  assert.equal(info.protocol === 'http1' && info.exchanges[0]?.path, '/late');

  const overflow = tcp();
  overflow.onClientData(Buffer.from('*'), 1);
  overflow.onEndpointData(Buffer.alloc(5000), 2);
  assert.deepEqual([overflow.info(), overflow.done], [{ protocol: 'unknown', reason: 'incomplete' }, true]);
});

test('classify: fuzz with random first bytes on both sides never throws and settles', () => {
  const rand = prng(77);
  const seeds = [
    Buffer.from(H2_PREFACE),
    Buffer.from('GET / HTTP/1.1\r\n'),
    pgStartup,
    mysqlGreeting,
    dnsQuery,
  ];
  const deadline = Date.now() + 5000;
  for (let i = 0; i < 2000 && Date.now() < deadline; i++) {
    const sn = i % 5 === 0 ? udp() : tcp();
    const seed = seeds[i % seeds.length]!;
    const first =
      rand() < 0.5
        ? randomBytes(rand, 1 + Math.floor(rand() * 64))
        : Buffer.concat([seed.subarray(0, Math.floor(rand() * seed.length)), randomBytes(rand, 16)]);
    const fromServer = rand() < 0.3;
    for (const part of randomChunks(rand, first)) {
      if (fromServer) sn.onEndpointData(part, i);
      else sn.onClientData(part, i);
    }
    for (const part of randomChunks(rand, randomBytes(rand, 256))) {
      if (sn.done) break;
      if (fromServer) sn.onClientData(part, i);
      else sn.onEndpointData(part, i);
    }
    const info: AppInfo = sn.info();
    assert.ok(typeof info.protocol === 'string');
    if (first.length >= 32 && info.protocol === 'unknown') assert.equal(sn.done, true);
  }
});

test('memory stays bounded: sniffers fed 1 MiB of worst-case input each hold a few KiB', () => {
  const mib = Buffer.alloc(1 << 20, 0x61); // shared input: not counted against the sniffers
  const starts: Buffer[] = [
    Buffer.from('GET /'), // then a request line that never ends
    Buffer.from([0x16, 0x03, 0x01, 0x40, 0x00, 0x01, 0x00, 0x3f, 0x00]), // a 16 KiB hello, never finished
    Buffer.from('POST / HTTP/1.1\r\nHost: h\r\nCookie: '), // a header that never ends
    Buffer.from('*2\r\n$3\r\nSET\r\n$9999999\r\n'), // a huge Redis value
  ];
  const sniffers: Sniffer[] = [];
  const before = process.memoryUsage().arrayBuffers;
  for (let i = 0; i < 100; i++) {
    const sn = tcp();
    sn.onClientData(starts[i % starts.length]!, 0);
    // Small chunks force the copying paths.
    for (let off = 0; off < mib.length && !sn.done; off += 1000)
      sn.onClientData(mib.subarray(off, off + 1000), 0);
    sniffers.push(sn);
  }
  const grown = process.memoryUsage().arrayBuffers - before;
  assert.ok(grown < 100 * 40 * 1024, `grew ${grown} bytes for 100 sniffers`);
  assert.equal(sniffers.length, 100);
});
