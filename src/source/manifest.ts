// The embedded default source: Service and EndpointSlice objects from a YAML or JSON file (several
// documents, or a `kind: List`), exactly as the API has them. The file is validated as a whole; a broken
// file is reported once, with its location, and the last good state keeps serving. Changes (also
// editors that replace the file) are applied within a second. A huge file is parsed, validated and
// applied in slices of a few milliseconds (documents, items), so the data path keeps its event loop.
import { createHash } from 'node:crypto';
import { type FSWatcher, watch as fsWatch, unwatchFile, watchFile } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { basename, dirname, resolve } from 'node:path';
import { load as loadYaml } from 'js-yaml';
import { Composer, type Document, LineCounter, Parser } from 'yaml';
import { ProxyError } from '../lib/errors.ts';
import type { Logger } from '../lib/log.ts';
import { SLICE_MS, Yielder } from '../lib/yielder.ts';
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

/** How long manifest work may hold the event loop before it lets others run. */
export const MANIFEST_SLICE_MS = SLICE_MS;

/**
 * Parses and validates manifest text. Returns the objects, or throws KUP_ERR_MANIFEST_INVALID with one
 * message listing every problem with its line and column. Synchronous: see parseManifestAsync for big files.
 */
export function parseManifest(text: string, file = 'manifest'): ManifestObjects {
  const lineCounter = new LineCounter();
  const collector = new Collector(file, lineCounter);
  for (const doc of documents(text, lineCounter)) {
    for (const item of collector.items(doc)) collector.add(item);
  }
  return collector.result();
}

/**
 * parseManifest without holding the event loop for more than about `sliceMs` at a time: the work is
 * done a document (and a List item) at a time. A JSON file is read with JSON.parse (some 100 times
 * faster than the YAML parser: 20,000 objects in ~30 ms, where YAML takes seconds); only when it has a
 * problem is it parsed again as YAML, for the locations (and JSON's duplicate keys keep the last value).
 * YAML's unit of work is a document: a single huge `kind: List` document in YAML form is still parsed in
 * one go (use JSON, or one document per object, for those).
 */
