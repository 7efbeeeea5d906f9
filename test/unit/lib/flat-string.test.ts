import assert from 'node:assert/strict';
import { test } from 'node:test';
import { flat } from '../../../src/lib/flat-string.ts';
import { servicePortKey, servicePortName } from '../../../src/state/service-port.ts';
import { collectGarbage } from '../../helpers/heap.ts';

test('flat writes what a template literal writes', () => {
  assert.equal(flat('ns', '/', 'web', ':', 'http'), 'ns/web:http');
  assert.equal(flat('10.0.0.1', ':', 8080), '10.0.0.1:8080');
  assert.equal(flat(), '');
  assert.equal(servicePortKey(servicePortName('ns', 'web', ''), 'UDP'), 'ns/web:/UDP');
});

test('service port keys written flat hold well under what template literals hold', async () => {
  // Enough keys that what they hold (~4 MB apart) dwarfs what else the heap does meanwhile.
  const n = 50_000;
  // The namespace as a parsed object holds it: not a constant of this file.
  const ns = (JSON.parse('{"ns":"a-namespace"}') as { ns: string }).ns;
  const bytes = async (make: (i: number) => string) => {
    await collectGarbage();
    const before = process.memoryUsage().heapUsed;
    const kept = Array.from({ length: n }, (_, i) => make(i));
    // Kept a while (old enough to be moved out of the young generation), then used as map keys.
    await collectGarbage();
    const keys = new Set(kept);
    await collectGarbage();
    const used = process.memoryUsage().heapUsed - before;
    assert.equal(keys.size, n);
    return used;
  };
  const templateKey = (i: number) => {
    const name = `${ns}/service-${i}:http`;
    return `${name}/TCP`;
  };
  const flatKey = (i: number) => servicePortKey(servicePortName(ns, `service-${i}`, 'http'), 'TCP');
  // A first round warms up what the loops allocate once; then three each, alternating, medians.
  await bytes(templateKey);
  await bytes(flatKey);
  const median = (xs: number[]) => xs.sort((a, b) => a - b)[1]!;
  const templates: number[] = [];
  const flats: number[] = [];
  for (let round = 0; round < 3; round++) {
    templates.push(await bytes(templateKey));
    flats.push(await bytes(flatKey));
  }
  const template = median(templates);
  const written = median(flats);
  assert.ok(written < 0.6 * template, `flat: ${written} bytes, template literal: ${template}`);
});
