// What lives on the heap, for tests that prove something is not kept or not allocated: a full garbage
// collection, and how many objects of a class are alive (v8.queryObjects, after its own full GC).
import { queryObjects, setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;

/**
 * A full garbage collection, run from a later macrotask: a WeakRef created or dereferenced in the
 * current job keeps its target alive until the job ends.
 */
export async function collectGarbage(): Promise<void> {
  await new Promise((resolve) => setImmediate(resolve));
  gc();
  gc();
}

/** How many objects whose prototype chain holds `ctor.prototype` are alive (after a full GC). */
export function liveObjects(ctor: abstract new (...args: never[]) => unknown): number {
  return queryObjects(ctor as unknown as (...args: unknown[]) => unknown, { format: 'count' }) as number;
}
