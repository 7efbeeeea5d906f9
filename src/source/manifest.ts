// The embedded default source: Service and EndpointSlice objects from a YAML or JSON file (several
// documents, or a `kind: List`), exactly as the API has them. The file is validated as a whole; a broken
// file is reported once, with its location, and the last good state keeps serving. Changes (also
// editors that replace the file) are applied within a second.
import { createHash } from 'node:crypto';
import { type FSWatcher, watch as fsWatch, unwatchFile, watchFile } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { basename, dirname, resolve } from 'node:path';
import { LineCounter, parseAllDocuments } from 'yaml';
import { ProxyError } from '../errors.ts';
import type { Logger } from '../log.ts';
import type { ProxyHandlers } from './handlers.ts';
import type { EndpointSlice, Node, Service } from './objects.ts';
import { LABEL_HEADLESS, LABEL_SERVICE_PROXY_NAME } from './objects.ts';
import { validateEndpointSlice, validateNode, validateService } from './validate.ts';

type Kind = 'Service' | 'EndpointSlice' | 'Node';
type Entry = { kind: Kind; key: string; object: Service | EndpointSlice | Node; json: string };

/** The objects of one good manifest, keyed `kind/namespace/name`. */
export type ManifestObjects = Map<string, Entry>;

export type ManifestOptions = {
  /** Wait this long after the last change event before reloading. */
  debounceMs?: number;
  /** Stat-poll interval, a fallback for file systems where fs.watch misses changes. */
  pollMs?: number;
  /** This node's name: a Node object with this name feeds onNodeUpdate. */
  nodeName?: string;
};

/**
 * Parses and validates manifest text. Returns the objects, or throws KUP_ERR_MANIFEST_INVALID with one
 * message listing every problem with its line and column.
 */
export function parseManifest(text: string, file = 'manifest'): ManifestObjects {
  const lineCounter = new LineCounter();
  const docs = parseAllDocuments(text, { lineCounter, uniqueKeys: true, prettyErrors: false });
  const problems: string[] = [];
  const where = (offset: number | undefined) => {
    if (offset === undefined) return file;
    const { line, col } = lineCounter.linePos(offset);
    return `${file}:${line}:${col}`;
  };
  const objects: ManifestObjects = new Map();
  if (!Array.isArray(docs)) return objects;
  for (const doc of docs) {
    for (const err of doc.errors) problems.push(`${where(err.pos[0])}: ${err.message.split('\n')[0]}`);
    if (doc.errors.length > 0) continue;
    const value: unknown = doc.toJS({ maxAliasCount: 100 });
    if (value === null || value === undefined) continue;
    const nodeAt = (path: (string | number)[]) => {
      const node = doc.getIn(path, true) as { range?: [number, number, number] } | undefined;
      if (node?.range) return node.range[0];
      // Fall back to the closest parent that exists.
      for (let n = path.length - 1; n >= 0; n--) {
        const parent = doc.getIn(path.slice(0, n), true) as { range?: [number, number, number] } | undefined;
        if (parent?.range) return parent.range[0];
      }
      return doc.contents?.range?.[0];
    };
    const items: { obj: unknown; path: (string | number)[] }[] = [];
    if (isRecord(value) && value.kind === 'List' && Array.isArray(value.items)) {
      for (const [i, obj] of value.items.entries()) items.push({ obj, path: ['items', i] });
    } else if (
      isRecord(value) &&
      typeof value.kind === 'string' &&
      value.kind.endsWith('List') &&
      Array.isArray(value.items)
    ) {
      // ServiceList, EndpointSliceList (kubectl get -o yaml): items often lack their own kind.
      const itemKind = value.kind.slice(0, -'List'.length);
      for (const [i, obj] of value.items.entries()) {
        items.push({
          obj: isRecord(obj) && obj.kind === undefined ? { ...obj, kind: itemKind } : obj,
          path: ['items', i],
        });
      }
    } else {
      items.push({ obj: value, path: [] });
    }
    for (const { obj, path } of items) {
      const entry = toEntry(obj, (p, message) =>
        problems.push(`${where(nodeAt([...path, ...p]))}: ${message}`),
      );
      if (entry === undefined) continue;
      if (objects.has(entry.key)) {
        problems.push(
          `${where(nodeAt(path))}: duplicate ${entry.kind} ${entry.key.slice(entry.kind.length + 1)}`,
        );
        continue;
      }
      objects.set(entry.key, entry);
    }
  }
  if (problems.length > 0) {
    throw new ProxyError('KUP_ERR_MANIFEST_INVALID', `invalid manifest: ${problems.join('; ')}`);
  }
  return objects;
}

