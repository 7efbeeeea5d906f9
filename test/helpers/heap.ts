// What lives on the heap, for tests that prove something is not kept or not allocated: a full garbage
// collection, and how many objects of a class are alive (v8.queryObjects, after its own full GC).
import { getHeapSpaceStatistics, getHeapStatistics, queryObjects, setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as (options?: { type: 'minor' | 'major' }) => void;
const minorGc = () => gc({ type: 'minor' });

/**
 * A full garbage collection, run from a later macrotask: a WeakRef created or dereferenced in the
 * current job keeps its target alive until the job ends.
 */
export async function collectGarbage(): Promise<void> {
  await new Promise((resolve) => setImmediate(resolve));
  gc();
  gc();
}

/** The heap in use after a full garbage collection (collectGarbage), in bytes. */
export async function usedHeap(): Promise<number> {
  await collectGarbage();
  return getHeapStatistics().used_heap_size;
}

/**
 * The median of `runs` readings of `measure`, one after the other: one reading of the heap moves by a few
 * hundred KB with where the collector's pages stand (fragments too small to reuse count as used).
 */
export async function medianOf(runs: number, measure: () => Promise<number>): Promise<number> {
  const values: number[] = [];
  for (let k = 0; k < runs; k++) values.push(await measure());
  values.sort((a, b) => a - b);
  return values[runs >> 1]!;
}

/** How many objects whose prototype chain holds `ctor.prototype` are alive (after a full GC). */
export function liveObjects(ctor: abstract new (...args: never[]) => unknown): number {
  return queryObjects(ctor as unknown as (...args: unknown[]) => unknown, { format: 'count' }) as number;
}

/**
 * Bytes moved to the old generation per item, over `count` items each made, added and then removed while
 * 32 are in at a time, after the container and its first items were made old (as a long-lived container
 * under churn is): what `remove` leaves reachable through a scavenge. Minor GCs only, so that what a full
 * GC would free (a dead old object's references) still counts.
 */
export function promotedPerItem<T>(
  make: (n: number) => T,
  add: (item: T) => void,
  remove: (item: T) => void,
  count = 20_000,
): number {
  const oldUsed = () =>
    getHeapSpaceStatistics()
      .filter((s) => s.space_name !== 'new_space')
      .reduce((sum, s) => sum + s.space_used_size, 0);
  const live: T[] = [];
  for (let i = 0; i < 32; i++) {
    live.push(make(i));
    add(live.at(-1)!);
  }
  gc();
  gc();
  const before = oldUsed();
  for (let n = 0; n < count; n++) {
    live.push(make(n));
    add(live.at(-1)!);
    remove(live.shift()!);
  }
  minorGc();
  minorGc();
  return (oldUsed() - before) / count;
}

/**
 * Bytes allocated per step: the heap's growth over `chunk` steps at a time, where no garbage collection
 * came in between (one that did shrinks the heap: that chunk is left out); the median of `chunks`.
 */
export function allocatedPerStep(
  step: (n: number) => void,
  { chunks = 41, chunk = 100, warmup = 20_000 } = {},
): number {
  for (let n = 0; n < warmup; n++) step(n);
  const used = () => getHeapStatistics().used_heap_size;
  const samples: number[] = [];
  let n = warmup;
  for (let k = 0; k < chunks * 4 && samples.length < chunks; k++) {
    const before = used();
    for (let i = 0; i < chunk; i++) step(n++);
    const after = used();
    if (after >= before) samples.push((after - before) / chunk);
  }
  samples.sort((a, b) => a - b);
  return samples[samples.length >> 1]!;
}
