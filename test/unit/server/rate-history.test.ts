// The console's rate history: rates from counter deltas over real elapsed time, gaps where nobody watched,
// resets, ports that come and go, rings only for ports that moved, and the window's wrap-around.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { RateHistory, type ReadCounters } from '../../../src/server/rate-history.ts';

type Counters = Record<string, [number, number, number, number]>;

function reading(counters: Counters): ReadCounters {
  return (visit) => {
    for (const [key, [a, b, c, d]] of Object.entries(counters)) visit(key, a, b, c, d);
  };
}

test('rates are counter increases per second; the first sample has none', () => {
  const h = new RateHistory({ intervalMs: 2000, slots: 10 });
  h.sample(10_000, reading({ a: [5, 100, 200, 0] }));
  h.sample(12_000, reading({ a: [9, 1100, 600, 2] }));
  h.sample(14_000, reading({ a: [9, 1100, 600, 2] }));
  assert.deepEqual(h.times(), [10_000, 12_000, 14_000]);
  // A gap (null) where there was no previous sample.
  assert.deepEqual(h.series('a'), [
    [null, 2, 0],
    [null, 500, 0],
    [null, 200, 0],
    [null, 1, 0],
  ]);
  assert.deepEqual(h.totals(), [
    [null, 2, 0],
    [null, 500, 0],
    [null, 200, 0],
    [null, 1, 0],
  ]);
  assert.deepEqual(h.latest('a'), [0, 0, 0, 0]);
});

test('maybeSample takes at most one sample an interval (with a tenth of slack)', () => {
  const h = new RateHistory({ intervalMs: 2000 });
  const read = reading({ a: [1, 0, 0, 0] });
  assert.equal(h.maybeSample(1000, read), true);
  assert.equal(h.maybeSample(2000, read), false);
  assert.equal(h.maybeSample(2799, read), false);
  assert.equal(h.maybeSample(2800, read), true);
  assert.equal(h.times().length, 2);
});

test('a sample after a longer gap than maxGapMs has no rates, and the next one has again', () => {
  const h = new RateHistory({ intervalMs: 1000, maxGapMs: 5000, slots: 10 });
  h.sample(1000, reading({ a: [0, 0, 0, 0] }));
  h.sample(2000, reading({ a: [10, 0, 0, 0] }));
  h.sample(60_000, reading({ a: [500, 0, 0, 0] }));
  h.sample(61_000, reading({ a: [502, 0, 0, 0] }));
  assert.deepEqual(h.one('a', 0), [null, 10, null, 2]);
  assert.deepEqual(h.totals()[0], [null, 10, null, 2]);
});

test('a counter that went down was reset: it counts from 0', () => {
  const h = new RateHistory({ intervalMs: 1000, slots: 10 });
  h.sample(1000, reading({ a: [0, 0, 0, 0] }));
  h.sample(2000, reading({ a: [100, 0, 0, 0] }));
  h.sample(3000, reading({ a: [3, 0, 0, 0] }));
  assert.deepEqual(h.one('a', 0), [null, 100, 3]);
});

test('a port seen for the first time counts from 0; a port gone is forgotten', () => {
  const h = new RateHistory({ intervalMs: 1000, slots: 10 });
  h.sample(1000, reading({ a: [0, 0, 0, 0] }));
  h.sample(2000, reading({ a: [0, 0, 0, 0], b: [4, 40, 0, 0] }));
  assert.deepEqual(h.one('b', 0), [null, 4]);
  assert.deepEqual(h.one('b', 1), [null, 40]);
  h.sample(3000, reading({ a: [0, 0, 0, 0] }));
  assert.equal(h.series('b'), undefined);
  // Back again: from 0, as a new port.
  h.sample(4000, reading({ a: [0, 0, 0, 0], b: [1, 0, 0, 0] }));
  assert.deepEqual(h.one('b', 0), [null, 0, 0, 1]);
});

test('only ports that moved hold a ring; one idle for a whole window loses it', () => {
  const h = new RateHistory({ intervalMs: 1000, slots: 4 });
  const idle = reading({ a: [7, 0, 0, 0], b: [0, 0, 0, 0] });
  h.sample(1000, idle);
  h.sample(2000, idle);
  assert.equal(h.rings, 0);
  assert.equal(h.series('a'), undefined);
  assert.deepEqual(h.latest('a'), [0, 0, 0, 0]);
  h.sample(3000, reading({ a: [9, 0, 0, 0], b: [0, 0, 0, 0] }));
  assert.equal(h.rings, 1);
  assert.deepEqual(h.one('a', 0), [null, 0, 2]);
  for (let t = 4000; t <= 6000; t += 1000) h.sample(t, reading({ a: [9, 0, 0, 0], b: [0, 0, 0, 0] }));
  assert.equal(h.rings, 1, 'the movement is still in the window');
  h.sample(7000, reading({ a: [9, 0, 0, 0], b: [0, 0, 0, 0] }));
  assert.equal(h.rings, 0);
});

test('the window keeps the newest samples, oldest first', () => {
  const h = new RateHistory({ intervalMs: 1000, slots: 3 });
  for (let i = 1; i <= 5; i++) h.sample(i * 1000, reading({ a: [i * i, 0, 0, 0] }));
  assert.deepEqual(h.times(), [3000, 4000, 5000]);
  assert.deepEqual(h.one('a', 0), [5, 7, 9]);
  assert.deepEqual(h.latest('a'), [9, 0, 0, 0]);
  assert.equal(h.lastSampleMs, 5000);
});

test('rates keep three significant digits', () => {
  const h = new RateHistory({ intervalMs: 3000, slots: 3 });
  h.sample(0 + 1, reading({ a: [0, 0, 0, 0] }));
  h.sample(3001, reading({ a: [1, 123_456, 0, 0] }));
  assert.deepEqual(h.latest('a'), [0.333, 41_200, 0, 0]);
});

test('clear forgets every sample and port: the next sample starts afresh', () => {
  const h = new RateHistory({ intervalMs: 1000, slots: 5 });
  h.sample(1000, reading({ a: [0, 0, 0, 0] }));
  h.sample(2000, reading({ a: [5, 0, 0, 0] }));
  h.clear();
  assert.deepEqual([h.times(), h.rings, h.lastSampleMs, h.series('a')], [[], 0, 0, undefined]);
  h.sample(3000, reading({ a: [9, 0, 0, 0] }));
  h.sample(4000, reading({ a: [10, 0, 0, 0] }));
  assert.deepEqual(h.times(), [3000, 4000]);
  assert.deepEqual(h.one('a', 0), [null, 1]);
  assert.deepEqual(h.totals()[0], [null, 1]);
});