export async function parseManifestAsync(
  text: string,
  file = 'manifest',
  sliceMs = MANIFEST_SLICE_MS,
  cache?: DocumentCache,
): Promise<ManifestObjects> {
  const yielder = new Yielder(sliceMs);
  const fast = /^\s*[[{]/.test(text) ? undefined : await fastYaml(text, cache ?? new Map(), yielder);
  if (fast !== undefined) return fast;
  const json = /^\s*[[{]/.test(text) ? tryJSON(text) : undefined;
  if (json !== undefined) {
    const collector = new Collector(file, undefined);
    for (const item of collector.itemsOf(json.value, () => undefined)) {
      collector.add(item);
      if (yielder.due) await yielder.turn();
    }
    if (collector.problems.length === 0) return collector.result();
  }
  const lineCounter = new LineCounter();
  const collector = new Collector(file, lineCounter);
  for (const doc of documents(text, lineCounter)) {
    for (const item of collector.items(doc)) {
      collector.add(item);
      if (yielder.due) await yielder.turn();
    }
    if (yielder.due) await yielder.turn();
  }
  return collector.result();
}

/** The validated entries of each YAML document text seen in the last good load (reloads reuse them). */
export type DocumentCache = Map<string, Entry[]>;

// A line that starts or ends a document. YAML forbids such a line inside a document (even in a block
// scalar), so splitting the text on them gives the same documents as the parser.
const DOCUMENT_MARKER = /^(?:---|\.\.\.)(?:[ \t][^\n]*)?$/m;

/**
 * The fast path for YAML: js-yaml (5-10 times faster than the `yaml` parser) on one document at a time,
 * each document's entries cached by its text, so a reload of a 20,000-object file with one change parses
 * one document. Undefined when anything is off (a syntax error, a problem, a duplicate, a directive): the
 * caller then takes the `yaml` path, which reports every problem with its line and column.
 */
async function fastYaml(
  text: string,
  cache: DocumentCache,
  yielder: Yielder,
): Promise<ManifestObjects | undefined> {
  if (/^%/m.test(text)) return undefined;
  const objects: ManifestObjects = new Map();
  const seen: DocumentCache = new Map();
  for (const part of text.split(DOCUMENT_MARKER)) {
    let entries = cache.get(part) ?? seen.get(part);
    if (entries === undefined) {
      let value: unknown;
      try {
        value = loadYaml(part);
      } catch {
        return undefined;
      }
      const collector = new Collector('', undefined);
      for (const item of collector.itemsOf(value, () => undefined)) collector.add(item);
      if (collector.problems.length > 0) return undefined;
      entries = [...collector.objects.values()];
    }
    seen.set(part, entries);
    for (const entry of entries) {
      if (objects.has(entry.key)) return undefined;
      objects.set(entry.key, entry);
    }
    if (yielder.due) await yielder.turn();
  }
  cache.clear();
  for (const [part, entries] of seen) cache.set(part, entries);
  return objects;
}

function tryJSON(text: string): { value: unknown } | undefined {
  try {
    return { value: JSON.parse(text) };
  } catch {
    return undefined; // the YAML parser says where
  }
}

/** The documents of a YAML stream, composed one at a time (parseAllDocuments, lazily). */
function* documents(text: string, lineCounter: LineCounter): Generator<Document.Parsed> {
  const parser = new Parser(lineCounter.addNewLine);
  const composer = new Composer({ uniqueKeys: true, prettyErrors: false });
  yield* composer.compose(parser.parse(text));
}

/** Where a path of a document starts (an offset in the text), if known. */
type Locate = (path: (string | number)[]) => number | undefined;
type Item = { obj: unknown; path: (string | number)[]; locate: Locate };

/** Collects the objects of a manifest and every problem, with its location when there is a YAML tree. */
class Collector {
  readonly file: string;
  readonly lineCounter: LineCounter | undefined;
  readonly problems: string[] = [];
  readonly objects: ManifestObjects = new Map();

  constructor(file: string, lineCounter: LineCounter | undefined) {
    this.file = file;
    this.lineCounter = lineCounter;
  }

  where(offset: number | undefined): string {
    if (offset === undefined || this.lineCounter === undefined) return this.file;
    const { line, col } = this.lineCounter.linePos(offset);
    return `${this.file}:${line}:${col}`;
  }

  /** The objects of one YAML document (none when it has syntax errors: those are recorded). */
  items(doc: Document.Parsed): Item[] {
    for (const err of doc.errors)
      this.problems.push(`${this.where(err.pos[0])}: ${err.message.split('\n')[0]}`);
    if (doc.errors.length > 0) return [];
    const locate: Locate = (path) => {
      const node = doc.getIn(path, true) as { range?: [number, number, number] } | undefined;
      if (node?.range) return node.range[0];
      // Fall back to the closest parent that exists.
      for (let n = path.length - 1; n >= 0; n--) {
        const parent = doc.getIn(path.slice(0, n), true) as { range?: [number, number, number] } | undefined;
        if (parent?.range) return parent.range[0];
      }
      return doc.contents?.range?.[0];
    };
    return this.itemsOf(doc.toJS({ maxAliasCount: 100 }), locate);
  }

  /** The objects of one document's value: an object, a List, or a typed list (`ServiceList`). */
  itemsOf(value: unknown, locate: Locate): Item[] {
    if (value === null || value === undefined) return [];
    const items: Item[] = [];
    if (isRecord(value) && value.kind === 'List' && Array.isArray(value.items)) {
      for (const [i, obj] of value.items.entries()) items.push({ obj, path: ['items', i], locate });
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
          locate,
        });
      }
    } else {
      items.push({ obj: value, path: [], locate });
    }
    return items;
  }

  add({ obj, path, locate }: Item): void {
    const entry = toEntry(obj, (p, message) =>
      this.problems.push(`${this.where(locate([...path, ...p]))}: ${message}`),
    );
    if (entry === undefined) return;
    if (this.objects.has(entry.key)) {
      this.problems.push(
        `${this.where(locate(path))}: duplicate ${entry.kind} ${entry.key.slice(entry.kind.length + 1)}`,
      );
      return;
    }
    this.objects.set(entry.key, entry);
  }

  result(): ManifestObjects {
    if (this.problems.length > 0) {
      throw new ProxyError('KUP_ERR_MANIFEST_INVALID', `invalid manifest: ${this.problems.join('; ')}`);
    }
    return this.objects;
  }
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
  readonly #documents: DocumentCache = new Map();
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
    const objects = await parseManifestAsync(text, this.path, MANIFEST_SLICE_MS, this.#documents);
    await this.#apply(objects);
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
      const objects = await parseManifestAsync(text, this.path, MANIFEST_SLICE_MS, this.#documents);
      this.#hash = h;
      await this.#apply(objects);
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

  /**
   * Turns the difference between the current objects and `next` into handler events, a slice at a time.
   * A sync may run between slices, so the order keeps every intermediate state servable: slices before
   * the Services that use them (a new Service comes with its endpoints), Services deleted before their
   * slices (no Service is left without endpoints on the way out).
   */
  async #apply(next: ManifestObjects): Promise<void> {
    const prev = this.#current;
    this.#current = next;
    const isSelected = (e: Entry | undefined) => (e !== undefined && selected(e) ? e : undefined);
    const yielder = new Yielder(MANIFEST_SLICE_MS);
    const upserts = (kinds: readonly Kind[]) =>
      [...next].filter(([, e]) => kinds.includes(e.kind) && isSelected(e) !== undefined);
    const deletes = (kinds: readonly Kind[]) =>
      [...prev].filter(([k, e]) => kinds.includes(e.kind) && isSelected(e) && !isSelected(next.get(k)));
    for (const [key, after] of [...upserts(['EndpointSlice', 'Node']), ...upserts(['Service'])]) {
      const before = isSelected(prev.get(key));
      if (before === undefined) this.#emit('add', after);
      else if (before.json !== after.json) this.#emit('update', after, before);
      else continue;
      if (yielder.due) await yielder.turn();
    }
    for (const [, before] of [...deletes(['Service']), ...deletes(['EndpointSlice', 'Node'])]) {
      this.#emit('delete', before);
      if (yielder.due) await yielder.turn();
    }
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
