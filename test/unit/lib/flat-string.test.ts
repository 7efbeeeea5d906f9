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
  const n = 5000;
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
  const template = await bytes((i) => {
    const name = `${ns}/service-${i}:http`;
    return `${name}/TCP`;
  });
  const written = await bytes((i) => servicePortKey(servicePortName(ns, `service-${i}`, 'http'), 'TCP'));
  assert.ok(written < 0.6 * template, `flat: ${written} bytes, template literal: ${template}`);
});
