// The C heap's free memory back to the kernel after a peak. glibc's free() keeps what it freed in its
// arenas: after a cold start at 10,000 service ports (the API's list pages, the rules' text, the
// listeners' setup) that was ~1-2 KiB of RSS per service port, kept for the life of the process
// (docs/performance-findings.md). native/malloc_trim.c (built by `npm run build` into
// build/native/malloc_trim.node) calls malloc_trim(3). Without it the process keeps those pages, as
// before; KUP_MALLOC_TRIM=off turns it off.
import { constants, PerformanceObserver } from 'node:perf_hooks';
import { type AddonSupport, loadAddon } from './native-addon.ts';

/** native/malloc_trim.c */
export interface MallocTrimCalls {
  /** malloc_trim(0): 1 when memory was given back, 0 when there was none to give. */
  trim(): number;
  /** mallopt(M_TRIM_THRESHOLD): the free memory an arena keeps at its top at most; 1 when set. */
  setTrimThreshold(bytes: number): number;
}

export type MallocTrimSupport = AddonSupport<MallocTrimCalls>;

/** Loads the addon once per process; the error says why it is not there. */
export function loadMallocTrim(env: NodeJS.ProcessEnv = process.env): MallocTrimSupport {
  return loadAddon<MallocTrimCalls>('malloc_trim', 'KUP_MALLOC_TRIM', ['trim', 'setTrimThreshold'], env);
}

let processSupport: MallocTrimSupport | undefined;
/** The process's addon (loaded on first use). */
export function processMallocTrim(): MallocTrimSupport {
  processSupport ??= loadMallocTrim();
  return processSupport;
}

/**
 * The free memory a malloc arena keeps at its top at most. glibc raises its threshold as large blocks are
 * freed (to twice the largest, up to 64 MiB), and malloc_trim() gives back the top of the main arena
 * only: after a cold start a helper thread's arena (V8's or libuv's) kept up to ~7 MiB more, or not,
 * from one start to the next (RSS at one service port 87.5-95.7 MB; 85.6-86.1 with this).
 */
export const TRIM_THRESHOLD = 1024 * 1024;

/** Listeners a sync must open or close to count as a peak (a cold start, a relist, a mass change). */
export const TRIM_AFTER_LISTENERS = 1000;

/** What a sync did, as far as trimming goes. */
export type SyncSize = { readonly opened: number; readonly closed: number };

/** True when the C heap is worth trimming after this sync: the first one, or one that was a peak. */
export function trimAfterSync(sync: SyncSize, first: boolean): boolean {
  return first || sync.opened + sync.closed >= TRIM_AFTER_LISTENERS;
}

/** Calls `onMajorGc` after each full garbage collection from now on, until the returned stop is called. */
export type GcWatch = (onMajorGc: () => void) => () => void;

/** The process's full garbage collections, as perf_hooks reports them (after the collection). */
export const watchMajorGc: GcWatch = (onMajorGc) => {
  const observer = new PerformanceObserver((list) => {
    for (const entry of list.getEntries())
      if ((entry as { detail?: { kind?: number } }).detail?.kind === constants.NODE_PERFORMANCE_GC_MAJOR) {
        onMajorGc();
        return;
      }
  });
  observer.observe({ entryTypes: ['gc'] });
  return () => observer.disconnect();
};

/**
 * Trims after the syncs that end a peak (trimAfterSync), and once more after the next full garbage
 * collection: the buffers of the peak still held by JavaScript objects (a table serialized for the
 * workers, the last API pages) are freed only then. A trim takes a few milliseconds at 10,000 service
 * ports; after any other sync nothing happens.
 */
export class MallocTrimmer {
  readonly #calls: MallocTrimCalls | undefined;
  readonly #watchGc: GcWatch;
  #first = true;
  #stopWatch: (() => void) | undefined;
  /** Trims done (for tests and debugging). */
  trims = 0;

  /** From now on, with the addon, an arena keeps at most TRIM_THRESHOLD free at its top. */
  constructor(calls: MallocTrimCalls | undefined, watchGc: GcWatch = watchMajorGc) {
    this.#calls = calls;
    this.#watchGc = watchGc;
    calls?.setTrimThreshold(TRIM_THRESHOLD);
  }

  /** A sync finished. */
  afterSync(sync: SyncSize): void {
    const first = this.#first;
    this.#first = false;
    if (this.#calls === undefined || !trimAfterSync(sync, first)) return;
    this.#trim();
    this.#stopWatch ??= this.#watchGc(() => {
      this.#stopWatch?.();
      this.#stopWatch = undefined;
      this.#trim();
    });
  }

  #trim(): void {
    this.#calls!.trim();
    this.trims++;
  }
}
