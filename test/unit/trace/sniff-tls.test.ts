import assert from 'node:assert/strict';
import type net from 'node:net';
import { type TestContext, test } from 'node:test';
import tls from 'node:tls';
import v8 from 'node:v8';
import { createSniffer, sniffLimits, startSniffer } from '../../../src/trace/sniff/classify.ts';
import { TlsSniffer } from '../../../src/trace/sniff/tls.ts';
import type { Sniffer, TlsInfo } from '../../../src/trace/sniff/types.ts';
import { collectGarbage } from '../../helpers/heap.ts';
import {
  assertSplitInvariant,
  bytewise,
  captureClientBytes,
  merge,
  mutate,
  prng,
  randomBytes,
  randomChunks,
  recordConversation,
  replay,
  type Step,
} from '../../helpers/sniff.ts';

const tlsInfo = (info: unknown): TlsInfo => {
  assert.equal((info as TlsInfo).protocol, 'tls');
  return info as TlsInfo;
};

/** The first TLS record (plus any following ones) a real tls.connect sends. */
async function captureClientHello(options: tls.ConnectionOptions): Promise<Buffer> {
  return captureClientBytes(
    (port) => {
      const sock = tls.connect({ host: '127.0.0.1', port, ...options });
      sock.on('error', () => {});
      return sock;
    },
    (got) => got.length >= 5 && got.length >= 5 + got.readUInt16BE(3),
  );
}

/** Re-cuts one handshake message into records of at most `size` bytes (as a fragmenting client may). */
function refragment(record: Buffer, size: number): Buffer {
  const body = record.subarray(5, 5 + record.readUInt16BE(3));
  const out: Buffer[] = [];
  for (let i = 0; i < body.length; i += size) {
    const part = body.subarray(i, i + size);
    const h = Buffer.from([0x16, 0x03, 0x01, 0, 0]);
    h.writeUInt16BE(part.length, 3);
    out.push(h, part);
  }
  return Buffer.concat(out);
}

/** A TLS 1.3-style ServerHello record picking `version` (RFC 8446 §4.1.3), hand-built. */
function serverHello(version: number, alpn?: string): Buffer {
  const exts: Buffer[] = [Buffer.from([0x00, 0x2b, 0x00, 0x02, version >> 8, version & 0xff])];
  if (alpn !== undefined) {
    const p = Buffer.from(alpn);
    exts.push(Buffer.from([0x00, 0x10, 0x00, p.length + 3, 0x00, p.length + 1, p.length]), p);
  }
  const ext = Buffer.concat(exts);
  const body = Buffer.concat([
    Buffer.from([0x03, 0x03]),
    Buffer.alloc(32, 7), // random
    Buffer.from([0x00]), // session id
    Buffer.from([0x13, 0x01, 0x00]), // TLS_AES_128_GCM_SHA256, no compression
    Buffer.from([ext.length >> 8, ext.length & 0xff]),
    ext,
  ]);
  const hs = Buffer.concat([Buffer.from([0x02, 0, body.length >> 8, body.length & 0xff]), body]);
  return Buffer.concat([Buffer.from([0x16, 0x03, 0x03, hs.length >> 8, hs.length & 0xff]), hs]);
}

test('a real tls.connect ClientHello: SNI, ALPN, versions; split anywhere gives the same', async () => {
  const hello = await captureClientHello({
    servername: 'api.example.test',
    ALPNProtocols: ['h2', 'http/1.1'],
  });
  const steps: Step[] = [{ from: 'client', bytes: hello }];
  const info = tlsInfo(
    assertSplitInvariant(
      () => createSniffer({ protocol: 'tcp' }),
      steps,
      (g, w, how) => assert.deepStrictEqual(g, w, how),
    ),
  );
  assert.equal(info.sni, 'api.example.test');
  assert.deepEqual(info.alpn, ['h2', 'http/1.1']);
  assert.equal(info.legacyVersion, 'TLS1.2');
  assert.ok(info.supportedVersions.includes('TLS1.3'), JSON.stringify(info.supportedVersions));
  assert.deepEqual([info.complete, info.tooLarge, info.malformed], [true, false, false]);

  // The same hello cut into 64-byte records, fed byte by byte.
  const fragmented = refragment(hello, 64);
  assert.ok(fragmented.length > hello.length);
  assert.deepStrictEqual(
    replay(createSniffer({ protocol: 'tcp' }), [{ from: 'client', bytes: fragmented }], bytewise),
    info,
  );

  // Every truncation: no throw, never complete, and the SNI shows up once its extension has arrived.
  let sawSniBeforeEnd = false;
  for (let cut = 0; cut < hello.length; cut++) {
    const part = replay(createSniffer({ protocol: 'tcp' }), [
      { from: 'client', bytes: hello.subarray(0, cut) },
    ]);
    if (part.protocol === 'tls') {
      assert.equal(part.complete, false);
      if (part.sni === 'api.example.test') sawSniBeforeEnd = true;
      else assert.equal(part.sni, undefined);
    }
  }
  assert.ok(sawSniBeforeEnd, 'a truncated hello still yields the SNI it carries');
});

