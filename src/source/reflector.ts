// A reflector (client-go's): lists one resource, then watches it from the list's resourceVersion,
// forever, and hands each change to its sink as an add, update or delete against its own cache.
// Self-healing: 410 → relist, backoff with jitter, a watchdog on silent connections, a periodic full
// relist. It knows nothing of what the objects mean; nothing reaches the sink after stop().
import type { KubeConfig } from '@kubernetes/client-node';
import { fetch } from 'undici';
import type { Logger } from '../lib/log.ts';
import { Yielder } from '../lib/yielder.ts';
import {
  ApiError,
  apiError,
  isRecord,
  openSession,
  readJson,
  type Session,
  truncate,
} from './api-session.ts';
import type { ObjectMeta } from './objects.ts';

/** What a reflector reads of any object. */
export type ApiObject = { apiVersion?: string; kind?: string; metadata?: ObjectMeta };

/** One resource to reflect: its collection path, and the kind and apiVersion its list items lack. */
export type Resource = {
  kind: string;
  apiVersion: string;
  path: string;
  labelSelector?: string;
  fieldSelector?: string;
};

export type Sink = {
  /** One change; `old` is the cached version an update replaces. A throw is logged, never fatal. */
  receive(op: 'add' | 'update' | 'delete', obj: ApiObject, old?: ApiObject): void;
  /** After the first complete list. */
  synced(): void;
};

export type Timing = {
  /** Restart a list or watch that received no bytes for this long. */
  watchdogMs: number;
  /** Delay before retrying a failed list or watch: doubles per attempt, capped, with jitter. */
  backoff: { initialMs: number; maxMs: number };
  /** A full relist this often; 0 disables. */
  relistMs: number;
  /** Objects per list page; 0 lists in one response. */
  pageSize: number;
};

const SHORT_WATCH_MS = 1000;

/** Why we aborted a request ourselves. */
class Interrupted extends Error {
  readonly reason: 'stop' | 'relist' | 'silent';
  constructor(reason: Interrupted['reason'], message: string) {
    super(message);
    this.name = 'Interrupted';
    this.reason = reason;
  }
}

/**
 * Delay before retry `attempt` (1-based): initial × 2^(attempt-1), capped at max, then jittered down by
 * up to half so that many proxies restarted together do not retry in lockstep.
 */
export function backoffDelay(
  attempt: number,
  backoff: { initialMs: number; maxMs: number },
  random: () => number = Math.random,
): number {
  const base = Math.min(backoff.maxMs, backoff.initialMs * 2 ** Math.min(Math.max(attempt - 1, 0), 30));
  return Math.round(base * (1 - random() / 2));
}

export class Reflector {
  readonly #resource: Resource;
  readonly #sink: Sink;
  readonly #kc: KubeConfig;
  readonly #log: Logger;
  readonly #timing: Timing;
  /** The objects as last delivered, keyed `namespace/name`. */
  readonly #cache = new Map<string, ApiObject>();
  /** Where the next watch starts; undefined = list first. */
  #rv: string | undefined;
  #listed = false;
  #stopped = false;
  #relistDue = false;
  #phase: 'idle' | 'list' | 'watch' = 'idle';
  /** False after a failure, so that `Watch started` is logged once per recovery, not per reconnect. */
  #healthy = false;
  #attempt = 0;
  #goneStreak = 0;
  #controller: AbortController | undefined;
  #wake: (() => void) | undefined;
  #relistTimer: NodeJS.Timeout | undefined;
  #done: Promise<void> = Promise.resolve();

  constructor(resource: Resource, sink: Sink, kc: KubeConfig, log: Logger, timing: Timing) {
    this.#resource = resource;
    this.#sink = sink;
    this.#kc = kc;
    this.#log = log;
    this.#timing = timing;
  }

