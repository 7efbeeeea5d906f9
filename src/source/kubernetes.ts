// The Kubernetes source: lists and watches Services and EndpointSlices (kube-proxy's label selector) and
// this Node, and feeds ProxyHandlers. Its own list+watch loop on undici's fetch; client-node only loads the
// kubeconfig and computes auth. Self-healing: 410 → relist, backoff, watchdog, periodic full relist.
import { HttpMethod, KubeConfig, RequestContext } from '@kubernetes/client-node';
import { Agent, type Dispatcher, fetch, type Response } from 'undici';
import type { Logger } from '../lib/log.ts';
import { VERSION } from '../lib/version.ts';
import { Yielder } from '../lib/yielder.ts';
import type { ProxyHandlers } from './handlers.ts';
import type { EndpointSlice, Node, ObjectMeta, Service } from './objects.ts';
import { PROXY_LABEL_SELECTOR } from './objects.ts';

/**
 * Loads the kubeconfig as kube-proxy does: the `--kubeconfig` file, else KUBECONFIG, ~/.kube/config or
 * the in-cluster service account (client-node's loadFromDefault); `--master` replaces the server URL of
 * the current cluster. Throws when a named file cannot be read or parsed.
 */
export function loadKubeConfig(options: { kubeconfig?: string; master?: string }): KubeConfig {
  const kc = new KubeConfig();
  if (options.kubeconfig) kc.loadFromFile(options.kubeconfig);
  else kc.loadFromDefault();
  const master = options.master;
  if (master) {
    const current = kc.getCurrentCluster();
    if (current === null) {
      kc.loadFromClusterAndUser({ name: 'master', server: master, skipTLSVerify: false }, { name: 'master' });
    } else {
      kc.clusters = kc.clusters.map((c) => (c === current ? { ...c, server: master } : c));
    }
  }
  // client-node refuses http:// unless insecure-skip-tls-verify is set; client-go just talks plain HTTP
  // (there is no certificate to verify), and `--master http://127.0.0.1:8080` must keep working.
  const current = kc.getCurrentCluster();
  if (current?.server.startsWith('http:') && !current.skipTLSVerify) {
    kc.clusters = kc.clusters.map((c) => (c === current ? { ...c, skipTLSVerify: true } : c));
  }
  return kc;
}

export type KubernetesSourceOptions = {
  kubeConfig: KubeConfig;
  handlers: ProxyHandlers;
  /** This node's name: its Node object (and only it) feeds onNodeUpdate/onNodeDelete. '' = no Node watch. */
  nodeName: string;
  log: Logger;
  /** A full relist of every resource this often, reconciling anything a watch missed; 0 disables. */
  configSyncPeriodMs: number;
  /** Restart a list or watch that received no bytes for this long (default 5 min). */
  watchdogMs?: number;
  /** Delay before retrying a failed list or watch: doubles per attempt, capped, with jitter. */
  backoff?: { initialMs: number; maxMs: number };
  /** Objects per list page (default 500, as client-go's pager); 0 lists in one response. */
  pageSize?: number;
  /** This Node changed (after the handlers were called); undefined = it was deleted. */
  onNode?: (node: Node | undefined) => void;
};

const DEFAULT_WATCHDOG_MS = 5 * 60_000;
const DEFAULT_BACKOFF = { initialMs: 800, maxMs: 30_000 };
const DEFAULT_PAGE_SIZE = 500;
const SHORT_WATCH_MS = 1000;

/**
 * Services, EndpointSlices and this Node from the API server, as ProxyHandlers events. Each resource runs
 * its own list+watch loop that survives any failure; nothing is emitted after stop().
 */
export class KubernetesSource {
  readonly #reflectors: Reflector[] = [];
  #servicesSynced = false;
  #slicesSynced = false;
  #started = false;
  #node: Node | undefined;
  #nodeListed!: () => void;
  /**
   * Resolves once this Node has been listed completely (whether or not it exists), at once without a
   * node name, and at stop(): what the proxy waits for (bounded) before its first sync.
   */
  readonly nodeListed: Promise<void> = new Promise((resolve) => {
    this.#nodeListed = resolve;
  });

