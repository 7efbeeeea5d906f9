// Manifest text → the objects it holds: a YAML or JSON file of Service, EndpointSlice and Node objects
// (several documents, a `kind: List`, or a typed list such as `ServiceList`), exactly as the API has them.
// Every object is validated here, once; any problem rejects the whole text with a file:line:col for each
// problem. Pure: no fs, no clock (big texts are read by a generator that its driver pauses; see
// parseManifestAsync).
//
// The text is a user's, so nothing here trusts its shape. YAML goes through lib/safe-yaml.ts (nesting,
// alias count and alias expansion bounded, the expansion by one budget for the whole load: a 700-byte
// alias bomb, or 2,000 small ones, is an error at its line, not a frozen process). Big texts are cut before they are parsed, in the bytes (manifest-split.ts, lib/json-outline.ts):
// a document, a List item or a JSON item at a time, so no single step holds the event loop for long
// (JSON.parse of a 50 MB List took ~0.5 s in one piece; js-yaml on a 70 MB `kind: List` document ~6 s).
import { createHash } from 'node:crypto';
import { Composer, type Document, LineCounter, Parser } from 'yaml';
import { ProxyError } from '../lib/errors.ts';
import { type Member, outlineJson, type Span } from '../lib/json-outline.ts';
import { type AliasBudget, aliasBudgetFor, readYaml, YAML_LIMITS, type YamlPath } from '../lib/safe-yaml.ts';
import { BytePositions, linePosition, positionWithin } from '../lib/text-position.ts';
import { SLICE_MS, Yielder } from '../lib/yielder.ts';
import { type Checked, type KubeObject, validate } from './intake.ts';
import { listItems, yamlDocuments } from './manifest-split.ts';

/** One object of a manifest, validated (its problems are warnings only), and its JSON text for diffs. */
export type Entry = Checked & { readonly key: string; readonly json: string };

/** The objects of one good manifest, keyed `kind/namespace/name`. */
export type ManifestObjects = Map<string, Entry>;

/** How long manifest work may hold the event loop before it lets others run. */
export const MANIFEST_SLICE_MS = SLICE_MS;

/** Problems spelled out in one error; the rest are counted (a garbage file has thousands). */
const MAX_PROBLEMS = 20;

// A YAML document at least this big is cut into its List items when it has that shape.
const LIST_SPLIT_BYTES = 64 * 1024;

/** An entry with where it came from in its part of the text: a document of it, and the path there. */
type Placed = { readonly entry: Entry; readonly document: number; readonly path: YamlPath };

/**
 * The validated entries of each part (a YAML document, an item of a big YAML List or of a JSON List) read
 * in the last good load, keyed by a digest of its text: a reload of a 20,000-object file with one change
 * parses one part.
 */
export type DocumentCache = Map<string, readonly Placed[]>;

/**
 * Parses and validates manifest text without holding the event loop for more than about `sliceMs` at a
 * time. Returns the objects, or throws KUP_ERR_MANIFEST_INVALID with one message listing the problems,
 * each with its file:line:col. `cache` carries the parsed parts from one good load to the next; `signal`
 * abandons the work between two slices (with its reason).
 */
export async function parseManifestAsync(
  text: string | Buffer,
  file = 'manifest',
  sliceMs = MANIFEST_SLICE_MS,
  cache: DocumentCache = new Map(),
  signal?: AbortSignal,
): Promise<ManifestObjects> {
  const yielder = new Yielder(sliceMs);
  const steps = parseSteps(typeof text === 'string' ? Buffer.from(text) : text, file, cache);
  for (let step = steps.next(); ; step = steps.next()) {
    if (step.done) return step.value;
    if (yielder.due) {
      await yielder.turn();
      signal?.throwIfAborted();
    }
  }
}

/** parseManifestAsync's work: yields whenever its driver may give the event loop a turn. */
function* parseSteps(buf: Buffer, file: string, cache: DocumentCache): Generator<void, ManifestObjects> {
  const load = new Load(buf, new Report(file, buf), cache);
  // A big text that starts like JSON but is not may be flow-style YAML: read as YAML, as a small one is.
  if (!isJson(buf) || !(yield* readJson(load))) yield* readYamlStream(load);
  return yield* load.finish();
}

// Up to this size a text that looks like JSON but is not is read as YAML (flow style, `{kind: Service}`),
// whose parser also says where a broken JSON text breaks. JSON.parse of 1 MiB takes ~10 ms.
const JSON_CHECK_BYTES = 1024 * 1024;

