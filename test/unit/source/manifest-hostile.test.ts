// Manifest parsing of hostile and huge texts: bombs, cycles and deep nesting are problems with file:line:col
// (never a raw TypeError/RangeError, never a freeze); a big `kind: List` read an item at a time gives what
// the reference reader gives, with every problem at its line; a garbage file's message stays bounded.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { dump } from 'js-yaml';
import { isProxyError } from '../../../src/lib/errors.ts';
import { parseManifest, parseManifestAsync } from '../../../src/source/manifest-parse.ts';
import { service, slice } from '../../helpers/manifests.ts';

const SERVICE = 'apiVersion: v1\nkind: Service\nmetadata: {name: x, namespace: default}\n';

const hostile = [
  {
    name: 'an alias bomb inside a valid Service',
    text: `${SERVICE}spec: {clusterIP: 10.96.0.9, ports: [{port: 80}]}
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
`,
    want: /^invalid manifest: m\.yaml:(?:[5-9]|1[0-3]):\d+: aliases expand the document by more than 1000000/,
  },
  {
    name: 'a recursive alias',
    text: `${SERVICE}spec:\n  clusterIP: 10.96.0.9\n  ports: [{port: 80}]\n  x: &r {y: [*r]}\n`,
    want: /^invalid manifest: m\.yaml:7:14: alias \*r is inside the node it names \(a recursive alias\)$/,
  },
  {
    name: 'YAML nested 10,000 deep',
    text: `${SERVICE}spec:\n  x: ${'['.repeat(10_000)}${']'.repeat(10_000)}\n`,
    want: /^invalid manifest: m\.yaml:5:\d+: nested deeper than 100 levels$/,
  },
  {
    name: 'JSON nested 10,000 deep',
    text: `{"kind": "Service",\n "spec": ${'['.repeat(10_000)}${']'.repeat(10_000)}}`,
    want: /^invalid manifest: m\.yaml:2:\d+: nested deeper than 100 levels$/,
  },
  {
    name: 'a recursive alias in a List item',
    text: `kind: List\nitems:\n- ${SERVICE.replaceAll('\n', '\n  ')}spec: &s {x: *s}\n`,
    want: /^invalid manifest: m\.yaml:6:\d+: alias \*s is inside the node it names/,
  },
];

for (const c of hostile)
  test(`refuses ${c.name} with file:line:col, at once`, async () => {
    const started = performance.now();
    await assert.rejects(parseManifestAsync(c.text, 'm.yaml'), (err: Error) => {
      assert.ok(isProxyError(err, 'KUP_ERR_MANIFEST_INVALID'), err.stack);
      assert.match(err.message, c.want);
      return true;
    });
    // The reference reader too, within the same limits.
    assert.throws(
      () => parseManifest(c.text, 'm.yaml'),
      (err: Error) => isProxyError(err, 'KUP_ERR_MANIFEST_INVALID'),
    );
    assert.ok(performance.now() - started < 2000, `${Math.round(performance.now() - started)} ms`);
  });

/** A `kind: List` as `kubectl get -o yaml` writes it (items at column 0), big enough to be cut. */
function kubectlList(n: number, edit: (objects: Record<string, unknown>[]) => void = () => {}): string {
  const objects: Record<string, unknown>[] = [];
  for (let i = 0; i < n; i++) {
    objects.push(
      service(`svc-${i}`, `10.96.${i >> 8}.${i & 255}`, [{ name: 'http', port: 80, targetPort: 8080 }]),
    );
    objects.push(
      slice(
        `svc-${i}`,
        `svc-${i}-a`,
        [{ ip: `10.244.${i >> 8}.${i & 255}` }],
        [{ name: 'http', port: 8080 }],
      ),
    );
  }
  edit(objects);
  return dump(
    { apiVersion: 'v1', items: objects, kind: 'List', metadata: { resourceVersion: '' } },
    { seqNoIndent: true },
  );
}

test('a big kubectl List is read an item at a time and gives what the reference reader gives', async () => {
  const text = kubectlList(300);
  assert.ok(text.length > 64 * 1024 && /^items:\n- apiVersion/m.test(text), 'the shape that is cut');
  const fast = await parseManifestAsync(text, 'm.yaml');
  const reference = parseManifest(text, 'm.yaml');
  assert.equal(fast.size, 600);
  assert.deepEqual([...fast.keys()], [...reference.keys()]);
  for (const [key, entry] of fast) assert.equal(entry.json, reference.get(key)!.json);
});

