// The js-yaml fast path with its per-document cache gives exactly what the located `yaml` path gives,
// reuses unchanged documents on reload, and leaves problems to the located path.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parseManifest, parseManifestAsync } from '../../../src/source/manifest-parse.ts';
import { service, slice, toYaml } from '../../helpers/manifests.ts';

const docs = (n: number, changed = -1) =>
  toYaml(
    Array.from({ length: n }, (_, i) => [
      service(`svc-${i}`, `10.96.0.${i + 1}`, [{ name: 'http', port: 80, targetPort: 8080 }]),
      slice(
        `svc-${i}`,
        `svc-${i}-a`,
        [{ ip: `10.244.0.${i === changed ? 200 : i + 1}` }],
        [{ name: 'http', port: 8080 }],
      ),
    ]).flat(),
  );

test('fast path equals the located path, and a reload reuses unchanged documents', async () => {
  const cache = new Map();
  const first = await parseManifestAsync(docs(50), 'm', 10, cache);
  const slow = parseManifest(docs(50), 'm');
  assert.deepEqual([...first.keys()], [...slow.keys()]);
  for (const [k, e] of first) assert.equal(e.json, slow.get(k)!.json);
  assert.equal(cache.size, 100);
  const second = await parseManifestAsync(docs(50, 7), 'm', 10, cache);
  let reused = 0;
  for (const [k, e] of second) if (e === first.get(k)) reused++;
  assert.equal(reused, 99, 'only the changed document was parsed again');
  assert.match(second.get('EndpointSlice/default/svc-7-a')!.json, /10\.244\.0\.200/);
});

test('a problem in one document is reported with its location by the located path', async () => {
  const cache = new Map();
  await parseManifestAsync(docs(3), 'm', 10, cache);
  const broken = `${docs(3)}---\napiVersion: v1\nkind: Service\nmetadata: {name: bad, namespace: default}\nspec:\n  clusterIP: 10.96.9.9\n  ports:\n    - port: 70000\n`;
  await assert.rejects(parseManifestAsync(broken, 'm', 10, cache), /m:\d+:\d+: must be between 1 and 65535/);
  // The cache still holds the last good documents.
  assert.equal(cache.size, 6);
});

test('duplicate documents and directives go to the located path', async () => {
  const one = toYaml([service('a', '10.96.0.1', [{ name: 'http', port: 80, targetPort: 80 }])]);
  await assert.rejects(parseManifestAsync(`${one}---\n${one}`, 'm'), /duplicate Service/);
  const directive = `%YAML 1.2\n---\n${one}`;
  assert.equal((await parseManifestAsync(directive, 'm')).size, 1);
});
