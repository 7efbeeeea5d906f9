// The malloc_trim addon's loader, its call, and when the proxy trims (src/lib/malloc-trim.ts).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  loadMallocTrim,
  MallocTrimmer,
  processMallocTrim,
  TRIM_AFTER_LISTENERS,
  TRIM_THRESHOLD,
  trimAfterSync,
  watchMajorGc,
} from '../../../src/lib/malloc-trim.ts';
import { collectGarbage } from '../../helpers/heap.ts';

test('KUP_MALLOC_TRIM=off turns the addon off, with the reason', () => {
  const off = loadMallocTrim({ KUP_MALLOC_TRIM: 'off' });
  assert.equal(off.calls, undefined);
  assert.match(off.error!, /KUP_MALLOC_TRIM=off/);
});

// Free memory between blocks still in use is what free() keeps and malloc_trim gives back: 2,000 blocks
// of 32 KiB (below glibc's mmap threshold, so from an arena), each followed by a small one that stays.
test('trim gives back the pages of freed blocks that malloc kept', async () => {
  const support = processMallocTrim();
  assert.ok(support.calls, `build/native/malloc_trim.node: ${support.error}`);
  let big: Buffer[] = [];
  const kept: Buffer[] = [];
  for (let i = 0; i < 2000; i++) {
    big.push(Buffer.allocUnsafeSlow(32 * 1024).fill(1));
    kept.push(Buffer.allocUnsafeSlow(64).fill(1));
  }
  big = [];
  await collectGarbage();
  const before = process.memoryUsage.rss();
  assert.equal(support.calls.trim(), 1, 'memory was given back');
  const freed = before - process.memoryUsage.rss();
  assert.ok(freed > 32 * 1024 * 1024, `${(freed / 1024 / 1024).toFixed(1)} MiB of 62.5 given back`);
  assert.equal(kept.length, 2000);
});

const cases = [
  { name: 'the first sync', sync: { opened: 0, closed: 0 }, first: true, want: true },
  { name: 'a cold start', sync: { opened: 10_000, closed: 0 }, first: true, want: true },
  { name: 'one service added', sync: { opened: 1, closed: 0 }, first: false, want: false },
  { name: 'nothing changed', sync: { opened: 0, closed: 0 }, first: false, want: false },
  {
    name: 'a mass change',
    sync: { opened: 600, closed: TRIM_AFTER_LISTENERS - 600 },
    first: false,
    want: true,
  },
  { name: 'many closed', sync: { opened: 0, closed: 5000 }, first: false, want: true },
];
for (const c of cases)
  test(`trimAfterSync: ${c.name}`, () => assert.equal(trimAfterSync(c.sync, c.first), c.want));

/** A GC watch the test fires by hand. */
function handGc() {
  const gc = { watching: 0, fire: () => {} };
  const watch = (onMajorGc: () => void) => {
    gc.watching++;
    gc.fire = onMajorGc;
    return () => {
      gc.watching--;
      gc.fire = () => {};
    };
  };
  return { gc, watch };
}

test('MallocTrimmer: trims after the first sync, after peaks and after the full GC that follows, nothing without the addon', () => {
  let trims = 0;
  const { gc, watch } = handGc();
  const trimmer = new MallocTrimmer({ trim: () => ++trims && 1, setTrimThreshold: () => 1 }, watch);
  trimmer.afterSync({ opened: 3, closed: 0 });
  assert.equal(trims, 1, 'the first sync');
  assert.equal(gc.watching, 1);
  trimmer.afterSync({ opened: 1, closed: 0 });
  trimmer.afterSync({ opened: 0, closed: 1 });
  assert.equal(trims, 1);
  gc.fire();
  assert.equal(trims, 2, 'after the next full GC');
  assert.equal(gc.watching, 0, 'and only that one');
  gc.fire();
  assert.equal(trims, 2);
  trimmer.afterSync({ opened: 0, closed: TRIM_AFTER_LISTENERS });
  trimmer.afterSync({ opened: TRIM_AFTER_LISTENERS, closed: 0 });
  assert.equal(trims, 4);
  assert.equal(gc.watching, 1, 'one watch for peaks in a row');
  gc.fire();
  assert.equal(trimmer.trims, 5);
  const without = new MallocTrimmer(undefined, watch);
  without.afterSync({ opened: 10_000, closed: 0 });
  assert.equal(without.trims, 0);
  assert.equal(gc.watching, 0);
});

// glibc raises an arena's trim threshold as large blocks are freed (to twice the largest) and malloc_trim()
// gives back no thread arena's top: a cold start left up to ~7 MiB there, or not, from one start to the
// next (docs/performance-findings.md, eighth session).
test('MallocTrimmer: an arena keeps at most TRIM_THRESHOLD free at its top from its construction on', () => {
  const set: number[] = [];
  new MallocTrimmer({ trim: () => 0, setTrimThreshold: (bytes) => set.push(bytes) && 1 }, handGc().watch);
  assert.deepEqual(set, [TRIM_THRESHOLD]);
  assert.equal(TRIM_THRESHOLD, 1024 * 1024);
  const support = processMallocTrim();
  assert.ok(support.calls, `build/native/malloc_trim.node: ${support.error}`);
  assert.equal(support.calls.setTrimThreshold(TRIM_THRESHOLD), 1, 'mallopt took it');
  assert.equal(support.calls.setTrimThreshold(-1), 0, 'no negative threshold');
});

test('watchMajorGc reports a full collection until stopped', async () => {
  let seen = 0;
  const stop = watchMajorGc(() => seen++);
  const deadline = Date.now() + 5000;
  while (seen === 0 && Date.now() < deadline) {
    await collectGarbage();
    await new Promise((r) => setTimeout(r, 10));
  }
  stop();
  assert.ok(seen > 0);
  const after = seen;
  await collectGarbage();
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(seen, after, 'nothing once stopped');
});
