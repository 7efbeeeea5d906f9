// Where a manifest's YAML is cut: between documents, and between the items of a `kind: List` document as
// kubectl writes it. Every cut must give parts that parse to what the whole text parses to.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { load, loadAll } from 'js-yaml';
import type { Span } from '../../../src/lib/json-outline.ts';
import { listItems, yamlDocuments } from '../../../src/source/manifest-split.ts';

function run<T>(steps: Generator<void, T>): T {
  for (let step = steps.next(); ; step = steps.next()) if (step.done) return step.value;
}

const texts = (buf: Buffer, spans: Span[]) => spans.map((s) => buf.toString('utf8', s.start, s.end));

const streams = [
  { name: 'one document', text: 'a: 1\n', parts: ['a: 1\n'] },
  {
    name: 'documents after ---',
    text: 'a: 1\n---\nb: 2\n--- # c\nc: 3',
    parts: ['a: 1\n', '---\nb: 2\n', '--- # c\nc: 3'],
  },
  { name: 'a leading ---', text: '---\na: 1\n---\nb: 2\n', parts: ['---\na: 1\n', '---\nb: 2\n'] },
  {
    name: 'content on the --- line',
    text: '--- {a: 1}\n--- |\n  text\n',
    parts: ['--- {a: 1}\n', '--- |\n  text\n'],
  },
  { name: 'an end marker', text: 'a: 1\n...\nb: 2\n...\n', parts: ['a: 1\n...\n', 'b: 2\n...\n'] },
  { name: 'CRLF lines', text: 'a: 1\r\n---\r\nb: 2\r\n', parts: ['a: 1\r\n', '---\r\nb: 2\r\n'] },
  {
    name: 'a directive stays with its document',
    text: 'a: 1\n...\n%YAML 1.2\n---\nb: 2\n---\nc: 3\n',
    parts: ['a: 1\n...\n', '%YAML 1.2\n---\nb: 2\n', '---\nc: 3\n'],
  },
  {
    name: '--- not alone or not first is text',
    text: 'a: "x\n  ---"\n---x: 1\nb: ---\n',
    parts: ['a: "x\n  ---"\n---x: 1\nb: ---\n'],
  },
  { name: 'an empty text', text: '', parts: [''] },
];

for (const c of streams)
  test(`documents of ${c.name}`, () => {
    const buf = Buffer.from(c.text);
    const parts = texts(
      buf,
      [...yamlDocuments(buf)].filter((s) => s !== undefined),
    );
    assert.deepEqual(parts, c.parts);
    assert.equal(parts.join(''), c.text);
    assert.deepEqual(
      parts.flatMap((p) => loadAll(p)),
      loadAll(c.text),
    );
  });

const svc = (name: string, indent: string) =>
  `${indent}- apiVersion: v1\n${indent}  kind: Service\n${indent}  metadata:\n${indent}    name: ${name}\n${indent}  spec:\n${indent}    ports:\n${indent}    - port: 80\n`;

const lists = [
  {
    name: 'kubectl -o yaml (items at column 0, kind after them)',
    text: `apiVersion: v1\nitems:\n${svc('a', '')}# a comment\n\n${svc('b', '')}kind: List\nmetadata:\n  resourceVersion: ""\n`,
    items: 2,
  },
  {
    name: 'items indented by two, a block scalar inside',
    text: `kind: ServiceList\nitems:  # the objects\n${svc('a', '  ')}    note: |\n      - not an item\n      text\n${svc('b', '  ')}`,
    items: 2,
  },
];

for (const c of lists)
  test(`List items of ${c.name}`, () => {
    const buf = Buffer.from(c.text);
    const split = run(listItems(buf, { start: 0, end: buf.length }));
    assert.ok(split);
    assert.equal(split.items.length, c.items);
    const whole = load(c.text) as { items: unknown[] };
    const head = load(split.head) as { items: unknown[] };
    assert.deepEqual(head.items, []);
    assert.deepEqual(
      texts(buf, split.items).map((t) => (load(t) as unknown[])[0]),
      whole.items,
    );
    assert.deepEqual({ ...head, items: whole.items }, whole);
  });

const notLists = [
  { name: 'no items key', text: 'kind: List\n' },
  { name: 'a flow items value', text: 'kind: List\nitems: [{a: 1}]\n' },
  { name: 'items that are a mapping', text: 'kind: List\nitems:\n  a: 1\n' },
  { name: 'items: inside a block scalar', text: 'note: |\n  items:\n  - a\n' },
  { name: 'an indented items key', text: 'x:\n  items:\n  - a\n' },
];

for (const c of notLists)
  test(`no List cut for ${c.name}`, () => {
    const buf = Buffer.from(c.text);
    assert.equal(run(listItems(buf, { start: 0, end: buf.length })), undefined);
  });
