// Where a manifest's YAML can be cut so that each part is parsed on its own, a few milliseconds at a time:
// between documents (YAML forbids a `---` or `...` line inside one), and between the entries of a List's
// top-level `items:` block sequence, the shape `kubectl get -o yaml` writes. The cuts are found in the bytes,
// so no string of the whole file is ever built. Pure: generators that yield every CHUNK bytes of progress.
import type { Span } from '../lib/json-outline.ts';

// How much text is scanned between two yields.
const CHUNK = 256 * 1024;

const NL = 0x0a;
const CR = 0x0d;
const SPACE = 0x20;
const TAB = 0x09;

/**
 * The documents of a YAML stream as byte spans, each yielded as it is found (undefined in between: a point
 * where the caller may pause): a cut before each `---` line and after each `...` line. A part holding a
 * directive line (`%YAML`, `%TAG`) is not cut from the document that follows it (the directive belongs to
 * it). Parts with nothing but blank lines and comments are kept: they parse to nothing.
 */
export function* yamlDocuments(buf: Buffer): Generator<Span | undefined, void> {
  let start = 0;
  let found = false;
  // Where the text since the last place a cut could go starts: a directive there keeps the next cut away.
  let since = 0;
  let checkpoint = CHUNK;
  let dash = nextMarker(buf, '---', 0);
  let dots = nextMarker(buf, '...', 0);
  while (dash >= 0 || dots >= 0) {
    let cut: number;
    if (dots >= 0 && (dash < 0 || dots < dash)) {
      // `...` ends the document: the cut goes after its line.
      const nl = buf.indexOf(NL, dots);
      cut = nl < 0 ? buf.length : nl + 1;
      dots = nextMarker(buf, '...', cut);
      if (dash >= 0 && dash < cut) dash = nextMarker(buf, '---', cut);
    } else {
      cut = dash;
      dash = nextMarker(buf, '---', dash + 3);
    }
    if (cut > start && !hasDirective(buf, since, cut)) {
      yield { start, end: cut };
      found = true;
      start = cut;
    }
    since = cut;
    if (cut >= checkpoint) {
      yield undefined;
      checkpoint = cut + CHUNK;
    }
  }
  if (start < buf.length || !found) yield { start, end: buf.length };
}

/** The offset of the next line that is the marker (alone, or followed by a space or tab), or -1. */
function nextMarker(buf: Buffer, marker: string, from: number): number {
  for (let at = buf.indexOf(marker, from, 'latin1'); at >= 0; at = buf.indexOf(marker, at + 1, 'latin1')) {
    if (at > 0 && buf[at - 1] !== NL) continue;
    const next = buf[at + 3];
    if (next === undefined || next === NL || next === CR || next === SPACE || next === TAB) return at;
  }
  return -1;
}

function hasDirective(buf: Buffer, start: number, end: number): boolean {
  return buf[start] === 0x25 /* % */ || buf.subarray(start, end).includes('\n%', 0, 'latin1');
}

/** A List document cut into its parts: the document without its items (`items: []`), and each item. */
export type ListSplit = {
  /** The document's text with the items sequence replaced by `items: []`. */
  readonly head: string;
  /** Each entry of the sequence, from its `-` line to the next entry (blank and comment lines included). */
  readonly items: Span[];
};

/**
 * Cuts a document shaped as `kubectl get -o yaml` writes a List: a top-level `items:` key alone on its
 * line at column 0, followed by a block sequence (`- ` at one indentation). Each entry's lines are more
 * indented than its `-`, so the entries are found by indentation alone; undefined when the document does
 * not have that shape. The caller parses each part and must fall back to the whole document when a part
 * does not parse on its own (an alias to an anchor in another item, or text this cut misread).
 */
export function* listItems(buf: Buffer, doc: Span): Generator<void, ListSplit | undefined> {
  const keyLine = itemsKeyLine(buf, doc);
  if (keyLine === undefined) return undefined;
  const items: Span[] = [];
  let indent = -1;
  let itemStart = -1;
  let end = doc.end;
  let checkpoint = keyLine.end + CHUNK;
  for (let line = keyLine.end; line < doc.end; ) {
    const nl = buf.indexOf(NL, line);
    const next = nl < 0 || nl >= doc.end ? doc.end : nl + 1;
    let i = line;
    while (i < next && buf[i] === SPACE) i++;
    const c = buf[i];
    const blank = i >= next || c === NL || c === CR || c === 0x23; /* # */
    if (!blank) {
      const entry = c === 0x2d /* - */ && isSpaceOrEnd(buf[i + 1]);
      const at = i - line;
      if (indent < 0) {
        if (!entry) return undefined;
        indent = at;
        itemStart = line;
      } else if (entry && at === indent) {
        items.push({ start: itemStart, end: line });
        itemStart = line;
      } else if (at <= indent) {
        end = line;
        break;
      }
    }
    line = next;
    if (line >= checkpoint) {
      yield;
      checkpoint = line + CHUNK;
    }
  }
  if (itemStart < 0) return undefined;
  items.push({ start: itemStart, end });
  const head =
    buf.toString('utf8', doc.start, keyLine.start) + 'items: []\n' + buf.toString('utf8', end, doc.end);
  return { head, items };
}

function isSpaceOrEnd(c: number | undefined): boolean {
  return c === undefined || c === SPACE || c === NL || c === CR;
}

/** The `items:` line at column 0 (nothing after the colon but blanks or a comment), if the document has one. */
function itemsKeyLine(buf: Buffer, doc: Span): Span | undefined {
  const text = buf.subarray(0, doc.end);
  for (let at = text.indexOf('items:', doc.start, 'latin1'); at >= 0; ) {
    if (at === doc.start || buf[at - 1] === NL) {
      let i = at + 'items:'.length;
      while (buf[i] === SPACE || buf[i] === TAB) i++;
      const c = buf[i];
      if (c === undefined || c === NL || c === CR || c === 0x23 /* # */) {
        const nl = buf.indexOf(NL, i);
        return { start: at, end: nl < 0 || nl >= doc.end ? doc.end : nl + 1 };
      }
    }
    at = text.indexOf('items:', at + 1, 'latin1');
  }
  return undefined;
}