  start(): void {
    if (this.#stopped) return;
    this.#done = this.#run();
    if (this.#timing.relistMs > 0) {
      this.#relistTimer = setInterval(() => this.#requestRelist(), this.#timing.relistMs);
    }
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    clearInterval(this.#relistTimer);
    this.#controller?.abort(new Interrupted('stop', 'stopped'));
    this.#wake?.();
    await this.#done;
  }

  async #run(): Promise<void> {
    while (!this.#stopped) {
      try {
        if (this.#rv === undefined || this.#relistDue) await this.#list();
        if (!this.#stopped) await this.#watch();
      } catch (err) {
        const during = this.#phase;
        this.#phase = 'idle';
        if (this.#stopped) break;
        if (err instanceof Interrupted && err.reason === 'relist') continue;
        if (err instanceof ApiError && err.statusCode === 410) {
          this.#rv = undefined;
          // One 410 is routine (history compacted); a second right after a fresh list is a failure.
          if (++this.#goneStreak === 1) {
            this.#log.info({ err: err.message }, 'Watch expired, relisting');
            continue;
          }
        }
        this.#attempt++;
        this.#healthy = false;
        const delayMs = backoffDelay(this.#attempt, this.#timing.backoff);
        this.#log.warn({ err, during, attempt: this.#attempt, delayMs }, 'Watch failed, retrying');
        await this.#sleep(delayMs);
      }
    }
  }

  /** Periodic relist: interrupt a running watch; a list in progress already is one. */
  #requestRelist(): void {
    if (this.#stopped || this.#phase === 'list') return;
    this.#relistDue = true;
    if (this.#phase === 'watch') this.#controller?.abort(new Interrupted('relist', 'periodic relist'));
  }

  async #list(): Promise<void> {
    this.#phase = 'list';
    this.#relistDue = false;
    const { path, labelSelector, fieldSelector } = this.#resource;
    const { items, rv } = await this.#operation(async (session, signal, touch) => {
      const all: unknown[] = [];
      let limit = this.#timing.pageSize;
      let next: string | undefined;
      for (;;) {
        const query = { labelSelector, fieldSelector, limit: limit > 0 ? limit : undefined, continue: next };
        const res = await fetch(session.url(path, query), session.init(signal));
        touch();
        if (res.status === 410 && next !== undefined) {
          // The continue token expired mid-list: start over in one piece, as client-go's pager does.
          await res.body?.cancel();
          all.length = 0;
          next = undefined;
          limit = 0;
          continue;
        }
        if (res.status !== 200) throw await apiError(res);
        const body = await readJson(res, touch);
        if (!isRecord(body) || !Array.isArray(body.items)) {
          throw new Error(`malformed list response for ${path}`);
        }
        for (const item of body.items) all.push(item);
        const meta = isRecord(body.metadata) ? body.metadata : {};
        next = typeof meta.continue === 'string' && meta.continue !== '' ? meta.continue : undefined;
        if (next === undefined) {
          const listRv = typeof meta.resourceVersion === 'string' ? meta.resourceVersion : '';
          return { items: all, rv: listRv };
        }
      }
    });
    this.#attempt = 0;
    await this.#reconcile(items, rv);
  }

  /**
   * Turns a complete list into events against the cache: deletes, then adds and updates (by RV). A list
   * of 10,000 objects is handled in ~10 ms slices, so the data path keeps its event loop.
   */
  async #reconcile(items: readonly unknown[], rv: string): Promise<void> {
    const yielder = new Yielder();
    const listed = new Map<string, ApiObject>();
    for (const item of items) {
      const obj = this.#accept(item, 'list item');
      if (obj !== undefined) listed.set(keyOf(obj), obj);
      if (yielder.due) await yielder.turn();
    }
    let added = 0;
    let updated = 0;
    let deleted = 0;
    for (const [key, old] of this.#cache) {
      if (listed.has(key)) continue;
      this.#cache.delete(key);
      deleted++;
      this.#emit('delete', old);
      if (yielder.due) await yielder.turn();
    }
    for (const [key, obj] of listed) {
      const old = this.#cache.get(key);
      if (old !== undefined && !changed(old, obj)) continue;
      this.#cache.set(key, obj);
      if (old === undefined) {
        added++;
        this.#emit('add', obj);
      } else {
        updated++;
        this.#emit('update', obj, old);
      }
      if (yielder.due) await yielder.turn();
    }
    this.#rv = rv;
    this.#log.info({ count: listed.size, added, updated, deleted }, 'Relisted');
    if (!this.#listed && !this.#stopped) {
      this.#listed = true;
      this.#emit('synced');
    }
  }

  async #watch(): Promise<void> {
    this.#phase = 'watch';
    const from = this.#rv ?? '';
    const { path, labelSelector, fieldSelector } = this.#resource;
    // The server ends the watch before the watchdog would (client-go asks 5–10 min): a healthy watch
    // always shows life, with or without bookmarks.
    const watchdogS = this.#timing.watchdogMs / 1000;
    const timeoutSeconds = Math.max(1, Math.floor(watchdogS * (0.5 + 0.4 * Math.random())));
    const started = performance.now();
    let events = 0;
    await this.#operation(async (session, signal, touch) => {
      const query = {
        watch: 'true',
        resourceVersion: from,
        allowWatchBookmarks: 'true',
        timeoutSeconds,
        labelSelector,
        fieldSelector,
      };
      const res = await fetch(session.url(path, query), session.init(signal));
      touch();
      if (res.status !== 200) throw await apiError(res);
      if (this.#healthy) {
        this.#log.debug({ resourceVersion: from }, 'Watch restarted');
      } else {
        this.#healthy = true;
        this.#log.info({ resourceVersion: from }, 'Watch started');
      }
      if (res.body === null) return;
      const decoder = new TextDecoder();
      let pending = '';
      for await (const chunk of res.body) {
        touch();
        pending += decoder.decode(chunk, { stream: true });
        let start = 0;
        for (let nl = pending.indexOf('\n'); nl !== -1; nl = pending.indexOf('\n', start)) {
          if (this.#onLine(pending.slice(start, nl))) events++;
          start = nl + 1;
        }
        pending = pending.slice(start);
      }
      pending += decoder.decode();
      if (this.#onLine(pending)) events++;
    });
    // As client-go: a watch the server ends at once, with nothing in it, must not make a hot loop.
    if (events === 0 && performance.now() - started < SHORT_WATCH_MS) {
      throw new Error('very short watch: closed by the server within a second, without events');
    }
    this.#progress();
  }

  /** One watch line; true when it was an event that moved us forward. Throws for ERROR events. */
  #onLine(line: string): boolean {
    if (line.trim() === '' || this.#stopped) return false;
    let event: unknown;
    try {
      event = JSON.parse(line);
    } catch {
      this.#log.warn({ line: truncate(line) }, 'Skipping malformed watch line');
      return false;
    }
    if (!isRecord(event) || typeof event.type !== 'string') {
      this.#log.warn({ line: truncate(line) }, 'Skipping malformed watch event');
      return false;
    }
    const { type, object } = event;
    if (type === 'ERROR') {
      const status = isRecord(object) ? object : {};
      const code = typeof status.code === 'number' ? status.code : 500;
      throw new ApiError(code, typeof status.message === 'string' ? status.message : 'watch ERROR event');
    }
    if (type === 'BOOKMARK') {
      const rv = isRecord(object) && isRecord(object.metadata) ? object.metadata.resourceVersion : undefined;
      if (typeof rv === 'string' && rv !== '') this.#rv = rv;
      this.#progress();
      return true;
    }
    if (type !== 'ADDED' && type !== 'MODIFIED' && type !== 'DELETED') {
      this.#log.warn({ type: truncate(type) }, 'Skipping watch event of unknown type');
      return false;
    }
    const obj = this.#accept(object, `${type} event`);
    if (obj === undefined) return false;
    const key = keyOf(obj);
    const old = this.#cache.get(key);
    if (type === 'DELETED') {
      this.#cache.delete(key);
      this.#emit('delete', obj);
    } else if (old === undefined) {
      this.#cache.set(key, obj);
      this.#emit('add', obj);
    } else if (changed(old, obj)) {
      this.#cache.set(key, obj);
      this.#emit('update', obj, old);
    }
    const rv = obj.metadata?.resourceVersion;
    if (typeof rv === 'string' && rv !== '') this.#rv = rv;
    this.#progress();
    return true;
  }

  #progress(): void {
    this.#attempt = 0;
    this.#goneStreak = 0;
  }