test('a typed list (ServiceList) gives its items their kind when cut', async () => {
  const items = Array.from({ length: 400 }, (_, i) => {
    const { kind: _k, ...rest } = service(`svc-${i}`, `10.96.${i >> 8}.${i & 255}`, [
      { name: 'http', port: 80, targetPort: 8080 },
    ]);
    return rest;
  });
  const text = dump({ apiVersion: 'v1', kind: 'ServiceList', items });
  const fast = await parseManifestAsync(text, 'm.yaml');
  assert.equal(fast.size, 400);
  assert.equal(
    fast.get('Service/default/svc-7')?.json,
    parseManifest(text).get('Service/default/svc-7')?.json,
  );
});

test('an alias between List items: the cut does not hold, the document is read whole', async () => {
  const text = kubectlList(300)
    .replace(
      /^- apiVersion: v1\n {2}kind: Service\n {2}metadata:\n {4}name: svc-0\n/m,
      (m) => `${m}    labels: &shared {team: a}\n`,
    )
    .replace(/^( {2}metadata:\n {4}name: svc-299\n)/m, '$1    labels: *shared\n');
  const fast = await parseManifestAsync(text, 'm.yaml');
  assert.equal(fast.size, 600);
  assert.deepEqual((fast.get('Service/default/svc-299')!.object.metadata as { labels?: unknown }).labels, {
    team: 'a',
  });
});

test('a bad item of a big List is reported at its own line', async () => {
  const text = kubectlList(300, (objects) => {
    (objects[400] as { spec: { ports: { port: unknown }[] } }).spec.ports[0]!.port = 'eighty';
  });
  const line = text.split('\n').findIndex((l) => l.includes('port: eighty')) + 1;
  await assert.rejects(
    parseManifestAsync(text, 'm.yaml'),
    new RegExp(`m\\.yaml:${line}:\\d+: must be an integer`),
  );
});

test('a duplicate in a big List is reported at the second one', async () => {
  const text = kubectlList(300, (objects) => {
    objects.push(structuredClone(objects[10]!));
  });
  const lines = text.split('\n');
  const second =
    lines.findLastIndex((l, i) => l === '    name: svc-5' && lines[i - 2] === '  kind: Service') - 2;
  await assert.rejects(
    parseManifestAsync(text, 'm.yaml'),
    new RegExp(`m\\.yaml:${second}:3: duplicate Service default/svc-5`),
  );
});

test('a JSON List: a bad item at its line; a broken literal in a big one at its item, in a small one as YAML', async () => {
  const objects = Array.from({ length: 5000 }, (_, i) =>
    service(`svc-${i}`, `10.96.${i >> 8}.${i & 255}`, [{ name: 'http', port: 80, targetPort: 8080 }]),
  );
  (objects[3000]!.spec.ports[0] as { port: unknown }).port = 70000;
  const text = JSON.stringify({ kind: 'List', items: objects }, null, 1);
  assert.ok(text.length > 1024 * 1024, 'read as JSON, an item at a time');
  const line = text.split('\n').findIndex((l) => l.includes('70000')) + 1;
  await assert.rejects(
    parseManifestAsync(text, 'm.json'),
    new RegExp(`m\\.json:${line}:\\d+: must be between 1 and 65535`),
  );
  await assert.rejects(
    parseManifestAsync(text.replace('"port": 70000', '"port": 7OOOO'), 'm.json'),
    new RegExp(`m\\.json:${line}:\\d+: not valid JSON`),
  );
  // A small text that is not JSON is YAML (flow style): there, 7OOOO is a string.
  const small = JSON.stringify({ kind: 'List', items: objects.slice(2990, 3010) }, null, 1);
  await assert.rejects(
    parseManifestAsync(small.replace('"port": 70000', '"port": 7OOOO'), 'm.json'),
    /m\.json:\d+:\d+: must be an integer/,
  );
  assert.equal(
    (await parseManifestAsync('{kind: Service, metadata: {name: a}, spec: {ports: [{port: 80}]}}')).size,
    1,
  );
  await assert.rejects(parseManifestAsync('[1, 2]', 'm.json'), /m\.json:1:\d+: expected an object/);
});

test('a garbage file: 20 problems spelled out, the rest counted', async () => {
  const text = Array.from({ length: 100 }, (_, i) => `kind: Pod${i}\n`).join('---\n');
  await assert.rejects(parseManifestAsync(text, 'm.yaml'), (err: Error) => {
    assert.equal(err.message.match(/unknown kind/g)?.length, 20);
    assert.match(err.message, /; and 80 more problems$/);
    return true;
  });
});

/** A Service with a small alias bomb in an unknown field: ~966 K nodes and characters, under 1 M. */
function smallBomb(i: number): string {
  const lol = `"${'lol'.repeat(33)}"`;
  return `apiVersion: v1
kind: Service
metadata: {name: s${i}, namespace: default}
spec: {clusterIP: 10.96.${i >> 8}.${i & 255}, ports: [{name: http, port: 80}]}
a: &a [${Array(9).fill(lol).join(',')}]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*c,*c,*c]
`;
}

