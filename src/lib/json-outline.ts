// The outline of a JSON text, found without building it: the byte spans of the root object's members and
// of the elements of its `items` array, so a huge List can be parsed an item at a time (JSON.parse of a
// 50 MB text holds the event loop for ~0.5 s). It checks the structure (brackets, commas, colons, where
// strings end) and the nesting depth, and says where the first problem is; what is inside a span is left to
// JSON.parse of that span. Pure: a generator that yields every CHUNK bytes, so that its caller can give
// the event loop a turn.

/** A part of the text: bytes [start, end). */
export type Span = { readonly start: number; readonly end: number };

/** A member of the root object; `items` lists the elements when the member is `items` and an array. */
export type Member = { readonly key: string; readonly value: Span; readonly items: Span[] | undefined };

export type JsonOutline =
  | { readonly root: 'object'; readonly members: Member[]; readonly error?: undefined }
  | { readonly root: 'other'; readonly value: Span; readonly error?: undefined }
  | { readonly error: OutlineError };

export type OutlineError = {
  readonly offset: number;
  readonly message: string;
  /**
   * False when the text is broken whichever way it is read (it ends early, a string never ends, it nests
   * too deep); true when it breaks a rule of JSON that YAML's flow style does not have (a key or a value
   * without quotes, text after the value): it may be YAML, `{apiVersion: v1, kind: List, items: [...]}`.
   */
  readonly mayBeYaml: boolean;
};

// How much text is scanned between two yields.
const CHUNK = 256 * 1024;

const OBJECT = 1;
const ARRAY = 2;
// What may come next.
const VALUE = 0;
const VALUE_OR_CLOSE = 1; // after `[`
const KEY = 2;
const KEY_OR_CLOSE = 3; // after `{`
const COLON = 4;
const AFTER = 5; // after a value: `,`, a closing bracket, or the end

const QUOTE = 0x22;
const BACKSLASH = 0x5c;

/**
 * Outlines the JSON text in `buf`. Returns the members of a root object (or the span of any other root
 * value), or the byte offset and nature of the first structural problem or of nesting past `maxDepth`.
 */