/** True for a text to read as JSON: it starts with `{` or `[`, and a small one parses as JSON. */
function isJson(buf: Buffer): boolean {
  let looks = false;
  for (const c of buf) {
    looks = c === 0x7b || c === 0x5b; // { [
    if (c !== 0x20 && c !== 0x0a && c !== 0x0d && c !== 0x09) break;
  }
  if (!looks || buf.length > JSON_CHECK_BYTES) return looks;
  try {
    JSON.parse(buf.toString('utf8'));
    return true;
  } catch {
    return false;
  }
}

/** The problems of one parse, each with its file:line:col. */
class Report {
  readonly #file: string;
  readonly #positions: BytePositions;
  readonly #problems: string[] = [];
  #more = 0;

  constructor(file: string, buf: Buffer) {
    this.#file = file;
    this.#positions = new BytePositions(buf);
  }

  get ok(): boolean {
    return this.#problems.length === 0;
  }

  /** True once further problems are only counted: nothing need be done to locate them. */
  get full(): boolean {
    return this.#problems.length >= MAX_PROBLEMS;
  }

  /**
   * A problem at character `offset` of `piece`, a part of the file that starts at byte `base`. A function
   * for `offset` is called only when the problem is spelled out (finding a path's offset walks the part).
   */
  add(base: number, piece: string, offset: number | (() => number), message: string): void {
    if (this.full) {
      this.#more++;
      return;
    }
    const at = typeof offset === 'number' ? offset : offset();
    const { line, col } = positionWithin(this.#positions.at(base), piece, at);
    this.#problems.push(`${this.#file}:${line}:${col}: ${message}`);
  }

  /** Throws KUP_ERR_MANIFEST_INVALID with the problems, if there are any. */
  check(): void {
    if (this.ok) return;
    const more = this.#more > 0 ? `; and ${this.#more} more problems` : '';
    throw new ProxyError('KUP_ERR_MANIFEST_INVALID', `invalid manifest: ${this.#problems.join('; ')}${more}`);
  }
}

/** A problem found in a part before it is known whether the part stands (see readList). */
type Deferred = [base: number, piece: string, offset: number | (() => number), message: string];

/** One parse: the text, its problems, the objects so far, and the parts it read (the next load's cache). */
class Load {
  readonly buf: Buffer;
  readonly report: Report;
  readonly objects: ManifestObjects = new Map();
  /**
   * What the aliases of every part read in this load may add when expanded (JSON.stringify of each entry
   * expands them): max(1 M, the file's length) nodes and characters in all.
   */
  readonly budget: AliasBudget;
  readonly #cache: DocumentCache;
  readonly #seen: DocumentCache = new Map();

  constructor(buf: Buffer, report: Report, cache: DocumentCache) {
    this.buf = buf;
    this.report = report;
    this.budget = aliasBudgetFor(buf.length, 'manifest');
    this.#cache = cache;
  }

  /**
   * The key of a part: how it is read (`how`: a document, or an item of a list of some kind) and a digest
   * of its bytes. A digest, not the text: a reload then decodes and keeps no string of an unchanged part
   * (with the texts as keys, a reload of a 70 MB List carried 70 MB of new strings through the garbage
   * collector's young generation: pauses of 100-160 ms).
   */
  keyOf(how: string, span: Span): string {
    return `${how}\0${createHash('sha1').update(this.buf.subarray(span.start, span.end)).digest('base64')}`;
  }

  /** The entries of a part read before (in the last good load, or earlier in this one), by its key. */
  known(key: string): readonly Placed[] | undefined {
    return this.#cache.get(key) ?? this.#seen.get(key);
  }

  /**
   * Adds the entries of the part at `span`; a second object of the same kind, namespace and name is a
   * problem, at the second one, located with `located` (the part as it was just read) or by reading the
   * part again, once. Yields after each duplicate it locates.
   */
  *add(key: string, placed: readonly Placed[], span: Span, located?: Located): Generator<void, void> {
    this.#seen.set(key, placed);
    let where = located;
    for (const { entry, document, path } of placed) {
      if (!this.objects.has(entry.key)) {
        this.objects.set(entry.key, entry);
        continue;
      }
      const message = `duplicate ${entry.kind} ${entry.key.slice(entry.kind.length + 1)}`;
      if (this.report.full) {
        this.report.add(span.start, '', 0, message);
        continue;
      }
      // The part may come from the cache, which keeps no positions: read again, once. Read again for every
      // duplicate, a 790 KB List with 3,000 held the event loop for 178 s.
      where ??= locatedOf(this.buf.toString('utf8', span.start, span.end));
      const { text, locate } = where;
      this.report.add(span.start, text, () => locate(document, path), message);
      yield;
    }
  }

