import assert from 'node:assert/strict';
import dgram from 'node:dgram';
import { Resolver } from 'node:dns/promises';
import { test } from 'node:test';
import { createSniffer } from '../../../src/trace/sniff/classify.ts';
import { DnsSniffer, dnsRcodeName, dnsTypeName, parseDnsMessage } from '../../../src/trace/sniff/dns.ts';
import type { DnsInfo, SniffEvent } from '../../../src/trace/sniff/types.ts';
import {
  assertSplitInvariant,
  bytewise,
  mutate,
  prng,
  randomBytes,
  randomChunks,
  replay,
  type Step,
  truncated,
} from '../../helpers/sniff.ts';

const limits = { maxRequests: 16, keepCounting: false, onEvent: undefined };

/** A name in wire format (RFC 1035 §3.1). */
function wireName(name: string): Buffer {
  const parts = name === '' ? [] : name.split('.');
  return Buffer.concat([
    ...parts.map((l) => Buffer.concat([Buffer.from([l.length]), Buffer.from(l)])),
    Buffer.from([0]),
  ]);
}

/** A standard query (RFC 1035 §4.1): RD set, one question, class IN. */
function query(id: number, name: string, qtype: number): Buffer {
  const h = Buffer.alloc(12);
  h.writeUInt16BE(id, 0);
  h.writeUInt16BE(0x0100, 2); // RD
  h.writeUInt16BE(1, 4);
  return Buffer.concat([h, wireName(name), Buffer.from([qtype >> 8, qtype & 0xff, 0, 1])]);
}

/** A response to `q`: QR, RA, `rcode`, and `answers` A records whose owner is a pointer to the question. */
function response(q: Buffer, rcode: number, answers: number): Buffer {
  const out = Buffer.from(q);
  out.writeUInt16BE(0x8180 | rcode, 2);
  out.writeUInt16BE(answers, 6);
  out.writeUInt16BE(0, 10); // drop any additional records the query announced (EDNS OPT)
  const qEnd = 12 + questionLength(q);
  const rrs: Buffer[] = [];
  for (let i = 0; i < answers; i++)
    rrs.push(Buffer.from([0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 10, 0, 0, i + 1]));
  return Buffer.concat([out.subarray(0, qEnd), ...rrs]);
}

function questionLength(q: Buffer): number {
  let p = 12;
  while (q[p] !== 0) p += 1 + q[p]!;
  return p + 1 + 4 - 12;
}

function tcpFrame(msg: Buffer): Buffer {
  return Buffer.concat([Buffer.from([msg.length >> 8, msg.length & 0xff]), msg]);
}

const dnsInfo = (info: unknown): DnsInfo => {
  assert.equal((info as DnsInfo).protocol, 'dns');
  return info as DnsInfo;
};

/** Real queries from node:dns (c-ares) to a loopback UDP server that answers with our responses. */
async function captureResolverQueries(): Promise<Buffer[]> {
  const got: Buffer[] = [];
  const server = dgram.createSocket('udp4');
  server.on('message', (msg, rinfo) => {
    got.push(Buffer.from(msg));
    const rcode = msg.includes(Buffer.from('missing')) ? 3 : 0;
    server.send(response(msg, rcode, rcode === 0 ? 1 : 0), rinfo.port, rinfo.address);
  });
  await new Promise<void>((resolve) => server.bind(0, '127.0.0.1', resolve));
  try {
    const resolver = new Resolver({ timeout: 2000, tries: 1 });
    resolver.setServers([`127.0.0.1:${server.address().port}`]);
    assert.deepEqual(await resolver.resolve4('web.default.svc.cluster.local'), ['10.0.0.1']);
    await assert.rejects(resolver.resolve6('missing.default.svc.cluster.local'), { code: 'ENOTFOUND' });
    await resolver.resolveSrv('_http._tcp.web.default.svc.cluster.local').catch(() => {});
    resolver.cancel();
  } finally {
    server.close();
  }
  return got;
}

