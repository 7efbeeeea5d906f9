// A reflector (client-go's): lists one resource, then watches it from the list's resourceVersion,
// forever, and hands each change to its sink as an add, update or delete against its own cache.
// Self-healing: 410 → relist, backoff with jitter that only a quiet period resets, a watchdog on silent
// connections, a periodic full relist; every answer read within bounds (api-limits.ts). It knows nothing
// of what the objects mean and keeps only the name and resourceVersion of each, never the object the
// sink was handed; nothing reaches the sink after stop().
import { ProxyError } from '../lib/errors.ts';
import { flat } from '../lib/flat-string.ts';
import type { Logger } from '../lib/log.ts';
import { Yielder } from '../lib/yielder.ts';
import { DEFAULT_LIMITS, type Limits } from './api-limits.ts';
import {
  type ApiCredentials,
  ApiError,
  apiError,
  describeUrl,
  get,
  isJsonAnswer,
  isRecord,
  notJsonError,
  openSession,
  type Session,
  truncate,
} from './api-session.ts';
import { Backoff, type BackoffPolicy } from './backoff.ts';
import { listAll } from './list-pager.ts';
import { LogLimiter } from './log-limiter.ts';
import type { ObjectMeta } from './objects.ts';
import { type StoredVersion, storedVersion, versionText } from './resource-version.ts';
import { LineSplitter } from './watch-lines.ts';

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
  /**
   * One change. `old`, of the version an update replaces, has only kind, apiVersion and metadata's
   * namespace, name and resourceVersion: all the cache keeps. So has the object of a delete a relist
   * finds. A throw is logged, never fatal.
   */
  receive(op: 'add' | 'update' | 'delete', obj: ApiObject, old?: ApiObject): void;
  /** After the first complete list. */
  synced(): void;
};

export type Timing = {
  /** Restart a list or watch that received no bytes for this long. */
  watchdogMs: number;
  /**
   * Delay before retrying a failed list or watch: doubles per failure, capped, with jitter; the count
   * starts over only after resetMs without a failure.
   */
  backoff: BackoffPolicy;
  /** A full relist this often; 0 disables. */
  relistMs: number;
  /** Objects per list page; 0 lists in one response. */
  pageSize: number;
};

const SHORT_WATCH_MS = 1000;
/** Warnings the API server's answers can repeat without end: this many a minute per message. */
const WARN_BURST = 5;
const WARN_WINDOW_MS = 60_000;
/**
 * Lines of one watch we cannot use (malformed, unknown type) before it is dropped as broken: a flood of
 * them cost the data path most of its event loop, parsed one by one.
 */
const MAX_UNUSABLE_LINES = 1000;

/** Why we aborted a request ourselves. */
class Interrupted extends Error {
  readonly reason: 'stop' | 'relist' | 'silent';
  constructor(reason: Interrupted['reason'], message: string) {
    super(message);
    this.name = 'Interrupted';
    this.reason = reason;
  }
}

export class Reflector {
  readonly #resource: Resource;
  readonly #sink: Sink;
  readonly #credentials: ApiCredentials;
  readonly #log: Logger;
  readonly #timing: Timing;
  readonly #limits: Limits;
  readonly #backoff: Backoff;
  readonly #warnings = new LogLimiter(WARN_BURST, WARN_WINDOW_MS);
  /**
   * The resourceVersion of each object as last delivered, keyed `namespace/name`: what a relist
   * compares. A full copy of every Service and EndpointSlice was 1.7 KB per service port.
   */
  readonly #cache = new Map<string, StoredVersion>();
  /** Where the next watch starts; undefined = list first. */
  #rv: string | undefined;
  #listed = false;
  #stopped = false;
  #relistDue = false;
  #phase: 'idle' | 'list' | 'watch' = 'idle';
  /** False after a failure, so that `Watch started` is logged once per recovery, not per reconnect. */
  #healthy = false;
  #controller: AbortController | undefined;
  #wake: (() => void) | undefined;
  #relistTimer: NodeJS.Timeout | undefined;
  #done: Promise<void> = Promise.resolve();

