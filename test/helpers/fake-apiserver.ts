// A stand-in Kubernetes API server for tests: Services, EndpointSlices and Nodes over plain HTTP on
// loopback, speaking the real list/watch wire protocol (NDJSON watch, resourceVersions, selectors,
// pagination, 410 Expired) so @kubernetes/client-node runs against it unmodified; plus fault injection
// and hostile modes (answers without end, 410 storms, floods of unknown events, HTML pages).
import { randomUUID } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import { createServer, type IncomingHttpHeaders, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { stringify } from 'yaml';
import type {
  EndpointSlice,
  EndpointSliceEndpoint,
  EndpointSlicePort,
  Node,
  ObjectMeta,
  Service,
} from '../../src/source/objects.ts';

/** The kinds the stand-in serves. */
export type Kind = 'Service' | 'EndpointSlice' | 'Node';
/** Any object the store holds; `kind` picks the resource. */
export type ApiObject = { apiVersion?: string; kind?: string; metadata?: Meta };
type Meta = Pick<ObjectMeta, 'name' | 'namespace' | 'resourceVersion' | 'uid' | 'labels' | 'annotations'>;
export type WatchEventType = 'ADDED' | 'MODIFIED' | 'DELETED' | 'BOOKMARK' | 'ERROR';
/** How a watch from a resourceVersion older than the history is refused. */
export type ExpiredAs = 'event' | 'http';
/** Which requests a fault applies to; `list` includes single-object gets. */
export type FaultTarget = 'list' | 'watch' | 'any';
export type Verb = 'list' | 'watch' | 'get' | 'other';

export type RecordedRequest = {
  method: string;
  path: string;
  query: Record<string, string>;
  headers: IncomingHttpHeaders;
  verb: Verb;
};

export type FakeApiServerOptions = {
  /** When set, every request must carry `Authorization: Bearer <token>` (else 401). */
  token?: string;
  /** Events kept for watches that resume from an older resourceVersion (default 1000). */
  historySize?: number;
  host?: string;
  /** Period of BOOKMARK events on watches that allow them (default 60 s, like kube-apiserver). */
  bookmarkIntervalMs?: number;
  /** How a too-old watch is refused (default `event`: 200, ERROR 410 event, close). */
  expiredAs?: ExpiredAs;
};

/**
 * Answers of a broken or hostile API server (or of what stands in front of one). The endless ones write
 * only as fast as the client reads (backpressure), each bounded by HOSTILE_MAX_BYTES and HOSTILE_MAX_MS.
 */
export type HostileMode =
  /** Lists: every page is full (`limit`, default 500) and carries a new continue token, forever. */
  | 'endless-continue'
  /** Lists: 200 and a JSON body that never ends (`{"items":[` then objects). */
  | 'endless-body'
  /** Watches: 200 and one line that never ends. */
  | 'endless-line'
  /** Lists: 200 and one page (no continue token) of `item` repeated to `bytes`, then the list's end. */
  | 'huge-page'
  /** Watches: 200 and ADDED events, each for an object with a new name, without end. */
  | 'endless-adds'
  /** Watches: 200, an ERROR 410 event and the end, whatever the resourceVersion (lists succeed). */
  | 'gone-storm'
  /** Watches: 200 and events of unknown types, without end. */
  | 'unknown-types'
  /** Every request: a proxy's HTML error page (status 200 unless `status` says otherwise). */
  | 'html';

export type HostileOptions = {
  /** Only requests to this path (e.g. `/api/v1/services`); default every resource path. */
  path?: string;
  /** The HTTP status of `html` answers (default 200). */
  status?: number;
  /** The size of a `huge-page` answer, in bytes (default 40 MiB). */
  bytes?: number;
  /** The JSON of each item of a `huge-page` answer (default a small object with a new name each). */
  item?: string;
};

/** What one hostile answer may write at most, so that every test loop ends. */
export const HOSTILE_MAX_BYTES = 2 * 1024 ** 3;
export const HOSTILE_MAX_MS = 60_000;

/** An nginx-style error page, as a proxy in front of the API server answers. */
export const HTML_ERROR_PAGE =
  '<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n';

type Resource = { kind: Kind; apiVersion: string; prefix: string; plural: string; namespaced: boolean };
const resource = (kind: Kind, apiVersion: string, plural: string, namespaced: boolean): Resource => {
  const prefix = apiVersion === 'v1' ? '/api/v1' : `/apis/${apiVersion}`;
  return { kind, apiVersion, prefix, plural, namespaced };
};
const RESOURCES: readonly Resource[] = [
  resource('Service', 'v1', 'services', true),
  resource('EndpointSlice', 'discovery.k8s.io/v1', 'endpointslices', true),
  resource('Node', 'v1', 'nodes', false),
];
const ROUTE =
  /^(\/api\/v1|\/apis\/discovery\.k8s\.io\/v1)(?:\/namespaces\/([^/]+))?\/([a-z]+)(?:\/([^/]+))?$/;

type Route = { resource: Resource; namespace: string | undefined; name: string | undefined };
type StoredEvent = {
  type: 'ADDED' | 'MODIFIED' | 'DELETED';
  rv: number;
  object: ApiObject;
  prev?: ApiObject;
};
type Predicate = (obj: ApiObject) => boolean;
type Snapshot = { rv: number; rest: ApiObject[] };
type Waiter = { test: (r: RecordedRequest) => boolean; resolve: (r: RecordedRequest) => void };

/** Start a stand-in API server on `host` (default 127.0.0.1), port 0. */
export async function startFakeApiServer(options: FakeApiServerOptions = {}): Promise<FakeApiServer> {
  const server = new FakeApiServer(options);
  await server.restart();
  return server;
}

export class FakeApiServer {
  /** Every request received, in order (method, path, parsed query, headers). */
  readonly requests: RecordedRequest[] = [];
  readonly host: string;
  #port = 0;
  readonly #token: string | undefined;
  readonly #historySize: number;
  readonly #bookmarkIntervalMs: number;
  #expiredAs: ExpiredAs;
  readonly #http = createServer((req, res) =>
    this.#handle(req.method ?? '', req.url ?? '/', req.headers, res),
  );
  readonly #store = new Map<string, ApiObject>();
  #rv = 0;
  /** Oldest resourceVersion a watch may resume from: every event after it is still in #history. */
  #floor = 0;
  #history: StoredEvent[] = [];
  readonly #watches = new Set<WatchStream>();
  readonly #snapshots = new Map<string, Snapshot>();
  #silent = false;
  #fail: { status: number; target: FaultTarget; remaining: number } | null = null;
  #waiters: Waiter[] = [];
  #listening = false;
  #hostile: { mode: HostileMode; options: HostileOptions } | null = null;
  /** Open hostile answers, ended when the mode is turned off. */
  readonly #hostileAnswers = new Set<ServerResponse>();
  #hostileBytes = 0;

  constructor(options: FakeApiServerOptions = {}) {
    this.host = options.host ?? '127.0.0.1';
    this.#token = options.token;
    this.#historySize = options.historySize ?? 1000;
    this.#bookmarkIntervalMs = options.bookmarkIntervalMs ?? 60_000;
    this.#expiredAs = options.expiredAs ?? 'event';
  }

  get port(): number {
    return this.#port;
  }

  get url(): string {
    return `http://${this.host.includes(':') ? `[${this.host}]` : this.host}:${this.#port}`;
  }

  /** The current (latest) resourceVersion, as a string. */
  get resourceVersion(): string {
    return String(this.#rv);
  }

  /** Number of watch streams currently open. */
  get openWatches(): number {
    return this.#watches.size;
  }

  /** A kubeconfig for this server (plain http needs insecure-skip-tls-verify in client-node). */
  kubeconfigYaml(): string {
    return stringify({
      apiVersion: 'v1',
      kind: 'Config',
      clusters: [{ name: 'fake', cluster: { server: this.url, 'insecure-skip-tls-verify': true } }],
      users: [{ name: 'fake-user', user: this.#token === undefined ? {} : { token: this.#token } }],
      contexts: [{ name: 'fake', context: { cluster: 'fake', user: 'fake-user', namespace: 'default' } }],
      'current-context': 'fake',
    });
  }

  /** Write the kubeconfig as `<dir>/kubeconfig` (mode 0600) and return its path. */
  async writeKubeconfig(dir: string): Promise<string> {
    const path = join(dir, 'kubeconfig');
    await writeFile(path, this.kubeconfigYaml(), { mode: 0o600 });
    return path;
  }

  // --- object store ---------------------------------------------------------------------------------

  /** Add an object (throws if it exists); stamps uid, creationTimestamp and a new resourceVersion. */
  create<T extends ApiObject>(obj: T): T {
    const { resource, key, copy } = this.#prepare(obj);
    if (this.#store.has(key)) throw new Error(`${resource.plural} "${copy.metadata?.name}" already exists`);
    copy.metadata = { uid: randomUUID(), creationTimestamp: timestamp(), ...copy.metadata } as Meta;
    return this.#commit('ADDED', key, undefined, copy) as T;
  }

  /** Replace an existing object (throws if missing); keeps uid/creationTimestamp, bumps the RV. */
  update<T extends ApiObject>(obj: T): T {
    const { resource, key, copy } = this.#prepare(obj);
    const prev = this.#store.get(key);
    if (!prev) throw new Error(`${resource.plural} "${copy.metadata?.name}" not found`);
    const { uid, creationTimestamp } = prev.metadata as Meta & { creationTimestamp?: string };
    copy.metadata = { uid, creationTimestamp, ...copy.metadata } as Meta;
    return this.#commit('MODIFIED', key, prev, copy) as T;
  }

  /** Delete an object (throws if missing); watchers get its last state with a new RV. */
  remove(kind: Kind, namespace: string, name: string): ApiObject {
    const key = storeKey(kind, namespace, name);
    const prev = this.#store.get(key);
    if (!prev) throw new Error(`${kind} ${namespace}/${name} not found`);
    return this.#commit('DELETED', key, prev, structuredClone(prev));
  }

  /** A copy of the stored object (namespace '' for Nodes), or undefined. */
  get<T extends ApiObject = ApiObject>(kind: Kind, namespace: string, name: string): T | undefined {
    const obj = this.#store.get(storeKey(kind, namespace, name));
    return obj === undefined ? undefined : (structuredClone(obj) as T);
  }

  /** Copies of all stored objects of a kind, sorted by namespace and name. */
  list<T extends ApiObject = ApiObject>(kind: Kind): T[] {
    return this.#select(kind, () => true).map((o) => structuredClone(o) as T);
  }

  // --- faults -----------------------------------------------------------------------------------------

  /** End every open watch stream cleanly (as the apiserver's request timeout does). */
  closeWatches(): void {
    for (const w of this.#watches) w.end();
  }

  /** Destroy the socket of every open watch stream (no terminating chunk). */
  cutWatches(): void {
    for (const w of this.#watches) w.cut();
  }

  /** Answer the next `n` matching requests with `status` and a Status body. */
  failNext(n: number, status: number, target: FaultTarget = 'any'): void {
    this.#fail = n > 0 ? { status, target, remaining: n } : null;
  }

  /** Answer every matching request with `status` until called with null. */
  setFailing(status: number | null, target: FaultTarget = 'any'): void {
    this.#fail = status === null ? null : { status, target, remaining: Number.POSITIVE_INFINITY };
  }

  /**
   * While on, open and new watches send nothing (no events, no bookmarks), like a stuck connection;
   * held events are written when silence ends, and dropped if the stream ends first.
   */
  silence(on: boolean): void {
    this.#silent = on;
    if (!on) for (const w of this.#watches) w.release();
  }

  /**
   * Forget the event history and continue tokens: any watch from an RV older than now gets 410,
   * answered as `as` (which also becomes the mode for later refusals). Open watches are untouched.
   */
  expireHistory(as: ExpiredAs = this.#expiredAs): void {
    this.#expiredAs = as;
    // An unseen write elsewhere (RVs are global in etcd) so that even an up-to-date client is too old.
    this.#rv++;
    this.#floor = this.#rv;
    this.#history = [];
    this.#snapshots.clear();
  }

  /** Send a BOOKMARK at the current RV to every watch that allowed bookmarks. */
  sendBookmark(): void {
    for (const w of this.#watches) w.bookmark(this.#rv);
  }

  /** Write a raw line (e.g. unparsable text) to every open watch stream. */
  injectLine(text: string): void {
    for (const w of this.#watches) w.send(text);
  }

  /**
   * Answer matching requests as a broken or hostile server would (see HostileMode) until called with
   * null, which also ends the hostile answers still open. Faults (failNext, setFailing) come after it.
   */
  hostile(mode: HostileMode | null, options: HostileOptions = {}): void {
    this.#hostile = mode === null ? null : { mode, options };
    if (mode === null) for (const res of this.#hostileAnswers) res.end();
  }

  /** Bytes written by hostile answers so far: at most what the client read, plus socket buffers. */
  get hostileBytes(): number {
    return this.#hostileBytes;
  }

  /** Resolve with the first request (from index `from` on) that satisfies `test`; reject after the timeout. */
  waitForRequest(
    test: (r: RecordedRequest) => boolean,
    timeoutMs = 5000,
    from = 0,
  ): Promise<RecordedRequest> {
    const seen = this.requests.slice(from).find(test);
    if (seen) return Promise.resolve(seen);
    return new Promise((resolve, reject) => {
      const waiter: Waiter = {
        test,
        resolve: (r) => {
          clearTimeout(timer);
          resolve(r);
        },
      };
      const timer = setTimeout(() => {
        this.#waiters = this.#waiters.filter((w) => w !== waiter);
        const log = this.requests.map((r) => `${r.verb} ${r.path}?${new URLSearchParams(r.query)}`);
        reject(new Error(`no matching request within ${timeoutMs} ms; got:\n${log.join('\n')}`));
      }, timeoutMs);
      this.#waiters.push(waiter);
    });
  }

  // --- lifecycle ----------------------------------------------------------------------------------------

  /** Take the server down abruptly: open connections are destroyed, new ones refused. Idempotent. */
  async stop(): Promise<void> {
    if (!this.#listening) return;
    this.#listening = false;
    for (const w of this.#watches) w.cut();
    const closed = new Promise<void>((resolve) => this.#http.close(() => resolve()));
    this.#http.closeAllConnections();
    await closed;
  }

  /** Final release for t.after: same as stop(). */
  close(): Promise<void> {
    return this.stop();
  }

  /** Listen again (first start: a free port; later: the same port), keeping store and RV counter. */
  async restart(): Promise<void> {
    if (this.#listening) return;
    await new Promise<void>((resolve, reject) => {
      this.#http.once('error', reject);
      this.#http.listen(this.#port, this.host, () => {
        this.#http.off('error', reject);
        resolve();
      });
    });
    this.#port = (this.#http.address() as AddressInfo).port;
    this.#listening = true;
  }

  // --- internals ----------------------------------------------------------------------------------------

  #prepare(obj: ApiObject): { resource: Resource; key: string; copy: ApiObject } {
    const resource = RESOURCES.find((r) => r.kind === obj.kind);
    if (!resource) throw new Error(`unsupported kind ${obj.kind}`);
    const copy = structuredClone(obj);
    copy.apiVersion = resource.apiVersion;
    const meta = copy.metadata ?? {};
    if (!meta.name) throw new Error(`${obj.kind} without metadata.name`);
    if (resource.namespaced) meta.namespace ??= 'default';
    else delete meta.namespace;
    copy.metadata = meta;
    return { resource, key: storeKey(resource.kind, meta.namespace ?? '', meta.name), copy };
  }

  #commit(type: StoredEvent['type'], key: string, prev: ApiObject | undefined, next: ApiObject): ApiObject {
    this.#rv++;
    (next.metadata as Meta).resourceVersion = String(this.#rv);
    if (type === 'DELETED') this.#store.delete(key);
    else this.#store.set(key, next);
    const event: StoredEvent = { type, rv: this.#rv, object: next, prev };
    this.#history.push(event);
    while (this.#history.length > this.#historySize) this.#floor = this.#history.shift()?.rv ?? this.#floor;
    for (const w of this.#watches) w.offer(event);
    return structuredClone(next);
  }

  #select(kind: Kind, matches: Predicate): ApiObject[] {
    const out: ApiObject[] = [];
    for (const obj of this.#store.values()) if (obj.kind === kind && matches(obj)) out.push(obj);
    return out.sort((a, b) => objectKey(a).localeCompare(objectKey(b)));
  }

  // These return what the send helpers return (nothing) only to keep early exits on one line.
  #handle(method: string, rawUrl: string, headers: IncomingHttpHeaders, res: ServerResponse) {
    const url = new URL(rawUrl, 'http://fake');
    const query = Object.fromEntries(url.searchParams);
    const route = parseRoute(url.pathname);
    const watch = query['watch'] === 'true' || query['watch'] === '1';
    let verb: Verb = 'other';
    if (route && method === 'GET') verb = route.name !== undefined ? 'get' : watch ? 'watch' : 'list';
    const recorded: RecordedRequest = { method, path: url.pathname, query, headers, verb };
    this.requests.push(recorded);
    for (const w of this.#waiters.filter((w) => w.test(recorded))) {
      this.#waiters = this.#waiters.filter((x) => x !== w);
      w.resolve(recorded);
    }

    if (this.#token !== undefined && headers.authorization !== `Bearer ${this.#token}`)
      return sendStatus(res, 401, 'Unauthorized');
    if (!route) return sendStatus(res, 404, 'the server could not find the requested resource');
    if (method !== 'GET') return sendStatus(res, 405, `${method} is not supported by the stand-in`);
    const hostile = this.#hostile;
    if (hostile && (hostile.options.path === undefined || hostile.options.path === url.pathname)) {
      if (this.#answerHostile(res, hostile.mode, hostile.options, verb, route.resource, query)) return;
    }
    const fail = this.#fail;
    if (fail && (fail.target === 'any' || fail.target === (verb === 'watch' ? 'watch' : 'list'))) {
      if (--fail.remaining <= 0) this.#fail = null;
      return sendStatus(res, fail.status, `injected failure (${fail.status})`);
    }

    const { resource, namespace, name } = route;
    if (name !== undefined) {
      const obj = this.#store.get(storeKey(resource.kind, namespace ?? '', name));
      if (!obj) return sendStatus(res, 404, `${resource.plural} "${name}" not found`);
      return sendJson(res, 200, obj);
    }
    let matches: Predicate;
    try {
      matches = selectorPredicate(resource.kind, namespace, query['labelSelector'], query['fieldSelector']);
    } catch (err) {
      return sendStatus(res, 400, (err as Error).message);
    }
    if (watch) this.#watch(res, resource, matches, query);
    else this.#list(res, resource, matches, query);
  }

  #list(res: ServerResponse, resource: Resource, matches: Predicate, query: Record<string, string>) {
    let snapshot: Snapshot = { rv: this.#rv, rest: [] };
    if (query['continue']) {
      const found = this.#snapshots.get(query['continue']);
      if (!found) return sendStatus(res, 410, 'The provided continue parameter is too old or unknown.');
      this.#snapshots.delete(query['continue']);
      snapshot = found;
    } else {
      // The list keeps the stored objects' kind/apiVersion out of items, as the apiserver does.
      snapshot.rest = this.#select(resource.kind, matches).map(({ kind: _k, apiVersion: _a, ...o }) => o);
    }
    const limit = Number(query['limit'] ?? 0);
    const items = limit > 0 ? snapshot.rest.slice(0, limit) : snapshot.rest;
    const rest = snapshot.rest.slice(items.length);
    const metadata: Record<string, unknown> = { resourceVersion: String(snapshot.rv) };
    if (rest.length > 0) {
      const start = `${objectKey(items[items.length - 1] ?? {})}\u0000`;
      const token = Buffer.from(JSON.stringify({ v: 'meta.k8s.io/v1', rv: snapshot.rv, start })).toString(
        'base64url',
      );
      this.#snapshots.set(token, { rv: snapshot.rv, rest });
      metadata['continue'] = token;
      metadata['remainingItemCount'] = rest.length;
    }
    sendJson(res, 200, { kind: `${resource.kind}List`, apiVersion: resource.apiVersion, metadata, items });
  }

  /** The hostile answer to one request; false when the mode does not apply to this verb. */
  #answerHostile(
    res: ServerResponse,
    mode: HostileMode,
    options: HostileOptions,
    verb: Verb,
    resource: Resource,
    query: Record<string, string>,
  ): boolean {
    const count = (bytes: number) => {
      this.#hostileBytes += bytes;
    };
    if (mode === 'html') {
      res.writeHead(options.status ?? 200, { 'Content-Type': 'text/html' });
      res.end(HTML_ERROR_PAGE);
      count(HTML_ERROR_PAGE.length);
      return true;
    }
    const rv = String(this.#rv);
    const item = (n: number) =>
      `{"metadata":{"name":"hostile-${n}","namespace":"default","resourceVersion":"${rv}"}}`;
    if (mode === 'endless-continue' && verb === 'list') {
      const limit = Number(query['limit'] ?? 0) > 0 ? Number(query['limit']) : 500;
      const page = Number(query['continue']?.replace(/^hostile-/, '') ?? 0) || 0;
      const items = Array.from({ length: limit }, (_, i) => item(page * limit + i));
      const metadata = { resourceVersion: rv, continue: `hostile-${page + 1}` };
      const text = `{"kind":"${resource.kind}List","apiVersion":"${resource.apiVersion}","metadata":${JSON.stringify(metadata)},"items":[${items.join(',')}]}`;
      res.writeHead(200, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(text) });
      res.end(text);
      count(text.length);
      return true;
    }
    if (mode === 'endless-body' && verb === 'list') {
      const head = `{"kind":"${resource.kind}List","apiVersion":"${resource.apiVersion}","metadata":{"resourceVersion":"${rv}"},"items":[`;
      let n = 0;
      this.#pump(res, head, () => {
        const batch: string[] = [];
        for (let i = 0; i < 500; i++) batch.push(`${item(n++)},`);
        return batch.join('');
      });
      return true;
    }
    if (mode === 'huge-page' && verb === 'list') {
      const head = `{"kind":"${resource.kind}List","apiVersion":"${resource.apiVersion}","metadata":{"resourceVersion":"${rv}"},"items":[`;
      let n = 0;
      const batch = () => {
        const items: string[] = [];
        for (let i = 0; i < 500; i++) items.push(`${options.item ?? item(n++)},`);
        return items.join('');
      };
      const last = options.item ?? item(n);
      this.#pump(res, head, batch, { bytes: options.bytes ?? 40 * 1024 ** 2, tail: `${last}]}` });
      return true;
    }
    if (mode === 'endless-adds' && verb === 'watch') {
      let n = 0;
      this.#pump(res, '', () => {
        const lines: string[] = [];
        for (let i = 0; i < 100; i++) {
          const name = `hostile-${n++}`;
          const object: ApiObject =
            resource.kind === 'Service'
              ? makeService('default', name)
              : { metadata: { name, namespace: 'default' } };
          object.metadata = { ...object.metadata, resourceVersion: rv };
          lines.push(`${JSON.stringify({ type: 'ADDED', object })}\n`);
        }
        return lines.join('');
      });
      return true;
    }
    if (mode === 'endless-line' && verb === 'watch') {
      const filler = 'a'.repeat(64 * 1024);
      this.#pump(res, '{"type":"ADDED","object":{"metadata":{"name":"', () => filler);
      return true;
    }
    if (mode === 'gone-storm' && verb === 'watch') {
      const message = `too old resource version: ${query['resourceVersion'] ?? ''} (${this.#rv + 1})`;
      const text = `${JSON.stringify({ type: 'ERROR', object: status(410, message) })}\n`;
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end(text);
      count(text.length);
      return true;
    }
    if (mode === 'unknown-types' && verb === 'watch') {
      const line = `{"type":"SURPRISE","object":{"kind":"${resource.kind}","metadata":{"name":"x","resourceVersion":"${rv}"}}}\n`;
      const batch = line.repeat(Math.ceil((16 * 1024) / line.length));
      this.#pump(res, '', () => batch);
      return true;
    }
    return false;
  }

  /**
   * 200 and `head`, then `next()` as fast as the client reads, until it leaves or a bound is hit; with
   * `until`, ends with its `tail` once `until.bytes` are sent.
   */
  #pump(
    res: ServerResponse,
    head: string,
    next: () => string,
    until?: { bytes: number; tail: string },
  ): void {
    const started = Date.now();
    let sent = 0;
    this.#hostileAnswers.add(res);
    res.on('close', () => this.#hostileAnswers.delete(res));
    res.writeHead(200, { 'Content-Type': 'application/json' });
    const write = (text: string): boolean => {
      sent += text.length;
      this.#hostileBytes += text.length;
      return res.write(text);
    };
    const fill = (): void => {
      for (;;) {
        if (res.writableEnded || res.destroyed) return;
        if (until !== undefined && sent >= until.bytes) {
          res.end(until.tail);
          this.#hostileBytes += until.tail.length;
          return;
        }
        if (sent >= HOSTILE_MAX_BYTES || Date.now() - started >= HOSTILE_MAX_MS) {
          res.end();
          return;
        }
        if (!write(next())) {
          res.once('drain', fill);
          return;
        }
      }
    };
    write(head);
    fill();
  }

  #watch(res: ServerResponse, resource: Resource, matches: Predicate, query: Record<string, string>) {
    const rv = query['resourceVersion'] ?? '';
    const from = Number(rv);
    if (rv !== '' && rv !== '0' && (!Number.isInteger(from) || from < this.#floor)) {
      const message = `too old resource version: ${rv} (${this.#floor})`;
      if (this.#expiredAs === 'http') return sendStatus(res, 410, message);
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end(`${JSON.stringify({ type: 'ERROR', object: status(410, message) })}\n`);
      return;
    }
    const stream = new WatchStream(res, resource, matches, () => this.#silent);
    res.writeHead(200, { 'Content-Type': 'application/json', 'Cache-Control': 'no-cache, private' });
    // client-node's informer start() waits for the response headers.
    res.flushHeaders();
    this.#watches.add(stream);
    res.on('close', () => {
      stream.dispose();
      this.#watches.delete(stream);
    });
    if (rv === '' || rv === '0') {
      // "Any" RV: synthetic ADDED events for the current state, then live changes.
      for (const obj of this.#select(resource.kind, matches)) stream.emit('ADDED', obj);
    } else {
      for (const event of this.#history) if (event.rv > from) stream.offer(event);
    }
    if (query['allowWatchBookmarks'] === 'true') {
      stream.every(this.#bookmarkIntervalMs, () => stream.bookmark(this.#rv));
    }
    const timeoutSeconds = Number(query['timeoutSeconds'] ?? 0);
    if (timeoutSeconds > 0) stream.after(timeoutSeconds * 1000, () => stream.end());
  }
}

/** One open watch response: filters events through its selectors and holds output while silenced. */
class WatchStream {
  readonly #res: ServerResponse;
  readonly #resource: Resource;
  readonly #matches: Predicate;
  readonly #silent: () => boolean;
  readonly #held: string[] = [];
  readonly #timers: NodeJS.Timeout[] = [];
  #bookmarks = false;

  constructor(res: ServerResponse, resource: Resource, matches: Predicate, silent: () => boolean) {
    this.#res = res;
    this.#resource = resource;
    this.#matches = matches;
    this.#silent = silent;
  }

  /** Deliver a stored event as this watch sees it (an object leaving the selector is DELETED). */
  offer(event: StoredEvent): void {
    const was = event.prev !== undefined && this.#matches(event.prev);
    const is = this.#matches(event.object);
    if (event.type === 'DELETED') {
      if (is) this.emit('DELETED', event.object);
    } else if (is) {
      this.emit(was ? 'MODIFIED' : 'ADDED', event.object);
    } else if (was && event.prev) {
      // Previous content with the event's RV, as the apiserver's watch cache does.
      const gone = structuredClone(event.prev);
      (gone.metadata as Meta).resourceVersion = String(event.rv);
      this.emit('DELETED', gone);
    }
  }

  emit(type: WatchEventType, object: ApiObject): void {
    const full = { kind: this.#resource.kind, apiVersion: this.#resource.apiVersion, ...object };
    this.send(JSON.stringify({ type, object: full }));
  }

  bookmark(rv: number): void {
    if (!this.#bookmarks || this.#silent()) return;
    const object = { kind: this.#resource.kind, apiVersion: this.#resource.apiVersion };
    this.send(
      JSON.stringify({ type: 'BOOKMARK', object: { ...object, metadata: { resourceVersion: `${rv}` } } }),
    );
  }

  send(line: string): void {
    if (this.#silent()) this.#held.push(line);
    else if (!this.#res.writableEnded) this.#res.write(`${line}\n`);
  }

  release(): void {
    for (const line of this.#held.splice(0)) this.send(line);
  }

  every(ms: number, fn: () => void): void {
    this.#bookmarks = true;
    this.#timers.push(setInterval(fn, ms).unref());
  }

  after(ms: number, fn: () => void): void {
    this.#timers.push(setTimeout(fn, ms).unref());
  }

  end(): void {
    this.#res.end();
  }

  cut(): void {
    this.#res.socket?.destroy();
  }

  dispose(): void {
    for (const t of this.#timers) clearTimeout(t);
    this.#held.length = 0;
  }
}

// --- selectors --------------------------------------------------------------------------------------------

type Requirement = { key: string; op: '=' | '!=' | 'in' | 'notin' | 'exists' | '!'; values: string[] };
const KEY = '[A-Za-z0-9][-A-Za-z0-9_./]*';
const VALUE = '[-A-Za-z0-9_.]*';
const SET_RE = new RegExp(`^(${KEY})\\s+(in|notin)\\s*\\(([^)]*)\\)$`);
const CMP_RE = new RegExp(`^(${KEY})\\s*(==|!=|=)\\s*(${VALUE})$`);
const EXISTS_RE = new RegExp(`^(!?)\\s*(${KEY})$`);

/** Parse a label selector (comma = AND; `k`, `!k`, `k=v`, `k==v`, `k!=v`, `k in (..)`, `k notin (..)`). */
export function parseLabelSelector(text: string): Requirement[] {
  const parts: string[] = [];
  let depth = 0;
  let current = '';
  for (const ch of text) {
    if (ch === '(') depth++;
    if (ch === ')') depth--;
    if (ch === ',' && depth === 0) {
      parts.push(current);
      current = '';
    } else current += ch;
  }
  parts.push(current);
  return parts
    .map((p) => p.trim())
    .filter((p) => p !== '')
    .map(parseRequirement);
}

function parseRequirement(part: string): Requirement {
  const set = SET_RE.exec(part);
  if (set) {
    const values = (set[3] ?? '').split(',').map((v) => v.trim());
    return { key: set[1] ?? '', op: set[2] === 'in' ? 'in' : 'notin', values };
  }
  const cmp = CMP_RE.exec(part);
  if (cmp) return { key: cmp[1] ?? '', op: cmp[2] === '!=' ? '!=' : '=', values: [cmp[3] ?? ''] };
  const exists = EXISTS_RE.exec(part);
  if (exists) return { key: exists[2] ?? '', op: exists[1] === '!' ? '!' : 'exists', values: [] };
  throw new Error(`unable to parse requirement: ${JSON.stringify(part)}`);
}

/** Whether labels satisfy every requirement (absent keys satisfy `!=` and `notin`, as in Go). */
export function matchesLabels(requirements: Requirement[], labels: Record<string, string> = {}): boolean {
  return requirements.every(({ key, op, values }) => {
    const has = Object.hasOwn(labels, key);
    const value = labels[key] ?? '';
    if (op === 'exists') return has;
    if (op === '!') return !has;
    if (op === '=' || op === 'in') return has && values.includes(value);
    return !has || !values.includes(value);
  });
}

function selectorPredicate(
  kind: Kind,
  namespace: string | undefined,
  labelSelector: string | undefined,
  fieldSelector: string | undefined,
): Predicate {
  const labels = parseLabelSelector(labelSelector ?? '');
  const fields = (fieldSelector ?? '')
    .split(',')
    .filter((p) => p.trim() !== '')
    .map((part) => {
      const m = /^\s*([A-Za-z.]+)\s*(==|!=|=)\s*(.*?)\s*$/.exec(part);
      if (!m || (m[1] !== 'metadata.name' && m[1] !== 'metadata.namespace'))
        throw new Error(`field label not supported: ${part}`);
      return { field: m[1] === 'metadata.name' ? 'name' : 'namespace', negate: m[2] === '!=', value: m[3] };
    });
  return (obj) => {
    const meta = obj.metadata ?? {};
    if (obj.kind !== kind || (namespace !== undefined && meta.namespace !== namespace)) return false;
    if (!matchesLabels(labels, meta.labels)) return false;
    return fields.every((f) => ((meta[f.field as 'name' | 'namespace'] ?? '') === f.value) !== f.negate);
  };
}

// --- wire helpers -----------------------------------------------------------------------------------------

const REASONS: Record<number, string> = {
  400: 'BadRequest',
  401: 'Unauthorized',
  403: 'Forbidden',
  404: 'NotFound',
  405: 'MethodNotAllowed',
  409: 'AlreadyExists',
  410: 'Expired',
  429: 'TooManyRequests',
  500: 'InternalError',
  503: 'ServiceUnavailable',
};

/** A metav1.Status failure object, as the apiserver sends in error bodies and ERROR events. */
export function status(code: number, message: string): Record<string, unknown> {
  return {
    kind: 'Status',
    apiVersion: 'v1',
    metadata: {},
    status: 'Failure',
    message,
    reason: REASONS[code] ?? 'Unknown',
    code,
  };
}

function sendStatus(res: ServerResponse, code: number, message: string): void {
  sendJson(res, code, status(code, message));
}

function sendJson(res: ServerResponse, code: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(code, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(text) });
  res.end(text);
}

function parseRoute(pathname: string): Route | undefined {
  const m = ROUTE.exec(pathname);
  if (!m) return undefined;
  const resource = RESOURCES.find((r) => r.prefix === m[1] && r.plural === m[3]);
  if (!resource || (m[2] !== undefined && !resource.namespaced)) return undefined;
  return { resource, namespace: m[2] && decodeURIComponent(m[2]), name: m[4] && decodeURIComponent(m[4]) };
}

function storeKey(kind: string, namespace: string, name: string): string {
  return `${kind}/${namespace}/${name}`;
}

function objectKey(obj: ApiObject): string {
  return `${obj.metadata?.namespace ?? ''}/${obj.metadata?.name ?? ''}`;
}

/** RFC 3339 without fractional seconds, as metav1.Time serializes. */
function timestamp(): string {
  return new Date().toISOString().replace(/\.\d+Z$/, 'Z');
}

// --- realistic objects --------------------------------------------------------------------------------------

function hash(text: string): number {
  let h = 2166136261;
  for (const ch of text) h = Math.imul(h ^ (ch.codePointAt(0) ?? 0), 16777619) >>> 0;
  return h;
}

type ObjectExtras = { labels?: Record<string, string>; annotations?: Record<string, string> };

/**
 * A Service as the apiserver returns it (defaults filled in: ClusterIP type, a cluster IP derived from
 * the name, one `http` TCP port 80, selector `app: <name>`; nodePorts assigned for NodePort/LoadBalancer).
 * Fields in `spec` replace the defaults.
 */
export function makeService(
  namespace: string,
  name: string,
  spec: NonNullable<Service['spec']> = {},
  extras: ObjectExtras = {},
): Service {
  const h = hash(`${namespace}/${name}`);
  const merged: NonNullable<Service['spec']> = {
    type: 'ClusterIP',
    clusterIP: `10.96.${(h >>> 8) % 255}.${(h % 250) + 2}`,
    ports: [{ name: 'http', protocol: 'TCP', port: 80, targetPort: 80 }],
    selector: { app: name },
    sessionAffinity: 'None',
    internalTrafficPolicy: 'Cluster',
    ...spec,
  };
  if (merged.type === 'ExternalName') {
    delete merged.clusterIP;
  } else {
    const ip = merged.clusterIP ?? '';
    merged.clusterIPs ??= [ip];
    merged.ipFamilies ??= ip === 'None' ? ['IPv4'] : [ip.includes(':') ? 'IPv6' : 'IPv4'];
    merged.ipFamilyPolicy ??= 'SingleStack';
  }
  if (merged.type === 'NodePort' || merged.type === 'LoadBalancer') {
    merged.externalTrafficPolicy ??= 'Cluster';
    merged.ports = merged.ports?.map((p, i) => ({ nodePort: 30000 + ((h + i) % 2768), ...p }));
  }
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name, namespace, ...extras },
    spec: merged,
    status: { loadBalancer: {} },
  };
}

/**
 * An EndpointSlice as the EndpointSlice controller writes it. A string endpoint is a ready pod IP;
 * objects are taken as given (conditions default to ready/serving, not terminating).
 */
export function makeEndpointSlice(
  namespace: string,
  name: string,
  serviceName: string,
  endpoints: (string | EndpointSliceEndpoint)[] = [],
  ports: EndpointSlicePort[] = [{ name: 'http', protocol: 'TCP', port: 80 }],
  extras: ObjectExtras = {},
): EndpointSlice {
  const list = endpoints.map((e) => (typeof e === 'string' ? { addresses: [e] } : e));
  const first = list[0]?.addresses?.[0] ?? '';
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: {
      name,
      namespace,
      ...extras,
      labels: {
        'endpointslice.kubernetes.io/managed-by': 'endpointslice-controller.k8s.io',
        'kubernetes.io/service-name': serviceName,
        ...extras.labels,
      },
    },
    addressType: first.includes(':') ? 'IPv6' : 'IPv4',
    endpoints: list.map((e) => ({
      ...e,
      conditions: { ready: true, serving: true, terminating: false, ...e.conditions },
    })),
    ports,
  };
}

type NodeObject = Node & {
  spec: { podCIDR: string; podCIDRs: string[] };
  status: { conditions: { type: string; status: string; reason: string; message: string }[] };
};

/** A Ready Node with the well-known labels (hostname, os, arch) plus `labels`. */
export function makeNode(name: string, labels: Record<string, string> = {}): NodeObject {
  const h = hash(name);
  const podCIDR = `10.244.${h % 250}.0/24`;
  return {
    apiVersion: 'v1',
    kind: 'Node',
    metadata: {
      name,
      labels: {
        'kubernetes.io/arch': 'amd64',
        'kubernetes.io/hostname': name,
        'kubernetes.io/os': 'linux',
        ...labels,
      },
    },
    spec: { podCIDR, podCIDRs: [podCIDR] },
    status: {
      addresses: [
        { type: 'InternalIP', address: `192.168.${(h >>> 8) % 250}.${(h % 250) + 2}` },
        { type: 'Hostname', address: name },
      ],
      conditions: [
        { type: 'Ready', status: 'True', reason: 'KubeletReady', message: 'kubelet is posting ready status' },
      ],
    },
  };
}