test('parseDnsMessage: header and first question of a hand-built RFC 1035 query and its response', () => {
  const q = query(0xbeef, 'www.Example.com', 28);
  assert.deepEqual(parseDnsMessage(q), {
    id: 0xbeef,
    response: false,
    opcode: 0,
    rcode: 0,
    truncated: false,
    qdcount: 1,
    ancount: 0,
    nscount: 0,
    arcount: 0,
    qname: 'www.Example.com',
    qtype: 28,
  });
  const r = parseDnsMessage(response(q, 3, 0));
  assert.deepEqual([r?.response, r?.rcode, r?.ancount, r?.qname], [true, 3, 0, 'www.Example.com']);
  assert.equal(parseDnsMessage(query(1, '', 2))?.qname, '.');
  // Odd bytes and dots inside labels are escaped, not passed through.
  const odd = Buffer.concat([
    query(2, '', 1).subarray(0, 12),
    Buffer.from([3, 0x61, 0x2e, 0x0a, 0]),
    Buffer.from([0, 1, 0, 1]),
  ]);
  assert.equal(parseDnsMessage(odd)?.qname, 'a\\046\\010');
  // Offsets inside a bigger buffer (TCP framing) work without a copy.
  assert.equal(parseDnsMessage(tcpFrame(q), 2)?.qname, 'www.Example.com');
  assert.equal(parseDnsMessage(Buffer.alloc(11)), undefined);
});

test('type and rcode names, with numeric fallbacks', () => {
  assert.deepEqual([1, 28, 33, 12, 65, 999].map(dnsTypeName), [
    'A',
    'AAAA',
    'SRV',
    'PTR',
    'HTTPS',
    'TYPE999',
  ]);
  assert.deepEqual([0, 2, 3, 5, 23].map(dnsRcodeName), [
    'NOERROR',
    'SERVFAIL',
    'NXDOMAIN',
    'REFUSED',
    'RCODE23',
  ]);
});

test('compression pointer loops, forward pointers and out-of-bounds labels: no hang, no throw, no name', () => {
  const h = query(7, '', 1).subarray(0, 12);
  const cases = [
    Buffer.concat([h, Buffer.from([0xc0, 12, 0, 1, 0, 1])]), // points at itself
    Buffer.concat([h, Buffer.from([1, 0x61, 0xc0, 12, 0, 1, 0, 1])]), // back to its own start: a loop
    Buffer.concat([h, Buffer.from([0xc0, 20, 0, 1, 0, 1, 0, 0, 0])]), // forward
    Buffer.concat([h, Buffer.from([0xc3, 0xff])]), // far past the end
    Buffer.concat([h, Buffer.from([63, 0x61])]), // label longer than the message
    Buffer.concat([h, Buffer.from([0x40, 0x61, 0])]), // obsolete label type
    Buffer.concat([
      h,
      ...Array.from({ length: 130 }, () => Buffer.from([1, 0x61])),
      Buffer.from([0, 0, 1, 0, 1]),
    ]), // > 255
  ];
  for (const msg of cases) {
    const m = parseDnsMessage(msg);
    assert.equal(m?.qname, undefined, msg.toString('hex'));
  }
  // Two questions: the first one is reported.
  const two = Buffer.concat([
    h,
    wireName('svc.local'),
    Buffer.from([0, 1, 0, 1]),
    Buffer.from([0xc0, 12, 0, 28, 0, 1]),
  ]);
  two.writeUInt16BE(2, 4);
  assert.deepEqual([parseDnsMessage(two)?.qname, parseDnsMessage(two)?.qtype], ['svc.local', 1]);
});

test('real node:dns queries over UDP: qname, qtype, rcode, answers and latency matched by ID', async () => {
  const queries = await captureResolverQueries();
  assert.ok(queries.length >= 3, `captured ${queries.length}`);
  const events: SniffEvent[] = [];
  const sn = createSniffer({ protocol: 'udp', onEvent: (e) => events.push(e) });
  let t = 1000;
  for (const q of queries) {
    sn.onClientData(q, t);
    const rcode = q.includes(Buffer.from('missing')) ? 3 : 0;
    sn.onEndpointData(response(q, rcode, rcode === 0 ? 1 : 0), t + 3);
    t += 10;
  }
  const info = dnsInfo(sn.info());
  assert.equal(info.transport, 'udp');
  assert.deepEqual(
    info.exchanges.slice(0, 3).map((x) => [x.qname, x.qtype, x.rcode, x.answers, x.latencyMs]),
    [
      ['web.default.svc.cluster.local', 'A', 'NOERROR', 1, 3],
      ['missing.default.svc.cluster.local', 'AAAA', 'NXDOMAIN', 0, 3],
      ['_http._tcp.web.default.svc.cluster.local', 'SRV', 'NOERROR', 1, 3],
    ],
  );
  assert.deepEqual(
    [info.queries, info.responses, info.unmatched, info.malformed],
    [queries.length, queries.length, 0, 0],
  );
  assert.deepEqual(
    events.slice(0, 2).map((e) => e.type),
    ['dns-query', 'dns-response'],
  );
  // One datagram is one message: the per-datagram parser agrees with the sniffer.
  assert.equal(parseDnsMessage(queries[0]!)?.qname, 'web.default.svc.cluster.local');
});

