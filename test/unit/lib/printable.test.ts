// Client text made safe for a terminal: every control and line-breaking character escaped, readable text
// unchanged; JSON re-escaped to the same value.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { jsonSafe, printable } from '../../../src/lib/printable.ts';

const cases: { name: string; input: string; want: string }[] = [
  {
    name: 'plain text is unchanged',
    input: 'GET /cart?x=1 host=shop.example',
    want: 'GET /cart?x=1 host=shop.example',
  },
  { name: 'non-ASCII letters are unchanged', input: 'café → 東京 …', want: 'café → 東京 …' },
  {
    name: 'ESC sequences (set title, clear screen)',
    input: '/\x1b]0;owned\x07\x1b[2J',
    want: '/\\x1b]0;owned\\x07\\x1b[2J',
  },
  {
    name: 'C0: NUL, tab, newline, carriage return',
    input: 'a\x00b\tc\nd\re',
    want: 'a\\x00b\\x09c\\x0ad\\x0de',
  },
  { name: 'DEL', input: 'x\x7fy', want: 'x\\x7fy' },
  {
    name: 'C1: 8-bit CSI and OSC (latin1 bytes 0x9b, 0x9d)',
    input: '\x9b31m\x9d0;t\x9c',
    want: '\\x9b31m\\x9d0;t\\x9c',
  },
  {
    name: 'bidi override (Trojan Source)',
    input: 'admin\u202e\u2066txt',
    want: 'admin\\u{202e}\\u{2066}txt',
  },
  { name: 'line and paragraph separators', input: 'a\u2028b\u2029c', want: 'a\\u{2028}b\\u{2029}c' },
  {
    name: 'the backslash itself, so that escapes read back unambiguously',
    input: 'a\\x1b',
    want: 'a\\\\x1b',
  },
];

for (const c of cases) test(`printable: ${c.name}`, () => assert.equal(printable(c.input), c.want));

test('printable: no character a terminal acts on survives, over every code unit up to U+FFFF', () => {
  const all = Array.from({ length: 0x10000 }, (_, i) => String.fromCharCode(i)).join('');
  const out = printable(all);
  assert.doesNotMatch(
    out,
    /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/,
  );
});

test('jsonSafe: what JSON.stringify leaves raw is escaped, and the value is exactly the same', () => {
  const value = { path: '/\x1b[2J\x9b31m\u202e\u2028\x7f', n: 1, nested: ['\x9d0;x\x07'] };
  const raw = JSON.stringify(value);
  assert.match(raw, /[\u007f-\u009f\u202e\u2028]/, 'JSON.stringify leaves DEL, C1, bidi and U+2028 raw');
  const safe = jsonSafe(raw);
  assert.doesNotMatch(safe, /[\u0000-\u001f\u007f-\u009f\u202e\u2028]/);
  assert.deepEqual(JSON.parse(safe), value);
  assert.equal(jsonSafe('{"a":"plain"}'), '{"a":"plain"}');
});
