import assert from 'node:assert/strict';
import { test } from 'node:test';
import { setFlagsFromString } from 'node:v8';
import { isProxyError } from '../../../src/lib/errors.ts';
import { silentLogger } from '../../../src/lib/log.ts';
import { parsePortRange } from '../../../src/lib/port-range.ts';
import {
  parseLocalPortRange,
  parseReservedPorts,
  readEphemeralPorts,
} from '../../../src/proxier/ephemeral-ports.ts';
import { createPortAllocator, PortAllocator, proxyPortOffset } from '../../../src/proxier/port-allocator.ts';

const goodRanges = [
  { name: 'empty', input: '', want: { base: 0, size: 0 } },
  { name: 'zero', input: '0', want: { base: 0, size: 0 } },
  { name: 'zero range', input: '0-0', want: { base: 0, size: 0 } },
  { name: 'single', input: '30000', want: { base: 30000, size: 1 } },
  { name: 'dash', input: '30000-30009', want: { base: 30000, size: 10 } },
  { name: 'plus', input: '30000+9', want: { base: 30000, size: 10 } },
  { name: 'whole', input: '1-65535', want: { base: 1, size: 65535 } },
  { name: 'spaces', input: ' 100-101 ', want: { base: 100, size: 2 } },
];
for (const c of goodRanges) {
  test(`parsePortRange: ${c.name}`, () => assert.deepEqual(parsePortRange(c.input), c.want));
}

const badRanges = ['abc', '100-', '-100', '200-100', '0-100', '65000+1000', '70000', '1,2', '100-200-300'];
for (const input of badRanges) {
  test(`parsePortRange rejects "${input}"`, () => {
    assert.throws(
      () => parsePortRange(input),
      (err) => isProxyError(err, 'KUP_ERR_PORT_RANGE_INVALID'),
    );
  });
}

// Expected values from `printf %s KEY | sha1sum`: the first 8 hex digits, modulo the size. The README
// documents this, so a user can work out a port by hand; it must never change.
const offsets = [
  { name: 'demo http in the demo range', key: 'demo/echo:http/TCP', size: 20, want: 0xaecdc808 % 20 },
  { name: 'demo udp in the demo range', key: 'demo/echo:udp/UDP', size: 20, want: 0xa8a1dfed % 20 },
  { name: 'ephemeral range', key: 'demo/echo:http/TCP', size: 28232, want: 9744 },
  { name: 'a service port', key: 'default/web:http/TCP', size: 1000, want: 0x89304047 % 1000 },
  { name: 'its local listener', key: 'default/web:http/TCP/local', size: 1000, want: 0x2ced922e % 1000 },
  { name: 'one port', key: 'default/web:http/TCP', size: 1, want: 0 },
  { name: 'empty range', key: 'default/web:http/TCP', size: 0, want: 0 },
];
for (const c of offsets) {
  test(`proxyPortOffset: ${c.name}`, () => assert.equal(proxyPortOffset(c.key, c.size), c.want));
}

test('proxyPortOffset spreads keys evenly over a range', () => {
  const size = 16;
  const counts = new Array<number>(size).fill(0);
  for (let i = 0; i < 16_000; i++) counts[proxyPortOffset(`default/svc-${i}:http/TCP`, size)]!++;
  // 1,000 expected per port; 5 standard deviations is ±150.
  for (const n of counts) assert.ok(n > 850 && n < 1150, `counts ${counts.join(',')}`);
});

test('the scan starts at the hashed offset, goes up and wraps, skipping used and avoided ports', () => {
  const at: Record<string, number> = { a: 8, b: 8, c: 9, d: 9 };
  const a = new PortAllocator(parsePortRange('100-109'), (key) => at[key]!);
  assert.equal(a.allocateNext('a'), 108);
  assert.equal(a.allocateNext('b'), 109, 'b collides with a: the next port');
  assert.equal(a.allocateNext('c'), 100, 'c collides with b: wraps to the start');
  assert.equal(a.allocateNext('d', new Set([101, 102])), 103);
});

test('a key gets the same port whatever other keys exist, unless they collide with it', () => {
  const range = parsePortRange('30000-30999');
  const keys = Array.from({ length: 20 }, (_, i) => `ns/svc-${i}:p/TCP`);
  const alone = new Map(keys.map((k) => [k, new PortAllocator(range).allocateNext(k)]));
  const together = new PortAllocator(range);
  const wanted = new Map<number, number>();
  for (const k of keys) wanted.set(alone.get(k)!, (wanted.get(alone.get(k)!) ?? 0) + 1);
  for (const k of [...keys].sort()) {
    const port = together.allocateNext(k);
    if (wanted.get(alone.get(k)!) === 1) assert.equal(port, alone.get(k), k);
  }
});

test('allocator hands out every port of the range once, then reports exhaustion', () => {
  const a = new PortAllocator(parsePortRange('40000-40009'));
  const got = new Set<number>();
  for (let i = 0; i < 10; i++) got.add(a.allocateNext(`k${i}`));
  assert.equal(got.size, 10);
  for (const p of got) assert.ok(p >= 40000 && p <= 40009);
  assert.equal(a.free, 0);
  assert.equal(a.next('k'), undefined);
  assert.throws(
    () => a.allocateNext('k'),
    (err) => isProxyError(err, 'KUP_ERR_PORT_RANGE_EXHAUSTED'),
  );
  a.release(40003);
  assert.equal(a.allocateNext('k'), 40003);
});