test('DNS over TCP: length-prefixed messages split anywhere, two per chunk, responses out of order', async () => {
  const a = query(0x1111, 'a.example', 1);
  const b = query(0x2222, 'b.example', 33);
  const steps: Step[] = [
    { from: 'client', bytes: Buffer.concat([tcpFrame(a), tcpFrame(b)]) },
    { from: 'server', bytes: Buffer.concat([tcpFrame(response(b, 0, 2)), tcpFrame(response(a, 2, 0))]) },
  ];
  const info = dnsInfo(
    assertSplitInvariant(
      () => createSniffer({ protocol: 'tcp' }),
      steps,
      (g, w, how) => assert.deepStrictEqual(g, w, how),
    ),
  );
  assert.equal(info.transport, 'tcp');
  assert.deepEqual(
    info.exchanges.map((x) => [x.id, x.qname, x.qtype, x.rcode, x.answers]),
    [
      [0x1111, 'a.example', 'A', 'SERVFAIL', 0],
      [0x2222, 'b.example', 'SRV', 'NOERROR', 2],
    ],
  );
  // A response longer than the kept prefix (a big TXT answer) is skipped over, and framing stays in step.
  const big = Buffer.concat([response(a, 0, 1), Buffer.alloc(3000, 0x61)]);
  const sn = new DnsSniffer('tcp', limits);
  replay(
    sn,
    [
      { from: 'client', bytes: Buffer.concat([tcpFrame(a), tcpFrame(b)]) },
      { from: 'server', bytes: Buffer.concat([tcpFrame(big), tcpFrame(response(b, 0, 1))]) },
    ],
    bytewise,
  );
  assert.deepEqual(
    dnsInfo(sn.info()).exchanges.map((x) => x.rcode),
    ['NOERROR', 'NOERROR'],
  );
  // Truncated captures: no throw.
  for (let cut = 0; cut < 80; cut++) replay(createSniffer({ protocol: 'tcp' }), truncated(steps, cut));
});

test('bounded: maxRequests queries recorded, unanswered ones do not keep it alive forever', () => {
  const sn = new DnsSniffer('udp', { ...limits, maxRequests: 2 });
  sn.onClientData(query(1, 'a', 1), 0);
  sn.onClientData(query(2, 'b', 1), 0);
  sn.onEndpointData(response(query(1, 'a', 1), 0, 1), 1);
  assert.equal(sn.done, false); // query 2 still outstanding
  sn.onEndpointData(response(query(2, 'b', 1), 0, 1), 2);
  assert.equal(sn.done, true);
  const silent = new DnsSniffer('udp', { ...limits, maxRequests: 2 });
  for (let i = 0; i < 3; i++) silent.onClientData(query(i, 'x', 1), 0);
  assert.equal(silent.done, false);
  silent.onClientData(query(9, 'x', 1), 0);
  assert.equal(silent.done, true);
  assert.equal(dnsInfo(silent.info()).exchanges.length, 2);
  // A response nobody asked for is counted, not matched.
  const stray = new DnsSniffer('udp', limits);
  stray.onEndpointData(response(query(5, 'z', 1), 0, 0), 0);
  assert.deepEqual([dnsInfo(stray.info()).unmatched, dnsInfo(stray.info()).exchanges.length], [1, 0]);
});

test('fuzz: random datagrams and mutated real messages never throw', () => {
  const rand = prng(53);
  const q = query(0x4242, 'fuzz.default.svc.cluster.local', 1);
  const r = response(q, 0, 2);
  const deadline = Date.now() + 5000;
  for (let i = 0; i < 2000 && Date.now() < deadline; i++) {
    const bytes =
      i % 2 === 0 ? randomBytes(rand, Math.floor(rand() * 80)) : mutate(rand, i % 4 === 1 ? q : r);
    parseDnsMessage(bytes);
    const udp = createSniffer({ protocol: 'udp' });
    udp.onClientData(i % 3 === 0 ? q : bytes, i);
    udp.onEndpointData(bytes, i);
    udp.info();
    const tcp = new DnsSniffer('tcp', limits);
    for (const part of randomChunks(rand, Buffer.concat([tcpFrame(q), bytes]))) tcp.onClientData(part, i);
    for (const part of randomChunks(rand, bytes)) tcp.onEndpointData(part, i);
    tcp.info();
  }
});