  constructor(
    resource: Resource,
    sink: Sink,
    credentials: ApiCredentials,
    log: Logger,
    timing: Timing,
    limits: Limits = DEFAULT_LIMITS,
  ) {
    this.#resource = resource;
    this.#sink = sink;
    this.#credentials = credentials;
    this.#log = log;
    this.#timing = timing;
    this.#limits = limits;
    this.#backoff = new Backoff(timing.backoff);
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
        const gone = err instanceof ApiError && err.statusCode === 410;
        if (gone) this.#rv = undefined;
        // Counted whatever came between (a list, events): only a quiet period starts the count over.
        const attempt = this.#backoff.fail(performance.now());
        if (gone && attempt === 1) {
          // One 410 after a quiet period is routine (history compacted): relist at once.
          this.#log.info({ err: (err as ApiError).message }, 'Watch expired, relisting');
          continue;
        }
        this.#healthy = false;
        const delayMs = this.#backoff.delay(attempt);
        this.#log.warn({ err, during, attempt, delayMs }, 'Watch failed, retrying');
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
    const request = { path, labelSelector, fieldSelector, pageSize: this.#timing.pageSize };
    const { items, rv } = await this.#operation((session, signal, touch) =>
      listAll(session, request, this.#limits, signal, touch),
    );
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
    for (const [key, rv] of this.#cache) {
      if (listed.has(key)) continue;
      this.#cache.delete(key);
      deleted++;
      this.#emit('delete', this.#stub(key, rv));
      if (yielder.due) await yielder.turn();
    }
    for (const [key, obj] of listed) {
      const known = this.#cache.has(key);
      const rv = this.#cache.get(key);
      if (known && !changed(rv, obj)) continue;
      this.#cache.set(key, storedVersion(obj.metadata?.resourceVersion));
      if (!known) {
        added++;
        this.#emit('add', obj);
      } else {
        updated++;
        this.#emit('update', obj, this.#stub(key, rv));
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
    // What errors name: the URL once known (scheme, host, port, path).
    let where = path;
    await this.#operation(async (session, signal, touch) => {
      const query = {
        watch: 'true',
        resourceVersion: from,
        allowWatchBookmarks: 'true',
        timeoutSeconds,
        labelSelector,
        fieldSelector,
      };
      const url = session.url(path, query);
      where = describeUrl(url);
      const res = await get(session, url, signal);
      touch();
      if (res.status !== 200) throw await apiError(res, url);
      // A proxy's HTML page is one error naming the URL, not a warning per line.
      if (!isJsonAnswer(res)) throw await notJsonError(res, url);
      if (this.#healthy) {
        this.#log.debug({ resourceVersion: from }, 'Watch restarted');
      } else {
        this.#healthy = true;
        this.#log.info({ resourceVersion: from }, 'Watch started');
      }
      if (res.body === null) return;
      const { maxLineBytes } = this.#limits;
      const lines = new LineSplitter(maxLineBytes);
      let unusable = 0;
      const onLine = (line: string) => {
        const seen = this.#onLine(line, where);
        if (seen === 'event') events++;
        else if (seen === 'unusable' && ++unusable > MAX_UNUSABLE_LINES) {
          throw new ProxyError(
            'KUP_ERR_API_RESPONSE',
            `GET ${where}: more than ${MAX_UNUSABLE_LINES} watch lines that are malformed or of an unknown type; the watch is dropped`,
          );
        }
      };
      const yielder = new Yielder();
      for await (const chunk of res.body) {
        touch();
        // Leaving the loop (a throw) cancels the body: the connection is dropped.
        if (!lines.push(chunk, onLine)) {
          throw new ProxyError(
            'KUP_ERR_API_RESPONSE',
            `GET ${where}: a watch line longer than ${maxLineBytes} bytes (maxLineBytes); the watch is dropped`,
          );
        }
        if (yielder.due) await yielder.turn();
      }
      onLine(lines.end());
    });
    // As client-go: a watch the server ends at once, with nothing in it, must not make a hot loop.
    if (events === 0 && performance.now() - started < SHORT_WATCH_MS) {
      throw new Error(`GET ${where}: very short watch: closed by the server within a second, without events`);
    }
  }

  /**
   * One watch line of `where`: an event that moved us forward, one we could not use (logged,
   * rate-limited), or nothing (blank, or stopped). Throws for ERROR events.
   */
  #onLine(line: string, where: string): 'event' | 'unusable' | 'none' {
    if (line.trim() === '' || this.#stopped) return 'none';
    let event: unknown;
    try {
      event = JSON.parse(line);
    } catch {
      this.#warn('Skipping malformed watch line', () => ({ line: truncate(line) }));
      return 'unusable';
    }
    if (!isRecord(event) || typeof event.type !== 'string') {
      this.#warn('Skipping malformed watch event', () => ({ line: truncate(line) }));
      return 'unusable';
    }
    const { type, object } = event;
    if (type === 'ERROR') {
      const status = isRecord(object) ? object : {};
      const code = typeof status.code === 'number' ? status.code : 500;
      const message = typeof status.message === 'string' ? truncate(status.message) : 'watch ERROR event';
      throw new ApiError(code, `GET ${where}: ${code}: ${message}`);
    }
    if (type === 'BOOKMARK') {
      const rv = isRecord(object) && isRecord(object.metadata) ? object.metadata.resourceVersion : undefined;
      if (typeof rv === 'string' && rv !== '') this.#rv = rv;
      return 'event';
    }
    if (type !== 'ADDED' && type !== 'MODIFIED' && type !== 'DELETED') {
      this.#warn('Skipping watch event of unknown type', () => ({ type: truncate(type) }));
      return 'unusable';
    }
    const obj = this.#accept(object, `${type} event`);
    if (obj === undefined) return 'unusable';
    const key = keyOf(obj);
    const known = this.#cache.has(key);
    if (type !== 'DELETED' && !known && this.#cache.size >= this.#limits.maxListItems) {
      // A list holds at most maxListItems; so does what the watch makes of it. Relisting (with backoff:
      // this is a failure) reconciles, or fails at the list's own bound if the collection is that large.
      this.#rv = undefined;
      throw new ProxyError(
        'KUP_ERR_API_RESPONSE',
        `GET ${where}: the watch would hold more than ${this.#limits.maxListItems} objects (maxListItems); the watch is dropped and relisted`,
      );
    }
    if (type === 'DELETED') {
      this.#cache.delete(key);
      this.#emit('delete', obj);
    } else if (!known) {
      this.#cache.set(key, storedVersion(obj.metadata?.resourceVersion));
      this.#emit('add', obj);
    } else {
      const rv = this.#cache.get(key);
      if (changed(rv, obj)) {
        this.#cache.set(key, storedVersion(obj.metadata?.resourceVersion));
        this.#emit('update', obj, this.#stub(key, rv));
      }
    }
    const rv = obj.metadata?.resourceVersion;
    if (typeof rv === 'string' && rv !== '') this.#rv = rv;
    return 'event';
  }

  /** What the cache knows of the object at `key`: its kind, name and resourceVersion. */
  #stub(key: string, stored: StoredVersion): ApiObject {
    const slash = key.indexOf('/');
    return {
      kind: this.#resource.kind,
      apiVersion: this.#resource.apiVersion,
      metadata: {
        namespace: slash === 0 ? undefined : key.slice(0, slash),
        name: key.slice(slash + 1),
        resourceVersion: versionText(stored),
      },
    };
  }

