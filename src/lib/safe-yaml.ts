// Every YAML text a user hands us (the manifest, the --config file) is read here: js-yaml's event parser
// with a nesting limit, then one pass over the events that counts the aliases of the text and what they
// add when expanded (within the text, and within a budget its caller may share between texts: a manifest
// read in parts), and refuses a recursive alias, before any value is built. js-yaml keeps an alias
// as a shared reference, so a 700-byte "billion laughs" text (9 levels of 9 aliases: 387 million nodes)
// builds in microseconds and explodes later, in JSON.stringify or any walk. Pure: no I/O.
import {
  constructFromEvents,
  EVENT_ALIAS,
  EVENT_DOCUMENT,
  EVENT_MAPPING,
  EVENT_POP,
  EVENT_SCALAR,
  EVENT_SEQUENCE,
  type Event,
  getScalarValue,
  parseEvents,
  YAMLException,
} from 'js-yaml';

export type YamlLimits = {
  /** The deepest nesting of collections (js-yaml's own default). */
  readonly maxDepth: number;
  /** Aliases in one text; a text longer than 16 times this may hold one per 16 characters. */
  readonly maxAliases: number;
  /**
   * What the aliases of one text (all its documents) may add when expanded, counted as nodes plus the
   * characters of their scalars; a text longer than this may grow by its own length.
   */
  readonly maxAliasExpansion: number;
};

export const YAML_LIMITS: YamlLimits = { maxDepth: 100, maxAliases: 10_000, maxAliasExpansion: 1_000_000 };

/**
 * What the aliases of several texts may add in all when expanded (nodes plus characters), spent by each
 * readYaml it is passed to: the parts of one manifest share one, so 2,000 small bombs each under the
 * per-text limit do not add up to 2,000 times it. Mutable: `remaining` goes down.
 */
export class AliasBudget {
  readonly total: number;
  remaining: number;
  /** True once a text went past what remained (the texts after it need not be read). */
  exceeded = false;
  /** What the budget is for, in messages: "aliases expand the <scope> by more than ...". */
  readonly scope: string;

  constructor(total: number, scope: string) {
    this.total = total;
    this.remaining = total;
    this.scope = scope;
  }
}

/** The budget of a whole text of `length` characters: max(limits.maxAliasExpansion, length). */
export function aliasBudgetFor(length: number, scope: string, limits: YamlLimits = YAML_LIMITS): AliasBudget {
  return new AliasBudget(Math.max(limits.maxAliasExpansion, length), scope);
}

/** What is wrong and where: a character offset in the text. `limit` is true for a limit, false for syntax. */
export type YamlProblem = { readonly offset: number; readonly message: string; readonly limit: boolean };

/** A path to a node of a document: mapping keys and sequence indexes. */
export type YamlPath = readonly (string | number)[];

export type YamlRead =
  | {
      readonly documents: unknown[];
      /** The character offset of the node at `path` in document `document` (or of its closest parent). */
      readonly locate: (document: number, path: YamlPath) => number;
      readonly error?: undefined;
    }
  | { readonly error: YamlProblem };

/**
 * Reads every document of a YAML text within `limits`, and within `shared` when given (what its aliases
 * add is taken from it when the text reads). Never throws: a syntax error (the first one, as js-yaml
 * reports it) or a limit is returned with its offset.
 */
export function readYaml(text: string, limits: YamlLimits = YAML_LIMITS, shared?: AliasBudget): YamlRead {
  let events: Event[];
  try {
    events = parseEvents(text, { maxDepth: limits.maxDepth });
  } catch (err) {
    return { error: problemOf(err, limits) };
  }
  const checked = checkAliases(text, events, limits, shared);
  if (typeof checked !== 'number') return { error: checked };
  let documents: unknown[];
  try {
    documents = constructFromEvents(events, { source: text });
  } catch (err) {
    return { error: problemOf(err, limits) };
  }
  if (shared !== undefined) shared.remaining -= checked;
  return { documents, locate: (document, path) => offsetOf(text, events, document, path) };
}

function problemOf(err: unknown, limits: YamlLimits): YamlProblem {
  if (!(err instanceof YAMLException)) {
    // Not expected from js-yaml (it bounds its recursion by maxDepth); said plainly rather than thrown.
    return { offset: 0, message: `cannot be read: ${(err as Error).message}`, limit: false };
  }
  const offset = err.mark?.position ?? 0;
  if (err.reason.startsWith('nesting exceeded maxDepth'))
    return { offset, message: `nested deeper than ${limits.maxDepth} levels`, limit: true };
  return { offset, message: err.reason, limit: false };
}

// An anchor whose collection is still open: an alias to it would be a cycle.
const OPEN = -1;

/**
 * The first alias over a limit, or a recursive one; or, when the aliases are within bounds, what they add
 * in all when expanded.
 */