  constructor(options: KubernetesSourceOptions) {
    const h = options.handlers;
    const timing: Timing = {
      watchdogMs: options.watchdogMs ?? DEFAULT_WATCHDOG_MS,
      backoff: options.backoff ?? DEFAULT_BACKOFF,
      relistMs: options.configSyncPeriodMs,
      pageSize: options.pageSize ?? DEFAULT_PAGE_SIZE,
    };
    const make = (resource: Resource, sink: Sink) =>
      new Reflector(resource, sink, options.kubeConfig, options.log.child({ kind: resource.kind }), timing);
    this.#reflectors.push(
      make(SERVICES, {
        add: (o) => h.onServiceAdd(o as Service),
        update: (old, o) => h.onServiceUpdate(old as Service, o as Service),
        delete: (o) => h.onServiceDelete(o as Service),
        synced: () => {
          this.#servicesSynced = true;
          h.onServicesSynced();
        },
      }),
      make(ENDPOINT_SLICES, {
        add: (o) => h.onEndpointSliceAdd(o as EndpointSlice),
        update: (old, o) => h.onEndpointSliceUpdate(old as EndpointSlice, o as EndpointSlice),
        delete: (o) => h.onEndpointSliceDelete(o as EndpointSlice),
        synced: () => {
          this.#slicesSynced = true;
          h.onEndpointSlicesSynced();
        },
      }),
    );
    if (options.nodeName !== '') {
      const node: Resource = { ...NODES, fieldSelector: `metadata.name=${options.nodeName}` };
      const changed = (o: Node | undefined) => {
        this.#node = o;
        options.onNode?.(o);
      };
      this.#reflectors.push(
        make(node, {
          add: (o) => {
            h.onNodeUpdate(o as Node);
            changed(o as Node);
          },
          update: (_old, o) => {
            h.onNodeUpdate(o as Node);
            changed(o as Node);
          },
          delete: (o) => {
            h.onNodeDelete(o as Node);
            changed(undefined);
          },
          synced: () => this.#nodeListed(),
        }),
      );
    } else this.#nodeListed();
  }

  /** This Node as last listed or watched; undefined before, when it does not exist, or without a node name. */
  get node(): Node | undefined {
    return this.#node;
  }

  /** True once Services and EndpointSlices have each been listed completely. */
  get synced(): boolean {
    return this.#servicesSynced && this.#slicesSynced;
  }

  /** Starts the loops and resolves at once: it does not wait for the API server. A second call is a no-op. */
  async start(): Promise<void> {
    if (this.#started) return;
    this.#started = true;
    for (const r of this.#reflectors) r.start();
  }

  /** Aborts every request and timer and resolves when all are released. Idempotent; final. */
  async stop(): Promise<void> {
    this.#started = true;
    this.#nodeListed();
    await Promise.all(this.#reflectors.map((r) => r.stop()));
  }
}

// --- one resource: list, then watch from the list's resourceVersion, forever ------------------------------

type Kind = 'Service' | 'EndpointSlice' | 'Node';
type KubeObject = { apiVersion?: string; kind?: string; metadata?: ObjectMeta };
type Resource = {
  kind: Kind;
  apiVersion: string;
  path: string;
  labelSelector?: string;
  fieldSelector?: string;
};
type Sink = {
  add(obj: KubeObject): void;
  update(old: KubeObject, obj: KubeObject): void;
  delete(obj: KubeObject): void;
  /** After the first complete list. */
  synced(): void;
};
type Timing = {
  watchdogMs: number;
  backoff: { initialMs: number; maxMs: number };
  relistMs: number;
  pageSize: number;
};

const SERVICES: Resource = {
  kind: 'Service',
  apiVersion: 'v1',
  path: '/api/v1/services',
  labelSelector: PROXY_LABEL_SELECTOR,
};
const ENDPOINT_SLICES: Resource = {
  kind: 'EndpointSlice',
  apiVersion: 'discovery.k8s.io/v1',
  path: '/apis/discovery.k8s.io/v1/endpointslices',
  labelSelector: PROXY_LABEL_SELECTOR,
};
const NODES: Resource = { kind: 'Node', apiVersion: 'v1', path: '/api/v1/nodes' };

/** An HTTP status from the API server, or the `code` of a watch ERROR event. */
class ApiError extends Error {
  readonly statusCode: number;
  constructor(statusCode: number, message: string) {
    super(message);
    this.name = 'ApiError';
    this.statusCode = statusCode;
  }
}

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

class Reflector {
  readonly #resource: Resource;
  readonly #sink: Sink;
  readonly #kc: KubeConfig;
  readonly #log: Logger;
  readonly #timing: Timing;
  /** The objects as last delivered, keyed `namespace/name`. */
  readonly #cache = new Map<string, KubeObject>();
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
    const listed = new Map<string, KubeObject>();
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
  #accept(value: unknown, where: string): KubeObject | undefined {
    const name = isRecord(value) && isRecord(value.metadata) ? value.metadata.name : undefined;
    if (!isRecord(value) || typeof name !== 'string' || name === '') {
      this.#log.warn(
        { where, object: truncate(JSON.stringify(value) ?? String(value)) },
        'Skipping malformed object',
      );
      return undefined;
    }
    const obj = value as KubeObject;
    obj.kind ??= this.#resource.kind;
    obj.apiVersion ??= this.#resource.apiVersion;
    return obj;
  }

  #emit(op: 'add' | 'delete', obj: KubeObject): void;
  #emit(op: 'update', obj: KubeObject, old: KubeObject): void;
  #emit(op: 'synced'): void;
  #emit(op: keyof Sink, obj?: KubeObject, old?: KubeObject): void {
    if (this.#stopped) return;
    try {
      if (op === 'synced') this.#sink.synced();
      else if (op === 'update') this.#sink.update(old!, obj!);
      else this.#sink[op](obj!);
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

// --- HTTP ------------------------------------------------------------------------------------------------

type Query = Record<string, string | number | undefined>;
type Session = {
  url(path: string, query: Query): URL;
  init(signal: AbortSignal): { headers: Record<string, string>; dispatcher: Dispatcher; signal: AbortSignal };
  dispatcher: Dispatcher;
};

const USER_AGENT = `kube-userspace-proxy/${VERSION}`;

/**
 * Auth headers and a dispatcher (TLS material, proxy) for the current context, computed afresh by
 * client-node for each list or watch, so rotated tokens and certificates are picked up.
 */
async function openSession(kc: KubeConfig): Promise<Session> {
  const cluster = kc.getCurrentCluster();
  if (cluster === null) throw new Error('the kubeconfig has no current cluster');
  const base = cluster.server.replace(/\/+$/, '');
  const ctx = new RequestContext(base, HttpMethod.GET);
  await kc.applySecurityAuthentication(ctx);
  const headers = { ...ctx.getHeaders(), Accept: 'application/json', 'User-Agent': USER_AGENT };
  // Without TLS options client-node leaves the global dispatcher; ours can be destroyed at the end.
  const dispatcher =
    ctx.getDispatcher() ?? new Agent({ connect: { keepAlive: true, keepAliveInitialDelay: 30_000 } });
  return {
    url(path, query) {
      const url = new URL(base + path);
      for (const [k, v] of Object.entries(query)) if (v !== undefined) url.searchParams.set(k, String(v));
      return url;
    },
    init: (signal) => ({ headers, dispatcher, signal }),
    dispatcher,
  };
}

async function apiError(res: Response): Promise<ApiError> {
  let message = res.statusText || `HTTP ${res.status}`;
  try {
    const text = await res.text();
    const status: unknown = JSON.parse(text);
    if (isRecord(status) && typeof status.message === 'string') message = status.message;
  } catch {
    // Not a Status body: the status line says enough.
  }
  return new ApiError(res.status, `${res.status}: ${truncate(message)}`);
}

/** The body as JSON, touching the watchdog for every chunk (a large list takes a while). */
async function readJson(res: Response, touch: () => void): Promise<unknown> {
  if (res.body === null) return undefined;
  const chunks: Uint8Array[] = [];
  for await (const chunk of res.body) {
    touch();
    chunks.push(chunk);
  }
  return JSON.parse(Buffer.concat(chunks).toString('utf8'));
}

// --- small helpers ---------------------------------------------------------------------------------------

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function keyOf(obj: KubeObject): string {
  return `${obj.metadata?.namespace ?? ''}/${obj.metadata?.name ?? ''}`;
}

/** resourceVersions are opaque: equal means unchanged; a missing one always counts as a change. */
function changed(old: KubeObject, obj: KubeObject): boolean {
  const rv = obj.metadata?.resourceVersion;
  return rv === undefined || rv !== old.metadata?.resourceVersion;
}

function truncate(text: string, max = 200): string {
  return text.length > max ? `${text.slice(0, max)}…` : text;
}