  /** The objects; or KUP_ERR_MANIFEST_INVALID, and the cache left as it was. */
  *finish(): Generator<void, ManifestObjects> {
    this.report.check();
    this.#cache.clear();
    for (const [key, placed] of this.#seen) {
      this.#cache.set(key, placed);
      yield;
    }
    return this.objects;
  }
}

/** A part's places, read again (0, its start, for any path when it does not read). */
function locatedOf(text: string): Located {
  const read = readYaml(text, YAML_LIMITS);
  return { text, locate: read.error === undefined ? read.locate : () => 0 };
}

function* readYamlStream(load: Load): Generator<void, void> {
  const { buf, report } = load;
  for (const doc of yamlDocuments(buf)) {
    // Past the load's alias budget: one error says so; the rest of the text cannot make it good.
    if (load.budget.exceeded) return;
    if (doc === undefined) {
      yield;
      continue;
    }
    if (doc.end - doc.start >= LIST_SPLIT_BYTES) {
      const split = yield* listItems(buf, doc);
      if (split !== undefined && (yield* readList(load, split.head, split.items))) continue;
    }
    const key = load.keyOf('yaml', doc);
    const known = load.known(key);
    if (known !== undefined) {
      yield* load.add(key, known, doc);
      yield;
      continue;
    }
    const problems: Deferred[] = [];
    const text = buf.toString('utf8', doc.start, doc.end);
    const part = readPart(text, doc.start, problems, load.budget);
    for (const p of problems) report.add(...p);
    if (part === undefined || problems.length > 0) continue;
    yield;
    yield* load.add(key, part.placed, doc, { text, locate: part.locate });
    yield;
  }
}

/** A part's text and where each path of it is: a document (by its index) and a path in it. */
type Located = { readonly text: string; readonly locate: (document: number, path: YamlPath) => number };

/**
 * The entries of one YAML part (every object of every document in it) and their places, with its problems
 * in `problems`; undefined when it does not parse (a syntax error or a limit, in `problems` too).
 */
function readPart(
  text: string,
  base: number,
  problems: Deferred[],
  budget: AliasBudget,
): { placed: Placed[]; locate: Located['locate'] } | undefined {
  const read = readYaml(text, YAML_LIMITS, budget);
  if (read.error !== undefined) {
    problems.push([base, text, read.error.offset, read.error.message]);
    return undefined;
  }
  const placed: Placed[] = [];
  for (const [document, value] of read.documents.entries()) {
    for (const { obj, path } of itemsOf(value)) {
      const entry = toEntry(obj, (p, message) =>
        problems.push([base, text, () => read.locate(document, [...path, ...p]), message]),
      );
      if (entry !== undefined) placed.push({ entry, document, path });
    }
  }
  return { placed, locate: read.locate };
}

/**
 * A big List document read an item at a time. False when the cut does not hold (the head is not a List,
 * or an item does not parse on its own: an alias to another item's anchor, or text the cut misread);
 * nothing is reported or added then, and the caller reads the document whole.
 */
function* readList(load: Load, head: string, items: readonly Span[]): Generator<void, boolean> {
  // What the items spent goes back when the document is read whole instead.
  const remaining = load.budget.remaining;
  const fallBack = () => {
    load.budget.remaining = remaining;
    return false;
  };
  const top = readYaml(head, YAML_LIMITS, load.budget);
  const value = top.error === undefined && top.documents.length === 1 ? top.documents[0] : undefined;
  if (!isRecord(value) || typeof value.kind !== 'string' || !value.kind.endsWith('List')) return fallBack();
  const itemKind = value.kind === 'List' ? undefined : value.kind.slice(0, -'List'.length);
  const problems: Deferred[] = [];
  const parts: [key: string, span: Span, placed: readonly Placed[]][] = [];
  for (const span of items) {
    // The kind an item gets from its list is part of what the text means.
    const key = load.keyOf(`yaml-item\0${itemKind ?? ''}`, span);
    let placed = load.known(key);
    if (placed === undefined) {
      const text = load.buf.toString('utf8', span.start, span.end);
      const read = readYaml(text, YAML_LIMITS, load.budget);
      if (read.error !== undefined) {
        if (!read.error.limit) return fallBack();
        problems.push([span.start, text, read.error.offset, read.error.message]);
        if (load.budget.exceeded) break;
        continue;
      }
      const [seq] = read.documents;
      if (read.documents.length !== 1 || !Array.isArray(seq) || seq.length !== 1) return fallBack();
      const entry = toEntry(withKind(seq[0], itemKind), (p, message) =>
        problems.push([span.start, text, () => read.locate(0, [0, ...p]), message]),
      );
      if (entry === undefined) continue;
      placed = [{ entry, document: 0, path: [0] }];
    }
    parts.push([key, span, placed]);
    yield;
  }
  for (const p of problems) load.report.add(...p);
  for (const [key, span, placed] of parts) {
    yield* load.add(key, placed, span);
    yield;
  }
  return true;
}

/** An item of a typed list (`ServiceList`) without a kind of its own gets the list's. */
function withKind(obj: unknown, itemKind: string | undefined): unknown {
  return itemKind !== undefined && isRecord(obj) && obj.kind === undefined ? { ...obj, kind: itemKind } : obj;
}

/**
 * Reads a text that looks like JSON. False, with nothing reported, when its outline says it may be YAML
 * instead (flow style: `{kind: List, items: [...]}`); the caller reads it as YAML then.
 */
function* readJson(load: Load): Generator<void, boolean> {
  const { buf, report } = load;
  const outline = yield* outlineJson(buf, YAML_LIMITS.maxDepth);
  if (outline.error?.mayBeYaml) return false;
  if (outline.error !== undefined) {
    report.add(outline.error.offset, '', 0, outline.error.message);
    return true;
  }
  if (outline.root === 'other') {
    report.add(
      outline.value.start,
      '',
      0,
      'expected an object (a Service, an EndpointSlice, a Node or a List)',
    );
    return true;
  }
  // As JSON.parse: a repeated key keeps its first place and its last value.
  const members = new Map<string, Member>();
  for (const m of outline.members) members.set(m.key, m);
  const parse = (span: Span): { value: unknown } | undefined => {
    const text = buf.toString('utf8', span.start, span.end);
    try {
      return { value: JSON.parse(text) };
    } catch (err) {
      // V8 says where: `... in JSON at position 273 (line 16 column 16)`.
      const message = (err as Error).message;
      const at = /at position (\d+)/.exec(message);
      report.add(
        span.start,
        text,
        at ? Number(at[1]) : 0,
        `not valid JSON: ${message.replace(/ in JSON at.*/, '')}`,
      );
      return undefined;
    }
  };
  const kindMember = members.get('kind');
  const kind = kindMember === undefined ? undefined : parse(kindMember.value)?.value;
  const list = members.get('items')?.items;
  if (list !== undefined && typeof kind === 'string' && kind.endsWith('List')) {
    // A List: an item at a time, each item's entry kept for the next load.
    const itemKind = kind === 'List' ? undefined : kind.slice(0, -'List'.length);
    for (const span of list) {
      const key = load.keyOf(`json-item\0${itemKind ?? ''}`, span);
      let placed = load.known(key);
      if (placed === undefined) {
        const item = parse(span);
        const entry =
          item === undefined
            ? undefined
            : toEntry(withKind(item.value, itemKind), (path, message) =>
                reportInJson(buf, span, path, message, report),
              );
        placed = entry === undefined ? undefined : [{ entry, document: 0, path: [] }];
      }
      if (placed !== undefined) yield* load.add(key, placed, span);
      yield;
    }
    return true;
  }
  // One object, a member (and an element of an `items` array) at a time.
  const fields: [string, unknown][] = [];
  for (const [key, m] of members) {
    if (m.items === undefined) {
      fields.push([key, parse(m.value)?.value]);
    } else {
      const values: unknown[] = [];
      for (const span of m.items) {
        values.push(parse(span)?.value);
        yield;
      }
      fields.push([key, values]);
    }
    yield;
  }
  if (!report.ok) return true;
  const value = Object.fromEntries(fields); // own properties even for `__proto__`, as JSON.parse
  for (const { obj, path } of itemsOf(value)) {
    const entry = toEntry(obj, (p, message) => {
      const at = [...path, ...p];
      const m = members.get(String(at[0]));
      const span = m?.items !== undefined && typeof at[1] === 'number' ? m.items[at[1]] : m?.value;
      const rest = m?.items !== undefined && typeof at[1] === 'number' ? at.slice(2) : at.slice(1);
      if (span === undefined) report.add(0, '', 0, message);
      else reportInJson(buf, span, rest, message, report);
    });
    if (entry !== undefined && load.objects.has(entry.key))
      report.add(0, '', 0, `duplicate ${entry.kind} ${entry.key.slice(entry.kind.length + 1)}`);
    else if (entry !== undefined) load.objects.set(entry.key, entry);
  }
  return true;
}

/** A problem at `path` inside the JSON value at `span`: located by reading that value as YAML. */
function reportInJson(buf: Buffer, span: Span, path: YamlPath, message: string, report: Report): void {
  if (report.full) {
    report.add(span.start, '', 0, message);
    return;
  }
  const text = buf.toString('utf8', span.start, span.end);
  const read = readYaml(text, YAML_LIMITS);
  report.add(span.start, text, read.error === undefined ? read.locate(0, path) : 0, message);
}

type Item = { readonly obj: unknown; readonly path: YamlPath };

/** The objects of one document's value: an object, a List, or a typed list (`ServiceList`). */
function itemsOf(value: unknown): Item[] {
  if (value === null || value === undefined) return [];
  if (
    isRecord(value) &&
    typeof value.kind === 'string' &&
    value.kind.endsWith('List') &&
    Array.isArray(value.items)
  ) {
    // ServiceList, EndpointSliceList (kubectl get -o yaml): items often lack their own kind.
    const itemKind = value.kind === 'List' ? undefined : value.kind.slice(0, -'List'.length);
    return value.items.map((obj, i) => ({
      obj:
        itemKind !== undefined && isRecord(obj) && obj.kind === undefined ? { ...obj, kind: itemKind } : obj,
      path: ['items', i],
    }));
  }
  return [{ obj: value, path: [] }];
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

/**
 * The reference reader, for tests and benchmarks: the whole text through the `yaml` parser, which keeps
 * every position and reports every syntax error, in one synchronous piece (seconds for a big file).
 * Within the same limits as parseManifestAsync, and throws the same way.
 */
export function parseManifest(text: string, file = 'manifest'): ManifestObjects {
  const guard = readYaml(text, YAML_LIMITS);
  if (guard.error?.limit) {
    const { line, col } = linePosition(text, guard.error.offset);
    throw new ProxyError(
      'KUP_ERR_MANIFEST_INVALID',
      `invalid manifest: ${file}:${line}:${col}: ${guard.error.message}`,
    );
  }
  const lineCounter = new LineCounter();
  const where = (offset: number | undefined): string => {
    if (offset === undefined) return file;
    const { line, col } = lineCounter.linePos(offset);
    return `${file}:${line}:${col}`;
  };
  const problems: string[] = [];
  const objects: ManifestObjects = new Map();
  const composer = new Composer({ uniqueKeys: true, prettyErrors: false });
  for (const doc of composer.compose(new Parser(lineCounter.addNewLine).parse(text))) {
    for (const err of doc.errors) problems.push(`${where(err.pos[0])}: ${err.message.split('\n')[0]}`);
    if (doc.errors.length > 0) continue;
    const locate = (path: YamlPath) => rangeOf(doc, path);
    let value: unknown;
    try {
      // The guard has bounded the aliases, unless js-yaml could not read the text: then `yaml`'s own bound.
      value = doc.toJS({ maxAliasCount: guard.error === undefined ? -1 : 100 });
    } catch (err) {
      problems.push(`${where(doc.contents?.range?.[0])}: ${(err as Error).message}`);
      continue;
    }
    for (const { obj, path } of itemsOf(value)) {
      const entry = toEntry(obj, (p, message) =>
        problems.push(`${where(locate([...path, ...p]))}: ${message}`),
      );
      if (entry === undefined) continue;
      if (objects.has(entry.key))
        problems.push(
          `${where(locate(path))}: duplicate ${entry.kind} ${entry.key.slice(entry.kind.length + 1)}`,
        );
      else objects.set(entry.key, entry);
    }
  }
  if (problems.length > 0)
    throw new ProxyError('KUP_ERR_MANIFEST_INVALID', `invalid manifest: ${problems.join('; ')}`);
  return objects;
}

/** Where a path of a document starts (an offset in the text), or of its closest parent. */
function rangeOf(doc: Document.Parsed, path: YamlPath): number | undefined {
  for (let n = path.length; n >= 0; n--) {
    const node = doc.getIn(path.slice(0, n), true) as { range?: [number, number, number] } | undefined;
    if (node?.range) return node.range[0];
  }
  return doc.contents?.range?.[0];
}
