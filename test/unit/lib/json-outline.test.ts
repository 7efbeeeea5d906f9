// The JSON outline: its spans put back together give exactly what JSON.parse gives; structural problems
// and deep nesting come back with their byte offset; a big text is outlined in pieces.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { type JsonOutline, outlineJson } from '../../../src/lib/json-outline.ts';

function outline(text: string, maxDepth = 100): JsonOutline {
  const steps = outlineJson(Buffer.from(text), maxDepth);
  for (let step = steps.next(); ; step = steps.next()) if (step.done) return step.value;
}

/** The value rebuilt from the outline: each member (and each item) parsed on its own. */
function rebuild(text: string): unknown {
  const buf = Buffer.from(text);
  const o = outline(text);
  assert.equal(o.error, undefined, JSON.stringify(o.error));
  if (o.root === 'other') return JSON.parse(buf.toString('utf8', o.value.start, o.value.end));
  const parse = (s: { start: number; end: number }) => JSON.parse(buf.toString('utf8', s.start, s.end));
  const members = new Map<string, unknown>();
  for (const m of o.members!) members.set(m.key, m.items === undefined ? parse(m.value) : m.items.map(parse));
  return Object.fromEntries(members);
}

const same = [
  { name: 'a List', text: '{"kind":"List","items":[{"a":1},{"b":[1,2,{"c":"]}"}]},3,"x",null]}' },
  { name: 'pretty, with CRLF and tabs', text: '{\r\n\t"kind" : "List",\r\n\t"items" : [ {} , [] ]\r\n}\r\n' },
  { name: 'escapes in keys and strings', text: '{"k\\"ey":"v\\\\","items":["\\"]","\\\\"],"\\u00e9":1}' },
  { name: 'an empty object', text: '{}' },
  { name: 'empty items', text: '{"items":[]}' },
  { name: 'items that are not an array', text: '{"items":{"a":[1]}}' },
  { name: 'a repeated key: first place, last value', text: '{"a":1,"items":[1],"b":2,"a":3,"items":[4,5]}' },
  { name: 'numbers of every shape', text: '{"n":[-0,1.5e-3,2E+10,0.25,-12]}' },
  { name: 'UTF-8 in strings', text: '{"items":["héllo","日本","🙂"]}' },
  { name: 'a root array', text: '[{"a":1},2]' },
  { name: 'a root string', text: ' "x" ' },
  { name: '__proto__ as a key stays an own property', text: '{"__proto__":{"x":1},"items":[]}' },
];

for (const c of same)
  test(`outline of ${c.name} rebuilds what JSON.parse gives`, () => {
    assert.deepEqual(rebuild(c.text), JSON.parse(c.text));
  });

const bad = [
  { name: 'trailing text', text: '{"a":1} x', offset: 8 },
  { name: 'a missing comma', text: '{"items":[{} {}]}', offset: 13 },
  { name: 'a missing colon', text: '{"a" 1}', offset: 5 },
  { name: 'a key that is not a string', text: '{a:1}', offset: 1 },
  { name: 'an unterminated string', text: '{"a":"abc}', offset: 5 },
  { name: 'a mismatched bracket', text: '{"a":[1}', offset: 7 },
  { name: 'the end of the text inside an object', text: '{"a":1', offset: 6 },
  { name: 'a stray character', text: '{"a":#}', offset: 5 },
  { name: 'nesting past the limit', text: `{"a":${'['.repeat(10_000)}${']'.repeat(10_000)}}`, offset: 104 },
  { name: 'an empty text', text: '  ', offset: 2 },
];

for (const c of bad)
  test(`outline reports ${c.name} at its offset`, () => {
    const o = outline(c.text);
    assert.ok(o.error, 'an error');
    assert.equal(o.error.offset, c.offset, o.error.message);
  });

test('what a span holds is left to JSON.parse: a bad literal inside an item parses as its own error', () => {
  const text = '{"items":[{"a":tru}]}';
  const o = outline(text);
  assert.equal(o.error, undefined);
  const items = o.root === 'object' ? o.members[0]!.items! : [];
  assert.throws(() => JSON.parse(text.slice(items[0]!.start, items[0]!.end)), SyntaxError);
});

test('a big text is outlined in pieces (the generator yields)', () => {
  const text = JSON.stringify({
    kind: 'List',
    items: Array.from({ length: 20_000 }, (_, i) => ({ i, s: 'x'.repeat(50) })),
  });
  const steps = outlineJson(Buffer.from(text), 100);
  let yields = 0;
  let step = steps.next();
  for (; !step.done; step = steps.next()) yields++;
  assert.ok(yields >= Math.floor(text.length / (256 * 1024)), `${yields} yields for ${text.length} bytes`);
  const o = step.value;
  assert.ok(o.error === undefined && o.root === 'object');
  assert.equal(o.members[1]!.items!.length, 20_000);
});
