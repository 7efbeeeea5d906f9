// The guarded YAML reader: alias bombs, recursive aliases and deep nesting are problems with their place,
// found before any value is built; ordinary aliases and documents read as js-yaml reads them.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { AliasBudget, readYaml, YAML_LIMITS } from '../../../src/lib/safe-yaml.ts';
import { linePosition } from '../../../src/lib/text-position.ts';
import { aliasBomb } from '../../helpers/alias-bomb.ts';

const bomb = aliasBomb;

const refused = [
  {
    name: 'alias bomb, 9 levels of 9 (387 million nodes)',
    text: bomb(9),
    want: /^aliases expand the document by more than 1000000 nodes/,
    line: 6,
  },
  { name: 'alias bomb, 6 levels of 9 in 260 bytes', text: bomb(7), want: /^aliases expand/, line: 6 },
  { name: 'recursive alias in a flow sequence', text: 'x: &r [1, *r]\n', want: /recursive alias/, line: 1 },
  {
    name: 'recursive alias in a block mapping',
    text: 'a: 1\nx: &r\n  y: *r\n',
    want: /recursive alias/,
    line: 3,
  },
  {
    name: 'recursive alias deeper inside',
    text: 'x: &r\n  y:\n    - z: [1, 2, *r]\n',
    want: /alias \*r is inside the node it names/,
    line: 3,
  },
  {
    name: 'flow nesting 10,000 deep',
    text: `x: ${'['.repeat(10_000)}${']'.repeat(10_000)}`,
    want: /^nested deeper than 100 levels$/,
    line: 1,
  },
  {
    name: 'block nesting 300 deep',
    text: Array.from({ length: 300 }, (_, i) => `${' '.repeat(i)}k:\n`).join(''),
    want: /^nested deeper than 100 levels$/,
    line: 100,
  },
  {
    name: 'more than 10,000 aliases',
    text: `a: &a 1\nb: [${Array(10_001).fill('*a').join(', ')}]\n`,
    want: /^more than 10000 aliases in 40016 characters$/,
    line: 2,
  },
];

for (const c of refused)
  test(`refuses ${c.name}, with its place`, () => {
    const started = performance.now();
    const read = readYaml(c.text);
    assert.ok(read.error, 'refused');
    assert.match(read.error.message, c.want);
    assert.equal(read.error.limit, true);
    assert.equal(linePosition(c.text, read.error.offset).line, c.line);
    assert.ok(performance.now() - started < 500, `${Math.round(performance.now() - started)} ms`);
  });

test('ordinary aliases read as shared values; anchors are per document', () => {
  const read = readYaml('ports: &p [{port: 80}]\nagain: *p\n---\np: &p 1\nq: *p\n');
  assert.equal(read.error, undefined);
  assert.deepEqual(read.documents, [
    { ports: [{ port: 80 }], again: [{ port: 80 }] },
    { p: 1, q: 1 },
  ]);
});

test('an anchor redefined inside its own node: the alias names the inner one, no cycle', () => {
  const read = readYaml('x: &a [ &a 1, *a ]\n');
  assert.equal(read.error, undefined);
  assert.deepEqual(read.documents, [{ x: [1, 1] }]);
});

test('aliases within the budget pass: 9 aliases of 9 aliases of a 9-item list', () => {
  assert.equal(readYaml(bomb(3)).error, undefined);
});

test('a bigger text may expand by its own length', () => {
  // bomb(6)'s aliases add ~2.4 M nodes and characters.
  const big = `pad: "${'x'.repeat(3 * YAML_LIMITS.maxAliasExpansion)}"\n${bomb(6)}`;
  assert.equal(readYaml(big).error, undefined, 'a 3 MB text may add 2.4 M');
  assert.ok(readYaml(bomb(6)).error, 'a small one may not');
});

test('a syntax error comes back with its place, not as a limit', () => {
  const text = 'a: [1,\nb: 2';
  const read = readYaml(text);
  assert.ok(read.error);
  assert.equal(read.error.limit, false);
  assert.equal(linePosition(text, read.error.offset).line, 2);
});

test('an unknown alias is a syntax error', () => {
  const read = readYaml('a: *nope\n');
  assert.ok(read.error);
  assert.equal(read.error.limit, false);
  assert.match(read.error.message, /nope/);
});

test('locate finds the node at a path, or its closest parent', () => {
  const text = 'a: 1\nspec:\n  ports:\n    - name: http\n      port: eighty\n---\nkind: x\n';
  const read = readYaml(text);
  if (read.error !== undefined) assert.fail(read.error.message);
  const at = (document: number, path: (string | number)[]) => linePosition(text, read.locate(document, path));
  assert.deepEqual(at(0, ['spec', 'ports', 0, 'port']), { line: 5, col: 13 });
  assert.deepEqual(at(0, ['spec', 'ports', 0, 'missing']), { line: 4, col: 7 });
  assert.deepEqual(at(0, ['spec', 'ports', 3]), { line: 4, col: 5 });
  assert.deepEqual(at(0, []), { line: 1, col: 1 });
  assert.deepEqual(at(1, ['kind']), { line: 7, col: 7 });
});

test('the expansion limit is per text, not per document: 4 documents each under it are refused', () => {
  // bomb(6) alone adds ~2.4 M; bomb(5) ~266 K: four of them in one text are over 1 M.
  assert.equal(readYaml(bomb(5)).error, undefined);
  const text = Array(4).fill(bomb(5)).join('---\n');
  const read = readYaml(text);
  assert.ok(read.error, 'refused');
  assert.match(read.error.message, /^aliases expand the document by more than 1000000/);
  assert.equal(linePosition(text, read.error.offset).line, 23, 'in the fourth document');
});

test('a shared budget is spent by each text that reads, and refuses the first text past it', () => {
  const budget = new AliasBudget(1_000_000, 'manifest');
  for (let i = 0; i < 3; i++) assert.equal(readYaml(bomb(5), YAML_LIMITS, budget).error, undefined);
  assert.ok(budget.remaining < 300_000 && !budget.exceeded, `${budget.remaining} left`);
  const read = readYaml(bomb(5), YAML_LIMITS, budget);
  assert.ok(read.error);
  assert.match(
    read.error.message,
    /^aliases expand the manifest by more than 1000000 nodes and characters in all/,
  );
  assert.equal(read.error.limit, true);
  assert.ok(budget.exceeded);
});

test('the alias count scales with the text: one per 16 characters past 10,000', () => {
  // 15,000 aliases of a one-line anchor in 240 KB: what a List of 5,000 Services sharing 3 anchors holds.
  const text = `a: &a {app: web}\nb:\n${'  - *a                       # pad\n'.repeat(15_000)}`;
  assert.ok(text.length / 16 > 15_000);
  assert.equal(readYaml(text).error, undefined);
  const dense = `a: &a 1\nb: [${Array(15_000).fill('*a').join(',')}]\n`;
  assert.match(readYaml(dense).error?.message ?? '', /^more than 10000 aliases/);
});