  /** The object, with kind and apiVersion filled in (list items lack them); undefined (logged) if unusable. */
  #accept(value: unknown, where: string): ApiObject | undefined {
    const name = isRecord(value) && isRecord(value.metadata) ? value.metadata.name : undefined;
    if (!isRecord(value) || typeof name !== 'string' || name === '') {
      this.#log.warn(
        { where, object: truncate(JSON.stringify(value) ?? String(value)) },
        'Skipping malformed object',
      );
      return undefined;
    }
    const obj = value as ApiObject;
    obj.kind ??= this.#resource.kind;
    obj.apiVersion ??= this.#resource.apiVersion;
    return obj;
  }

  #emit(op: 'add' | 'delete', obj: ApiObject): void;
  #emit(op: 'update', obj: ApiObject, old: ApiObject): void;
  #emit(op: 'synced'): void;
  #emit(op: 'add' | 'update' | 'delete' | 'synced', obj?: ApiObject, old?: ApiObject): void {
    if (this.#stopped) return;
    try {
      if (op === 'synced') this.#sink.synced();
      else this.#sink.receive(op, obj!, old);
    } catch (err) {
      this.#log.error(
        { err, event: op, object: obj === undefined ? undefined : keyOf(obj) },
        'Handler failed',
      );
    }
  }

  /**
   * Runs one list or watch with its own AbortController (stop, relist, watchdog) and its own dispatcher,
   * released when it ends. Our own aborts surface as Interrupted.
   */
  async #operation<T>(
    fn: (session: Session, signal: AbortSignal, touch: () => void) => Promise<T>,
  ): Promise<T> {
    const controller = new AbortController();
    this.#controller = controller;
    const { watchdogMs } = this.#timing;
    const watchdog = new Watchdog(watchdogMs, () =>
      controller.abort(new Interrupted('silent', `no data from the API server for ${watchdogMs} ms`)),
    );
    let session: Session | undefined;
    try {
      session = await openSession(this.#kc);
      return await fn(session, controller.signal, watchdog.touch);
    } catch (err) {
      if (controller.signal.aborted && controller.signal.reason instanceof Interrupted) {
        throw controller.signal.reason;
      }
      throw err;
    } finally {
      watchdog.stop();
      if (this.#controller === controller) this.#controller = undefined;
      await session?.dispatcher.destroy().catch(() => {});
    }
  }

  #sleep(ms: number): Promise<void> {
    if (this.#stopped) return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.#wake = undefined;
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.#wake = done;
    });
  }
}

/** Aborts when nothing was touched for `ms`; one timer re-armed lazily, not per chunk. */
class Watchdog {
  readonly #ms: number;
  readonly #onSilent: () => void;
  #last = performance.now();
  #timer: NodeJS.Timeout;

  constructor(ms: number, onSilent: () => void) {
    this.#ms = ms;
    this.#onSilent = onSilent;
    this.#timer = setTimeout(this.#check, ms);
  }

  readonly touch = (): void => {
    this.#last = performance.now();
  };

  readonly #check = (): void => {
    const idle = performance.now() - this.#last;
    if (idle >= this.#ms) this.#onSilent();
    else this.#timer = setTimeout(this.#check, this.#ms - idle);
  };

  stop(): void {
    clearTimeout(this.#timer);
  }
}

function keyOf(obj: ApiObject): string {
  return `${obj.metadata?.namespace ?? ''}/${obj.metadata?.name ?? ''}`;
}

/** resourceVersions are opaque: equal means unchanged; a missing one always counts as a change. */
function changed(old: ApiObject, obj: ApiObject): boolean {
  const rv = obj.metadata?.resourceVersion;
  return rv === undefined || rv !== old.metadata?.resourceVersion;
}