/** A real TLS 1.2 handshake (PSK, no certificate) on loopback, both directions as they went by. */
async function pskHandshake(t: TestContext): Promise<Step[]> {
  const psk = Buffer.from('000102030405060708090a0b0c0d0e0f', 'hex');
  const ciphers = 'PSK-AES128-GCM-SHA256';
  const server = tls.createServer(
    { pskCallback: () => psk, ciphers, ALPNProtocols: ['h2', 'http/1.1'], maxVersion: 'TLSv1.2' },
    (sock) => sock.end('hello'),
  );
  t.after(() => server.close());
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const steps = await recordConversation(
    (server.address() as net.AddressInfo).port,
    (port) =>
      new Promise<void>((resolve, reject) => {
        const sock = tls.connect(
          {
            host: '127.0.0.1',
            port,
            servername: 'db.example.test',
            ALPNProtocols: ['http/1.1', 'h2'],
            ciphers,
            maxVersion: 'TLSv1.2',
            pskCallback: () => ({ psk, identity: 'client-1' }),
            checkServerIdentity: () => undefined,
          },
          () => sock.end(),
        );
        sock.on('data', () => {});
        sock.on('end', resolve);
        sock.on('error', reject);
      }),
  );
  return merge(steps);
}

test('a real TLS 1.2 handshake (PSK, no certificate): the ServerHello picks the version and ALPN', async (t) => {
  const merged = await pskHandshake(t);
  const sn = createSniffer({ protocol: 'tcp' });
  const info = tlsInfo(replay(sn, merged));
  assert.equal(sn.done, true);
  assert.deepEqual(
    [info.sni, info.alpn, info.selectedVersion, info.selectedAlpn],
    ['db.example.test', ['http/1.1', 'h2'], 'TLS1.2', 'h2'],
  );
  assert.deepStrictEqual(replay(createSniffer({ protocol: 'tcp' }), merged, bytewise), info);
});

test('a connection whose handshake was seen keeps the fields of the hellos only (< 600 B; 1,150 with the readers kept), even when the hellos came in pieces', async (t) => {
  const merged = await pskHandshake(t);
  const limits = sniffLimits({});
  const n = 2000;
  const kept: Sniffer[] = [];
  await collectGarbage();
  const before = v8.getHeapStatistics().used_heap_size;
  for (let i = 0; i < n; i++) {
    let sn: Sniffer | undefined;
    for (const step of merged) {
      // Every other connection gets each flight in two reads: the readers copy the start of each hello.
      const cut = i % 2 === 0 ? step.bytes.length : 60;
      for (const part of [step.bytes.subarray(0, cut), step.bytes.subarray(cut)]) {
        if (part.length === 0) continue;
        const fromClient = step.from === 'client';
        if (sn === undefined) sn = startSniffer(limits, 'tcp', fromClient, part, 1);
        else if (fromClient) sn.onClientData(part, 1);
        else sn.onEndpointData(part, 1);
      }
    }
    kept.push(sn!);
  }
  await collectGarbage();
  const each = (v8.getHeapStatistics().used_heap_size - before) / n;
  const first = tlsInfo(kept[0]!.info());
  assert.equal(kept[0]!.done, true);
  assert.deepEqual(tlsInfo(kept[1]!.info()), first, 'the same facts from a handshake in pieces');
  assert.deepEqual(
    [first.sni, first.selectedVersion, first.selectedAlpn, first.complete, first.malformed],
    ['db.example.test', 'TLS1.2', 'h2', true, false],
  );
  assert.ok(each < 600, `${each.toFixed(0)} B a connection`);
});

test('ServerHello for TLS 1.3 (supported_versions) and an alert instead of a hello', async () => {
  const hello = await captureClientHello({ servername: 'x.test' });
  const v13 = tlsInfo(
    replay(new TlsSniffer(), [
      { from: 'client', bytes: hello },
      { from: 'server', bytes: serverHello(0x0304) },
    ]),
  );
  assert.deepEqual([v13.selectedVersion, v13.selectedAlpn], ['TLS1.3', undefined]);

  const sn = new TlsSniffer();
  const alerted = tlsInfo(
    replay(sn, [
      { from: 'client', bytes: hello },
      { from: 'server', bytes: Buffer.from([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28]) },
    ]),
  );
  assert.deepEqual([alerted.alert, alerted.selectedVersion, sn.done], [40, undefined, true]);
});