  /** A warning the API server's answers can repeat without end: rate-limited per message. */
  #warn(msg: string, fields: () => Record<string, unknown>): void {
    const suppressed = this.#warnings.admit(msg, performance.now());
    if (suppressed === undefined) return;
    this.#log.warn(suppressed > 0 ? { ...fields(), suppressed } : fields(), msg);
  }

  /** The object, with kind and apiVersion filled in (list items lack them); undefined (logged) if unusable. */
  #accept(value: unknown, where: string): ApiObject | undefined {
    const name = isRecord(value) && isRecord(value.metadata) ? value.metadata.name : undefined;
    if (!isRecord(value) || typeof name !== 'string' || name === '') {
      this.#warn('Skipping malformed object', () => ({
        where,
        object: truncate(JSON.stringify(value) ?? String(value)),
      }));
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
      const suppressed = this.#warnings.admit('Handler failed', performance.now());
      if (suppressed === undefined) return;
      const object = obj === undefined ? undefined : keyOf(obj);
      this.#log.error({ err, event: op, object, ...(suppressed > 0 && { suppressed }) }, 'Handler failed');
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
      session = await openSession(this.#credentials);
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
  return flat(obj.metadata?.namespace ?? '', '/', obj.metadata?.name ?? '');
}

/** resourceVersions are opaque: equal means unchanged; a missing one always counts as a change. */
function changed(old: StoredVersion, obj: ApiObject): boolean {
  const rv = obj.metadata?.resourceVersion;
  return rv === undefined || storedVersion(rv) !== old;
}
