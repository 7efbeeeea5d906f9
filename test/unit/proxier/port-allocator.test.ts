import assert from 'node:assert/strict';
import { test } from 'node:test';
import { isProxyError } from '../../../src/lib/errors.ts';
import { parsePortRange } from '../../../src/lib/port-range.ts';
import { PortAllocator } from '../../../src/proxier/port-allocator.ts';

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

test('allocator hands out every port of the range once, then reports exhaustion', () => {
  const a = new PortAllocator(parsePortRange('40000-40009'));
  const got = new Set<number>();
  for (let i = 0; i < 10; i++) got.add(a.allocateNext());
  assert.equal(got.size, 10);
  for (const p of got) assert.ok(p >= 40000 && p <= 40009);
  assert.equal(a.free, 0);
  assert.throws(
    () => a.allocateNext(),
    (err) => isProxyError(err, 'KUP_ERR_PORT_RANGE_EXHAUSTED'),
  );
  a.release(40003);
  assert.equal(a.allocateNext(), 40003);
});

test('allocator starts at a random offset and skips ports to avoid', () => {
  const a = new PortAllocator(parsePortRange('100-109'), () => 0.5);
  assert.equal(a.allocateNext(), 105);
  assert.equal(a.allocateNext(new Set([106, 107])), 108);
});

test('kernel-chosen allocator returns 0 and ignores releases', () => {
  const a = new PortAllocator(parsePortRange(''));
  assert.ok(a.isKernelChosen);
  assert.equal(a.allocateNext(), 0);
  a.release(12345);
  assert.equal(a.allocateNext(), 0);
});

test('allocate() claims a specific port once', () => {
  const a = new PortAllocator(parsePortRange('100-101'));
  assert.ok(a.allocate(101));
  assert.ok(!a.allocate(101));
  assert.ok(!a.allocate(99));
  assert.equal(a.allocateNext(), 100);
  a.release(101);
  a.release(101);
  assert.equal(a.free, 1);
});