/** Adds a padding extension (RFC 7685) of `pad` bytes to a one-record ClientHello; returns the new record. */
function padHello(record: Buffer, pad: number): Buffer {
  const hs = Buffer.from(record.subarray(5, 5 + record.readUInt16BE(3)));
  let p = 4 + 34;
  p += 1 + hs[p]!;
  p += 2 + hs.readUInt16BE(p);
  p += 1 + hs[p]!;
  const extLen = hs.readUInt16BE(p);
  hs.writeUInt16BE(extLen + 4 + pad, p);
  const ext = Buffer.concat([Buffer.from([0x00, 0x15, pad >> 8, pad & 0xff]), Buffer.alloc(pad)]);
  const grown = Buffer.concat([hs, ext]);
  grown.writeUIntBE(grown.length - 4, 1, 3);
  const header = Buffer.from([0x16, 0x03, 0x01, 0, 0]);
  header.writeUInt16BE(grown.length, 3);
  return Buffer.concat([header, grown]);
}

test('large ClientHellos: just under 16 KiB across records is read; over 16 KiB is given up as tooLarge', async () => {
  const hello = await captureClientHello({ servername: 'big.example.test', ALPNProtocols: ['h2'] });
  const big = refragment(padHello(hello, 16384 - hello.length - 100), 4096);
  const info = tlsInfo(
    replay(createSniffer({ protocol: 'tcp' }), [{ from: 'client', bytes: big }], (b) => [b]),
  );
  assert.deepEqual(
    [info.sni, info.alpn, info.complete, info.tooLarge],
    ['big.example.test', ['h2'], true, false],
  );
  assert.deepStrictEqual(
    replay(createSniffer({ protocol: 'tcp' }), [{ from: 'client', bytes: big }], bytewise),
    info,
  );

  // A 16 KiB record announcing a 20000-byte ClientHello: known from its first 9 bytes.
  const sn = new TlsSniffer();
  sn.onClientData(Buffer.from([0x16, 0x03, 0x01, 0x40, 0x00, 0x01, 0x00, 0x4e, 0x20]), 1);
  sn.onClientData(Buffer.alloc(0x4000 - 4), 1);
  const over = tlsInfo(sn.info());
  assert.deepEqual([over.tooLarge, over.complete, over.sni], [true, false, undefined]);
  const tooBig = tlsInfo(
    replay(new TlsSniffer(), [
      { from: 'client', bytes: refragment(padHello(hello, 16384 - hello.length + 100), 4096) },
    ]),
  );
  assert.equal(tooBig.tooLarge, true);
});

test('garbage after a TLS-looking start: malformed, never a throw', () => {
  for (const bytes of [
    Buffer.from([0x16, 0x03, 0x01, 0x00, 0x00]), // empty record
    Buffer.from([0x16, 0x03, 0x01, 0x00, 0x05, 0x02, 0x00, 0x00, 0x01, 0x00]), // a ServerHello from the client
    Buffer.from([0x16, 0x03, 0x01, 0x00, 0x06, 0x01, 0x00, 0x00, 0x02, 0x03, 0x03, 0x17, 0x03]), // then app data
  ]) {
    const sn = createSniffer({ protocol: 'tcp' });
    sn.onClientData(bytes, 1);
    assert.equal(tlsInfo(sn.info()).malformed, true, bytes.toString('hex'));
  }
});

test('fuzz: random and mutated hellos never throw and stay bounded', async () => {
  const hello = await captureClientHello({ servername: 'fuzz.example.test', ALPNProtocols: ['h2'] });
  const rand = prng(1234);
  const deadline = Date.now() + 5000;
  for (let i = 0; i < 2000 && Date.now() < deadline; i++) {
    const sn = i % 2 === 0 ? new TlsSniffer() : createSniffer({ protocol: 'tcp' });
    const bytes =
      i % 3 === 0
        ? Buffer.concat([Buffer.from([0x16, 0x03, 0x01]), randomBytes(rand, 200)])
        : mutate(rand, hello);
    for (const part of randomChunks(rand, bytes)) sn.onClientData(part, i);
    for (const part of randomChunks(rand, mutate(rand, serverHello(0x0304, 'h2'))))
      sn.onEndpointData(part, i);
    const info = sn.info();
    if (info.protocol === 'tls') {
      assert.ok(info.alpn.length <= 16);
      assert.ok(info.sni === undefined || info.sni.length <= 255);
    }
  }
});
