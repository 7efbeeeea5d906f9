// Manifest text → the objects it holds: a YAML or JSON file of Service, EndpointSlice and Node objects
// (several documents, a `kind: List`, or a typed list such as `ServiceList`), exactly as the API has them.
// Every object is validated here, once; the first problem found anywhere rejects the whole text with a
// file:line:col for each problem. Pure: no fs, no clock (big texts yield through a Yielder).
//
// Two YAML libraries, measured (bench/manifest-yaml.bench.ts, 10,000 Services + 10,000 slices, 5.9 MiB):
// js-yaml reads the values in ~0.3 s, `yaml` composes the documents with positions in ~2.5 s. js-yaml
// is the fast path; `yaml` runs only for a text with a problem, to say where (js-yaml keeps no positions).
import { load as loadYaml } from 'js-yaml';
import { Composer, type Document, LineCounter, Parser } from 'yaml';
import { ProxyError } from '../lib/errors.ts';
import { SLICE_MS, Yielder } from '../lib/yielder.ts';
import { type Checked, type KubeObject, validate } from './intake.ts';

/** One object of a manifest, validated (its problems are warnings only), and its JSON text for diffs. */
export type Entry = Checked & { readonly key: string; readonly json: string };

/** The objects of one good manifest, keyed `kind/namespace/name`. */
export type ManifestObjects = Map<string, Entry>;

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
  const problems = validate(kind, object);
  let bad = false;
  for (const p of problems) {
    if (p.severity !== 'error') continue;
    bad = true;
    report(p.path, p.message);
  }
  if (bad) return undefined;
  const m = (object as KubeObject).metadata ?? {};
  const key = `${kind}/${m.namespace ?? ''}/${m.name ?? ''}`;
  return { kind, key, object: object as KubeObject, problems, json: JSON.stringify(object) };
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}