function toEntry(
  obj: unknown,
  report: (path: (string | number)[], message: string) => void,
): Entry | undefined {
  if (!isRecord(obj)) {
    report([], 'expected an object (a Service or an EndpointSlice)');
    return undefined;
  }
  const kind = obj.kind;
  if (kind !== 'Service' && kind !== 'EndpointSlice' && kind !== 'Node') {
    report(['kind'], `unknown kind ${JSON.stringify(kind)} (expected Service, EndpointSlice or Node)`);
    return undefined;
  }
  // Namespaced objects default to the default namespace, as kubectl apply would.
  const meta = isRecord(obj.metadata) ? obj.metadata : undefined;
  const object =
    kind !== 'Node' && meta !== undefined && meta.namespace === undefined
      ? { ...obj, metadata: { ...meta, namespace: 'default' } }
      : obj;
  const problems =
    kind === 'Service'
      ? validateService(object)
      : kind === 'EndpointSlice'
        ? validateEndpointSlice(object)
        : validateNode(object);
  let bad = false;
  for (const p of problems) {
    if (p.severity !== 'error') continue;
    bad = true;
    report(p.path, p.message);
  }
  if (bad) return undefined;
  const m = (object as Service).metadata ?? {};
  const key = `${kind}/${m.namespace ?? ''}/${m.name ?? ''}`;
  return { kind, key, object: object as Service, json: JSON.stringify(object) };
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** kube-proxy's informers skip these (label selector); so do we, so both sources agree. */
function selected(entry: Entry): boolean {
  if (entry.kind === 'Node') return true;
  const labels = (entry.object as Service).metadata?.labels ?? {};
  return !(LABEL_HEADLESS in labels) && !(LABEL_SERVICE_PROXY_NAME in labels);
}

export class ManifestSource {
  readonly path: string;
  readonly #handlers: ProxyHandlers;
  readonly #log: Logger;
  readonly #debounceMs: number;
  readonly #pollMs: number;
  readonly #nodeName: string | undefined;
  #current: ManifestObjects = new Map();
  #hash = '';
  #watcher: FSWatcher | undefined;
  #timer: NodeJS.Timeout | undefined;
  #loading: Promise<void> = Promise.resolve();
  #again = false;
  #stopped = false;
  /** Number of successful loads that changed something, and of rejected ones (tests, metrics). */
  loads = 0;
  failures = 0;
  lastError: ProxyError | undefined;

  constructor(path: string, handlers: ProxyHandlers, log: Logger, options: ManifestOptions = {}) {
    this.path = resolve(path);
    this.#handlers = handlers;
    this.#log = log;
    this.#debounceMs = options.debounceMs ?? 100;
    this.#pollMs = options.pollMs ?? 500;
    this.#nodeName = options.nodeName;
  }

  /**
   * Loads the file (throws if it is missing or invalid: at start there is no good state to keep),
   * reports the synced events, then watches for changes.
   */
  async start(): Promise<void> {
    const text = await this.#read();
    const objects = parseManifest(text, this.path);
    this.#apply(objects);
    this.#hash = hash(text);
    this.#handlers.onServicesSynced();
    this.#handlers.onEndpointSlicesSynced();
    this.#watch();
  }

  async #read(): Promise<string> {
    try {
      return await readFile(this.path, 'utf8');
    } catch (err) {
      throw new ProxyError(
        'KUP_ERR_MANIFEST_READ',
        `cannot read manifest ${this.path}: ${(err as Error).message}`,
        { cause: err },
      );
    }
  }

  #watch(): void {
    const name = basename(this.path);
    // Watch the directory, not the file: editors often write a new file and rename it over the old one.
    try {
      this.#watcher = fsWatch(dirname(this.path), { persistent: false }, (_event, file) => {
        if (file === null || file.toString() === name) this.#schedule();
      });
      this.#watcher.on('error', (err) => this.#log.warn({ err }, 'Manifest watch failed, polling only'));
    } catch (err) {
      this.#log.warn({ err }, 'Manifest watch failed, polling only');
    }
    watchFile(this.path, { interval: this.#pollMs, persistent: false }, () => this.#schedule());
  }

  #schedule(): void {
    if (this.#stopped) return;
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      this.reload();
    }, this.#debounceMs);
    this.#timer.unref();
  }

  /** Re-reads the file now. Resolves when applied or rejected; never throws. */
  reload(): Promise<void> {
    this.#again = true;
    this.#loading = this.#loading.then(async () => {
      while (this.#again && !this.#stopped) {
        this.#again = false;
        await this.#reloadOnce();
      }
    });
    return this.#loading;
  }

  async #reloadOnce(): Promise<void> {
    let text: string;
    try {
      text = await this.#read();
    } catch (err) {
      this.#reject(err as ProxyError);
      return;
    }
    const h = hash(text);
    if (h === this.#hash) return;
    try {
      // A writer that truncates first (`cmd > file`, editors saving in place) shows an empty file for a
      // moment; applying it would delete every service. To mean "no objects": `{kind: List, items: []}`.
      if (text.trim() === '')
        throw new ProxyError(
          'KUP_ERR_MANIFEST_INVALID',
          'invalid manifest: the file is empty (being written?)',
        );
      const objects = parseManifest(text, this.path);
      this.#hash = h;
      this.#apply(objects);
      this.lastError = undefined;
      this.loads++;
      this.#log.info({ file: this.path, objects: objects.size }, 'Manifest reloaded');
    } catch (err) {
      this.#hash = h;
      this.#reject(err as ProxyError);
    }
  }

  #reject(err: ProxyError): void {
    this.failures++;
    this.lastError = err;
    this.#log.error(
      { file: this.path, err: { code: err.code, message: err.message } },
      'Manifest rejected, keeping the last good state',
    );
  }

  /** Turns the difference between the current objects and `next` into handler events. */
  #apply(next: ManifestObjects): void {
    const prev = this.#current;
    const isSelected = (e: Entry | undefined) => (e !== undefined && selected(e) ? e : undefined);
    for (const [key, before] of prev) {
      const b = isSelected(before);
      const a = isSelected(next.get(key));
      if (b !== undefined && a === undefined) this.#emit('delete', b);
    }
    for (const [key, after] of next) {
      const a = isSelected(after);
      if (a === undefined) continue;
      const b = isSelected(prev.get(key));
      if (b === undefined) this.#emit('add', a);
      else if (b.json !== a.json) this.#emit('update', a, b);
    }
    this.#current = next;
  }

  #emit(op: 'add' | 'update' | 'delete', entry: Entry, old?: Entry): void {
    const h = this.#handlers;
    switch (entry.kind) {
      case 'Service': {
        const svc = entry.object as Service;
        if (op === 'add') h.onServiceAdd(svc);
        else if (op === 'update') h.onServiceUpdate(old!.object as Service, svc);
        else h.onServiceDelete(svc);
        break;
      }
      case 'EndpointSlice': {
        const slice = entry.object as EndpointSlice;
        if (op === 'add') h.onEndpointSliceAdd(slice);
        else if (op === 'update') h.onEndpointSliceUpdate(old!.object as EndpointSlice, slice);
        else h.onEndpointSliceDelete(slice);
        break;
      }
      case 'Node': {
        const node = entry.object as Node;
        if (this.#nodeName !== undefined && node.metadata?.name !== this.#nodeName) break;
        if (op === 'delete') h.onNodeDelete(node);
        else h.onNodeUpdate(node);
        break;
      }
    }
  }

  /** The objects of the last good load. */
  get objects(): ManifestObjects {
    return this.#current;
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#watcher?.close();
    unwatchFile(this.path);
    await this.#loading;
  }
}

function hash(text: string): string {
  return createHash('sha1').update(text).digest('hex');
}