test('300 small alias bombs, each under the per-document limit, share one budget: refused at the second', async () => {
  // Before: accepted, 293 M characters of JSON kept from 356 KB (2,000 of them: 1.96 G, 2 GB of heap).
  const text = Array.from({ length: 300 }, (_, i) => smallBomb(i)).join('---\n');
  const started = performance.now();
  await assert.rejects(parseManifestAsync(text, 'm.yaml'), (err: Error) => {
    assert.ok(isProxyError(err, 'KUP_ERR_MANIFEST_INVALID'), err.stack);
    assert.match(
      err.message,
      /^invalid manifest: m\.yaml:17:\d+: aliases expand the manifest by more than 1000000 nodes and characters in all \(alias \*b adds \d+; many small alias bombs\?\)$/,
    );
    return true;
  });
  assert.ok(performance.now() - started < 2000, `${Math.round(performance.now() - started)} ms`);
  assert.equal((await parseManifestAsync(smallBomb(0), 'm.yaml')).size, 1, 'one alone is within the budget');
});

test('1,000 duplicates in a List that cannot be cut: each located without reading the List again', async () => {
  // Before: the whole List read again for every duplicate (3,000 in 790 KB: 178 s in one piece).
  let text = 'apiVersion: v1\nkind: List\nitems:\n';
  for (let i = 0; i < 1000; i++)
    text += `- apiVersion: v1
  kind: Service
  metadata:
    name: dup
    namespace: default
    labels: ${i === 0 ? '&l {app: web, tier: frontend, team: payments}' : '*l'}
  spec:
    clusterIP: 10.96.${i >> 8}.${i & 255}
    ports:
    - {name: http, port: 80, targetPort: 8080}
`;
  const started = performance.now();
  await assert.rejects(parseManifestAsync(text, 'm.yaml'), (err: Error) => {
    assert.match(
      err.message,
      /^invalid manifest: m\.yaml:14:3: duplicate Service default\/dup; m\.yaml:24:3: /,
    );
    assert.equal(err.message.match(/duplicate Service/g)?.length, 20);
    assert.match(err.message, /; and 979 more problems$/);
    return true;
  });
  assert.ok(performance.now() - started < 3000, `${Math.round(performance.now() - started)} ms`);
});

test('a List of 5,000 Services sharing three anchors (15,000 aliases) loads', async () => {
  // Before: "more than 10000 aliases in one document".
  let text = 'apiVersion: v1\nkind: List\nitems:\n';
  for (let i = 0; i < 5000; i++) {
    const first = i === 0;
    text += `- apiVersion: v1
  kind: Service
  metadata:
    name: svc-${i}
    namespace: default
    labels: ${first ? '&labels {app: web, tier: frontend}' : '*labels'}
  spec:
    clusterIP: 10.96.${i >> 8}.${i & 255}
    selector: ${first ? '&selector {app: web}' : '*selector'}
    ports: ${first ? '&ports [{name: http, port: 80, targetPort: 8080}]' : '*ports'}
`;
  }
  const objects = await parseManifestAsync(text, 'm.yaml');
  assert.equal(objects.size, 5000);
  assert.deepEqual(
    (objects.get('Service/default/svc-4999')?.object as { spec?: unknown } | undefined)?.spec,
    {
      clusterIP: '10.96.19.135',
      selector: { app: 'web' },
      ports: [{ name: 'http', port: 80, targetPort: 8080 }],
    },
  );
});

test('a flow-style YAML List over 1 MiB (keys without quotes) is read as YAML; broken JSON stays JSON', async () => {
  // Before: "expected a string (a key)" (a text over 1 MiB starting with `{` was read as JSON only).
  const items = Array.from(
    { length: 8000 },
    (_, i) =>
      `{apiVersion: v1, kind: Service, metadata: {name: svc-${i}, namespace: default}, spec: {clusterIP: 10.96.${i >> 8}.${i & 255}, ports: [{name: http, port: 80, targetPort: 8080}]}}`,
  );
  const text = `{apiVersion: v1, kind: List, items: [\n${items.join(',\n')}\n]}\n`;
  assert.ok(text.length > 1024 * 1024, `${text.length} bytes`);
  assert.equal((await parseManifestAsync(text, 'm.yaml')).size, 8000);
  // A big JSON text cut short is broken either way: its JSON error, not a long YAML parse.
  const json = JSON.stringify({
    kind: 'List',
    items: items.map((_, i) => service(`s${i}`, '10.96.0.1', [])),
  });
  assert.ok(json.length > 1024 * 1024);
  await assert.rejects(
    parseManifestAsync(json.slice(0, -2), 'm.json'),
    /m\.json:1:\d+: unexpected end of the text$/,
  );
});
