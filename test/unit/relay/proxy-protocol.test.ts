import assert from 'node:assert/strict';
import test from 'node:test';
import { proxyProtocolHeader, V2_SIGNATURE } from '../../../src/relay/proxy-protocol.ts';
import { parseProxyHeader } from '../../helpers/proxy-protocol-parser.ts';

// The examples of proxy-protocol.txt §2.1, byte for byte.
test('v1: the specification examples (TCP4, TCP6 at its longest, UNKNOWN)', () => {
  assert.equal(
    proxyProtocolHeader('v1', '192.168.0.1', 56324, '192.168.0.11', 443).toString('latin1'),
    'PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n',
  );
  const ff = 'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff';
  const longest = proxyProtocolHeader('v1', ff, 65535, ff, 65535).toString('latin1');
  assert.equal(longest, `PROXY TCP6 ${ff} ${ff} 65535 65535\r\n`);
  assert.equal(longest.length, 104, 'the worst case of §2.1 (107 with the optional fields it counts)');
  assert.equal(
    proxyProtocolHeader('v1', '10.0.0.1', 1, '2001:db8::1', 2).toString('latin1'),
    'PROXY UNKNOWN\r\n',
  );
  assert.equal(proxyProtocolHeader('v1', '', 0, '', 0).toString('latin1'), 'PROXY UNKNOWN\r\n');
});

test('v2 IPv4: signature, version 2 PROXY, TCP over IPv4, length 12, addresses and ports in network order', () => {
  const h = proxyProtocolHeader('v2', '192.168.0.1', 56324, '10.96.0.10', 443);
  assert.deepEqual(
    [...h],
    [
      ...V2_SIGNATURE,
      0x21, // \x2 version, \x1 PROXY
      0x11, // AF_INET, STREAM
      0x00,
      0x0c, // 12 bytes follow
      192,
      168,
      0,
      1,
      10,
      96,
      0,
      10,
      0xdc,
      0x04, // 56324
      0x01,
      0xbb, // 443
    ],
  );
  assert.equal(
    V2_SIGNATURE.toString('hex'),
    '0d0a0d0a000d0a515549540a',
    '\\x0D\\x0A\\x0D\\x0A\\x00\\x0D\\x0A\\x51\\x55\\x49\\x54\\x0A',
  );
});

test('v2 IPv6: TCP over IPv6, length 36, compressed and embedded-IPv4 forms expanded', () => {
  const h = proxyProtocolHeader('v2', '2001:db8::7', 40000, 'fd00::a:1.2.3.4', 80);
  assert.equal(h.length, 16 + 36);
  assert.equal(h[12], 0x21);
  assert.equal(h[13], 0x21, 'AF_INET6, STREAM');
  assert.equal(h.readUInt16BE(14), 36);
  assert.equal(h.subarray(16, 32).toString('hex'), '20010db8000000000000000000000007');
  assert.equal(h.subarray(32, 48).toString('hex'), 'fd000000000000000000000a01020304');
  assert.equal(h.readUInt16BE(48), 40000);
  assert.equal(h.readUInt16BE(50), 80);
});

test('v2 unknown: families that differ give AF_UNSPEC with no address block', () => {
  const h = proxyProtocolHeader('v2', '10.0.0.1', 1, '::1', 2);
  assert.deepEqual([...h.subarray(12)], [0x21, 0x00, 0x00, 0x00]);
});

test('an independent reader reads back what was written, v1 and v2, both families', () => {
  const cases: [string, number, string, number][] = [
    ['10.244.1.5', 51234, '10.96.0.1', 443],
    ['203.0.113.9', 1, '198.51.100.20', 30080],
    ['2001:db8::5', 65535, 'fd00:10:96::1', 8080],
    ['::1', 2, '::1', 3],
  ];
  for (const version of ['v1', 'v2'] as const)
    for (const [src, sp, dst, dp] of cases) {
      const bytes = Buffer.concat([
        proxyProtocolHeader(version, src, sp, dst, dp),
        Buffer.from('GET / HTTP/1.1\r\n'),
      ]);
      const parsed = parseProxyHeader(bytes);
      assert.ok(parsed !== undefined);
      assert.deepEqual(
        [
          parsed.header.source,
          parsed.header.sourcePort,
          parsed.header.destination,
          parsed.header.destinationPort,
        ],
        [src, sp, dst, dp],
        `${version} ${src}`,
      );
      assert.equal(
        bytes.subarray(parsed.length).toString(),
        'GET / HTTP/1.1\r\n',
        'the client bytes follow untouched',
      );
    }
});
