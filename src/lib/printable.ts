// Text that came from clients (an HTTP path, a TLS server name, a database user) made safe to print on a
// terminal: control characters (C0, DEL, C1: ESC and CSI start escape sequences) and the Unicode ones that
// reorder or break lines (bidi controls, line and paragraph separators) never reach it raw. Pure.

// What JSON.stringify leaves raw: DEL, C1, the bidi controls, U+2028 and U+2029.
const JSON_UNSAFE = /[\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;
const JSON_UNSAFE_ANY = /[\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/;
// The same plus C0 and the backslash, for text shown as is.
const UNSAFE = /[\\\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;
const UNSAFE_ANY = /[\\\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/;

function hex(c: string, width: number): string {
  return c.charCodeAt(0).toString(16).padStart(width, '0');
}

function escapeChar(c: string): string {
  if (c === '\\') return '\\\\';
  const code = c.charCodeAt(0);
  return code <= 0xff ? `\\x${hex(c, 2)}` : `\\u{${hex(c, 4)}}`;
}

/**
 * `s` for a terminal: control and line-breaking characters as `\xNN` (up to U+00FF) or `\u{NNNN}`, and
 * the backslash as `\\`, so that what is printed reads back unambiguously. Unchanged when there are none.
 */
export function printable(s: string): string {
  return UNSAFE_ANY.test(s) ? s.replace(UNSAFE, escapeChar) : s;
}

/** Whether `s` holds anything printable() would escape. */
export function needsEscaping(s: string): boolean {
  return UNSAFE_ANY.test(s);
}

/**
 * Serialized JSON with the characters JSON.stringify leaves raw (DEL, C1, bidi controls, U+2028/2029)
 * written as `\uNNNN`: they occur only inside strings, so it parses to exactly the same value. C0 and the
 * backslash are escaped by JSON itself.
 */
export function jsonSafe(json: string): string {
  return JSON_UNSAFE_ANY.test(json) ? json.replace(JSON_UNSAFE, (c) => `\\u${hex(c, 4)}`) : json;
}