function checkAliases(
  text: string,
  events: readonly Event[],
  limits: YamlLimits,
  shared: AliasBudget | undefined,
): YamlProblem | number {
  const anchors = new Map<string, number>();
  // Per open collection: its expanded size so far and its anchor.
  const sizes: number[] = [];
  const names: (string | undefined)[] = [];
  let aliases = 0;
  let added = 0;
  const budget = Math.max(limits.maxAliasExpansion, text.length);
  // A kind: List of 5,000 Services sharing three anchors holds 15,000 aliases in 750 KB.
  const maxAliases = Math.max(limits.maxAliases, Math.floor(text.length / 16));
  const add = (size: number) => {
    if (sizes.length > 0) sizes[sizes.length - 1]! += size;
  };
  for (const e of events) {
    switch (e.type) {
      case EVENT_DOCUMENT: {
        // Anchors are per document; the limits are per text (300 documents of 690 bytes, each a bomb just
        // under a per-document limit, expanded to 276 M characters).
        anchors.clear();
        sizes.push(0);
        names.push(undefined);
        break;
      }
      case EVENT_SEQUENCE:
      case EVENT_MAPPING: {
        const name = e.anchorStart >= 0 ? text.slice(e.anchorStart, e.anchorEnd) : undefined;
        if (name !== undefined) anchors.set(name, OPEN);
        sizes.push(1);
        names.push(name);
        break;
      }
      case EVENT_SCALAR: {
        const size = 1 + e.valueEnd - e.valueStart;
        if (e.anchorStart >= 0) anchors.set(text.slice(e.anchorStart, e.anchorEnd), size);
        add(size);
        break;
      }
      case EVENT_ALIAS: {
        const name = text.slice(e.anchorStart, e.anchorEnd);
        const size = anchors.get(name);
        const offset = e.anchorStart - 1; // the `*`
        if (size === undefined) break; // js-yaml reports the unknown alias
        if (size === OPEN)
          return {
            offset,
            message: `alias *${name} is inside the node it names (a recursive alias)`,
            limit: true,
          };
        aliases++;
        added += size;
        if (aliases > maxAliases)
          return {
            offset,
            message: `more than ${maxAliases} aliases in ${text.length} characters`,
            limit: true,
          };
        if (added > budget)
          return {
            offset,
            message: `aliases expand the document by more than ${budget} nodes and characters (alias *${name} adds ${size}; an alias bomb?)`,
            limit: true,
          };
        if (shared !== undefined && added > shared.remaining) {
          shared.exceeded = true;
          return {
            offset,
            message: `aliases expand the ${shared.scope} by more than ${shared.total} nodes and characters in all (alias *${name} adds ${size}; many small alias bombs?)`,
            limit: true,
          };
        }
        add(size);
        break;
      }
      case EVENT_POP: {
        const size = sizes.pop() ?? 0;
        const name = names.pop();
        if (name !== undefined) anchors.set(name, size);
        add(size);
        break;
      }
    }
  }
  return added;
}

/** Where an event's node starts in the text; -1 for events that are not nodes. */
function startOf(e: Event | undefined): number {
  if (e === undefined) return -1;
  if (e.type === EVENT_SEQUENCE || e.type === EVENT_MAPPING) return e.start;
  if (e.type === EVENT_SCALAR) return e.valueStart;
  if (e.type === EVENT_ALIAS) return e.anchorStart - 1;
  return -1;
}

/** The index of the event after the node that starts at event `i`. */
function skip(events: readonly Event[], i: number): number {
  const e = events[i];
  if (e === undefined || (e.type !== EVENT_SEQUENCE && e.type !== EVENT_MAPPING)) return i + 1;
  let depth = 0;
  for (let j = i; j < events.length; j++) {
    const t = events[j]!.type;
    if (t === EVENT_SEQUENCE || t === EVENT_MAPPING) depth++;
    else if (t === EVENT_POP && --depth === 0) return j + 1;
  }
  return events.length;
}

/** The offset of the node at `path` in a document, walking the events; its closest parent when not found. */
function offsetOf(text: string, events: readonly Event[], document: number, path: YamlPath): number {
  let i = 0;
  for (let d = -1; i < events.length; i++) {
    if (events[i]!.type === EVENT_DOCUMENT && ++d === document) break;
  }
  i++;
  let best = Math.max(0, startOf(events[i]));
  for (const segment of path) {
    const e = events[i];
    let next = -1;
    if (e?.type === EVENT_MAPPING) {
      for (let j = i + 1; j < events.length && events[j]!.type !== EVENT_POP; ) {
        const key = events[j]!;
        const value = skip(events, j);
        if (key.type === EVENT_SCALAR && getScalarValue(text, key) === String(segment)) {
          next = value;
          break;
        }
        j = skip(events, value);
      }
    } else if (e?.type === EVENT_SEQUENCE && typeof segment === 'number') {
      let j = i + 1;
      for (let n = 0; n < segment && j < events.length && events[j]!.type !== EVENT_POP; n++)
        j = skip(events, j);
      if (j < events.length && events[j]!.type !== EVENT_POP) next = j;
    }
    if (next < 0 || startOf(events[next]) < 0) return best;
    i = next;
    best = startOf(events[i]);
  }
  return best;
}