test('kernel-chosen allocator without a range returns 0 and ignores releases', () => {
  const a = new PortAllocator(parsePortRange(''));
  assert.ok(a.isKernelChosen);
  assert.equal(a.allocateNext('k'), 0);
  a.release(12345);
  assert.equal(a.allocateNext('k'), 0);
});

test('kernel-chosen allocator over the ephemeral range: hashed ports, reserved ones never, then 0', () => {
  const a = new PortAllocator({ base: 100, size: 4 }, () => 1, {
    kernelChosen: true,
    reserved: [{ base: 102, size: 1 }],
  });
  assert.equal(a.free, 3);
  assert.equal(a.allocateNext('a'), 101);
  assert.equal(a.allocateNext('b'), 103, '102 is reserved');
  assert.ok(!a.allocate(102), 'a reserved port cannot be claimed');
  assert.equal(a.allocateNext('c'), 100);
  assert.equal(a.allocateNext('d'), 0, 'none left: the kernel chooses');
  a.release(102);
  assert.equal(a.free, 0, 'releasing a reserved port frees nothing');
});

test('allocate() claims a specific port once', () => {
  const a = new PortAllocator(parsePortRange('100-101'));
  assert.ok(a.allocate(101));
  assert.ok(!a.allocate(101));
  assert.ok(!a.allocate(99));
  assert.equal(a.allocateNext('k'), 100);
  a.release(101);
  a.release(101);
  assert.equal(a.free, 1);
});

const localRanges = [
  { name: 'tab separated', input: '32768\t60999\n', want: { base: 32768, size: 28232 } },
  { name: 'spaces', input: ' 1024   65535 ', want: { base: 1024, size: 64512 } },
  { name: 'reversed', input: '60999 32768', want: undefined },
  { name: 'one number', input: '32768', want: undefined },
  { name: 'zero', input: '0 100', want: undefined },
  { name: 'garbage', input: 'x y', want: undefined },
];
for (const c of localRanges) {
  test(`parseLocalPortRange: ${c.name}`, () => assert.deepEqual(parseLocalPortRange(c.input), c.want));
}

const reserved = [
  { name: 'empty', input: '\n', want: [] },
  { name: 'one port', input: '40000\n', want: [{ base: 40000, size: 1 }] },
  {
    name: 'ranges and ports',
    input: '30000-32767,40000\n',
    want: [
      { base: 30000, size: 2768 },
      { base: 40000, size: 1 },
    ],
  },
  { name: 'malformed items skipped', input: 'x,5-3,70000,7', want: [{ base: 7, size: 1 }] },
];
for (const c of reserved) {
  test(`parseReservedPorts: ${c.name}`, () => assert.deepEqual(parseReservedPorts(c.input), c.want));
}

test('readEphemeralPorts: both files, no reserved file, no /proc', () => {
  const files: Record<string, string> = {
    '/proc/sys/net/ipv4/ip_local_port_range': '32768\t60999\n',
    '/proc/sys/net/ipv4/ip_local_reserved_ports': '40000-40009\n',
  };
  const read = (path: string) => {
    const text = files[path];
    if (text === undefined) throw Object.assign(new Error(`ENOENT ${path}`), { code: 'ENOENT' });
    return text;
  };
  assert.deepEqual(readEphemeralPorts(read), {
    range: { base: 32768, size: 28232 },
    reserved: [{ base: 40000, size: 10 }],
  });
  delete files['/proc/sys/net/ipv4/ip_local_reserved_ports'];
  assert.deepEqual(readEphemeralPorts(read)?.reserved, []);
  assert.equal(
    readEphemeralPorts(() => {
      throw new Error('ENOENT');
    }),
    undefined,
  );
});

test('createPortAllocator: a range is used as given; "" hashes into the ephemeral range, else the kernel', () => {
  const ephemeral = { range: { base: 32768, size: 28232 }, reserved: [] };
  const ranged = createPortAllocator(parsePortRange('30000-30099'), silentLogger(), () => ephemeral);
  assert.deepEqual(ranged.range, { base: 30000, size: 100 });
  assert.ok(!ranged.isKernelChosen);
  const hashed = createPortAllocator(parsePortRange(''), silentLogger(), () => ephemeral);
  assert.ok(hashed.isKernelChosen);
  assert.equal(hashed.allocateNext('demo/echo:http/TCP'), 32768 + 9744);
  const unknown = createPortAllocator(parsePortRange(''), silentLogger(), () => undefined);
  assert.equal(unknown.range.size, 0);
  assert.equal(unknown.allocateNext('demo/echo:http/TCP'), 0);
});

test('the ports handed out are small integers to V8, not boxed doubles (a field holding one stays unboxed)', () => {
  setFlagsFromString('--allow-natives-syntax');
  const isSmi = new Function('x', 'return %IsSmi(x)') as (x: number) => boolean;
  const alloc = new PortAllocator(parsePortRange('20000-31999')!);
  for (let i = 0; i < 20; i++) {
    const key = `ns/svc-${i}:http/TCP`;
    assert.ok(isSmi(proxyPortOffset(key, 12_000)), key);
    assert.ok(isSmi(alloc.next(key)!), key);
  }
});