export function* outlineJson(buf: Buffer, maxDepth: number): Generator<void, JsonOutline> {
  const n = buf.length;
  const stack: number[] = [];
  const members: Member[] = [];
  let key = '';
  let valueStart = -1;
  let itemStart = -1;
  let items: Span[] | undefined;
  let rootStart = -1;
  let expect = VALUE;
  let i = 0;
  let checkpoint = CHUNK;
  const fail = (offset: number, message: string, mayBeYaml = true): JsonOutline => ({
    error: { offset, message, mayBeYaml },
  });
  for (;;) {
    i = skipSpace(buf, i);
    if (i >= checkpoint) {
      yield;
      checkpoint = i + CHUNK;
    }
    if (i >= n) {
      if (expect === AFTER && stack.length === 0) break;
      return fail(n, 'unexpected end of the text', false);
    }
    const c = buf[i]!;
    if (expect === AFTER) {
      const top = stack.at(-1);
      if (top === undefined) return fail(i, 'unexpected text after the end of the JSON value');
      if (c === 0x2c /* , */) {
        expect = top === OBJECT ? KEY : VALUE;
        i++;
        continue;
      }
      if (c !== (top === OBJECT ? 0x7d /* } */ : 0x5d) /* ] */)
        return fail(i, top === OBJECT ? "expected ',' or '}'" : "expected ',' or ']'");
    } else if (expect === KEY || expect === KEY_OR_CLOSE) {
      if (c === 0x7d /* } */ && expect === KEY_OR_CLOSE) {
        // an empty object: closed below
      } else {
        if (c !== QUOTE) return fail(i, 'expected a string (a key)');
        const end = stringEnd(buf, i);
        if (end < 0) return fail(i, 'unterminated string', false);
        if (stack.length === 1 && stack[0] === OBJECT) {
          try {
            key = JSON.parse(buf.toString('utf8', i, end));
          } catch {
            return fail(i, 'invalid string');
          }
        }
        i = end;
        expect = COLON;
        continue;
      }
    } else if (expect === COLON) {
      if (c !== 0x3a /* : */) return fail(i, "expected ':'");
      i++;
      expect = VALUE;
      continue;
    } else if (!(c === 0x5d /* ] */ && expect === VALUE_OR_CLOSE)) {
      // A value starts.
      const depth = stack.length;
      if (depth === 0) rootStart = i;
      else if (depth === 1 && stack[0] === OBJECT) valueStart = i;
      else if (depth === 2 && items !== undefined) itemStart = i;
      if (c === 0x7b /* { */ || c === 0x5b /* [ */) {
        if (depth >= maxDepth) return fail(i, `nested deeper than ${maxDepth} levels`, false);
        if (depth === 1 && stack[0] === OBJECT && key === 'items' && c === 0x5b) items = [];
        stack.push(c === 0x7b ? OBJECT : ARRAY);
        expect = c === 0x7b ? KEY_OR_CLOSE : VALUE_OR_CLOSE;
        i++;
        continue;
      }
      if (c === QUOTE) {
        i = stringEnd(buf, i);
        if (i < 0)
          return fail(valueStartOf(depth, rootStart, valueStart, itemStart), 'unterminated string', false);
      } else {
        const end = scalarEnd(buf, i);
        if (end === i || !isScalarStart(c))
          return fail(i, `unexpected character '${String.fromCharCode(c)}'`);
        i = end;
      }
      ended(i);
      continue;
    }
    // A closing bracket that the state allows.
    stack.pop();
    i++;
    ended(i);
  }
  if (stack.length === 0 && rootStart >= 0 && buf[rootStart] === 0x7b) return { root: 'object', members };
  return { root: 'other', value: { start: rootStart, end: i } };

  /** A value (scalar or container) ended at `end`: records it if it is a member or an item. */
  function ended(end: number): void {
    const depth = stack.length;
    if (depth === 1 && stack[0] === OBJECT) {
      members.push({ key, value: { start: valueStart, end }, items });
      items = undefined;
    } else if (depth === 2 && items !== undefined) {
      items.push({ start: itemStart, end });
    }
    expect = AFTER;
  }
}

function valueStartOf(depth: number, root: number, member: number, item: number): number {
  return depth === 0 ? root : depth === 1 ? member : item;
}

function skipSpace(buf: Uint8Array, i: number): number {
  for (; i < buf.length; i++) {
    const c = buf[i];
    if (c !== 0x20 && c !== 0x0a && c !== 0x0d && c !== 0x09) break;
  }
  return i;
}

/** The offset after the string that starts (with its quote) at `i`, or -1 when it does not end. */
function stringEnd(buf: Uint8Array, i: number): number {
  for (let from = i + 1; ; ) {
    const q = buf.indexOf(QUOTE, from);
    if (q < 0) return -1;
    let k = q - 1;
    while (buf[k] === BACKSLASH) k--;
    // An even run of backslashes escapes itself, not the quote.
    if ((q - 1 - k) % 2 === 0) return q + 1;
    from = q + 1;
  }
}

/** The offset after a number, `true`, `false` or `null` starting at `i` (JSON.parse checks the spelling). */
function scalarEnd(buf: Uint8Array, i: number): number {
  for (; i < buf.length; i++) {
    const c = buf[i];
    if (
      c === 0x20 ||
      c === 0x0a ||
      c === 0x0d ||
      c === 0x09 ||
      c === 0x2c ||
      c === 0x5d ||
      c === 0x7d ||
      c === 0x3a ||
      c === QUOTE ||
      c === 0x5b ||
      c === 0x7b
    )
      break;
  }
  return i;
}

function isScalarStart(c: number): boolean {
  return c === 0x2d /* - */ || (c >= 0x30 && c <= 0x39) || c === 0x74 || c === 0x66 || c === 0x6e;
}
