// CountedSet over either store of members (a Set, or a bit per port): a member stays until deleted as
// often as it was added, and takeChanged tells what came or went since it was last asked.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { CountedSet, PortBits } from '../../../src/lib/counted-set.ts';
import { usedHeap } from '../../helpers/heap.ts';

type Step = { op: 'add' | 'delete'; port: number; returns: boolean };

const steps: { name: string; steps: Step[]; has: number[]; changed: number[] }[] = [
  {
    name: 'added once, deleted once: gone, and gone and back is no change',
    steps: [
      { op: 'add', port: 40001, returns: true },
      { op: 'delete', port: 40001, returns: true },
    ],
    has: [],
    changed: [],
  },
  {
    name: 'added three times: stays until the third delete',
    steps: [
      { op: 'add', port: 7, returns: true },
      { op: 'add', port: 7, returns: false },
      { op: 'add', port: 7, returns: false },
      { op: 'delete', port: 7, returns: false },
      { op: 'delete', port: 7, returns: false },
    ],
    has: [7],
    changed: [7],
  },
  {
    name: 'a delete of a non-member changes nothing; ports 0 and 65535 are ports',
    steps: [
      { op: 'delete', port: 80, returns: false },
      { op: 'add', port: 0, returns: true },
      { op: 'add', port: 65535, returns: true },
      { op: 'add', port: 8, returns: true },
      { op: 'delete', port: 8, returns: true },
      { op: 'delete', port: 8, returns: false },
    ],
    has: [0, 65535],
    changed: [0, 65535],
  },
];

for (const store of ['Set', 'PortBits'] as const)
  for (const c of steps)
    test(`CountedSet (${store}): ${c.name}`, () => {
      const set = new CountedSet<number>(store === 'Set' ? new Set() : new PortBits());
      for (const [i, s] of c.steps.entries())
        assert.equal(s.op === 'add' ? set.add(s.port) : set.delete(s.port), s.returns, `step ${i}`);
      for (const port of [0, 7, 8, 80, 40001, 65535])
        assert.equal(set.has(port), c.has.includes(port), `${port}`);
      assert.equal(set.size, c.has.length);
      assert.deepEqual(
        [...set.takeChanged()].sort((a, b) => a - b),
        c.changed,
      );
      assert.deepEqual([...set.takeChanged()], [], 'told once');
    });

test('members counted once cost their place in the store only: a Set entry (under 40 bytes), a bit for ports', async () => {
  const keys = Array.from({ length: 20_000 }, (_, i) => `10.100.${i >> 8}.${i & 255}:80`);
  const strings = new CountedSet<string>();
  const ports = new CountedSet<number>(new PortBits());
  const before = await usedHeap();
  for (const k of keys) strings.add(k);
  strings.takeChanged();
  const perString = ((await usedHeap()) - before) / keys.length;
  const middle = await usedHeap();
  for (let p = 20000; p < 40000; p++) ports.add(p);
  ports.takeChanged();
  const perPort = ((await usedHeap()) - middle) / 20_000;
  assert.equal(strings.size + ports.size, 40_000);
  // A Map of counts was 46 bytes an entry at this size (ports too).
  assert.ok(perString < 40, `${perString.toFixed(1)} bytes a member`);
  assert.ok(perPort < 1, `${perPort.toFixed(2)} bytes a port`);
});
