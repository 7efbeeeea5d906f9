import assert from 'node:assert/strict';
import { test } from 'node:test';
import { deserialize, serialize } from 'node:v8';
import type { ServicePortEndpoints } from '../../../src/state/endpoint.ts';
import type { TableMessage } from '../../../src/workers/messages.ts';
import { TableReviver } from '../../../src/workers/revive.ts';
import { ep } from '../../helpers/endpoints.ts';
import { collectGarbage } from '../../helpers/heap.ts';
import { portal } from '../../helpers/portals.ts';

/** `n` service ports with two endpoints each (one local), as the main process sends them. */
function table(n: number): TableMessage {
  const servicePorts = [];
  const endpoints = [];
  for (let i = 0; i < n; i++) {
    const sp = portal('default', `svc-${i}`, 'http', {
      clusterIPs: [`10.96.${i >> 8}.${i & 255}`],
      externalPolicyLocal: true,
      externallyAccessible: true,
      nodePort: 30000 + (i % 2000),
    }).servicePort;
    const a = ep(`10.244.${i >> 8}.${i & 255}`, 8080);
    const b = ep(`10.245.${i >> 8}.${i & 255}`, 8080, { isLocal: true, nodeName: 'node-1' });
    const all = [a, b];
    const eps: ServicePortEndpoints = {
      all,
      cluster: all,
      local: [b],
      hasAnyEndpoints: true,
      localReadyCount: 1,
    };
    servicePorts.push([sp.key, sp] as const);
    endpoints.push([sp.key, eps] as const);
  }
  return {
    t: 'table',
    full: true,
    servicePorts,
    endpoints,
    ports: servicePorts.map(([k], i) => [k, 40000 + i]),
  };
}

/** Over the IPC channel (serialization: 'advanced'). */
const overChannel = (t: TableMessage) => deserialize(serialize(t)) as TableMessage;

test('a revived table equals what was sent; what was one object is one object again', () => {
  const sent = table(3);
  const got = new TableReviver().revive(overChannel(sent));
  assert.deepEqual(got, sent);
  const eps = got.endpoints[1]![1]!;
  assert.equal(eps.cluster, eps.all, 'one list, as sent');
  assert.equal(eps.local[0], eps.all[1], 'one endpoint in both lists');
  assert.deepEqual(
    new TableReviver().revive(
      overChannel({ ...sent, servicePorts: [[sent.servicePorts[0]![0], null]], endpoints: [] }),
    ).servicePorts,
    [[sent.servicePorts[0]![0], null]],
  );
});

test('a revived table holds less than the clone it came as (properties in line, shared strings)', async () => {
  const n = 2000;
  const bytes = async (make: () => unknown) => {
    await collectGarbage();
    const before = process.memoryUsage().heapUsed;
    const kept = make();
    await collectGarbage();
    const used = process.memoryUsage().heapUsed - before;
    assert.ok(kept);
    return used;
  };
  const wire = serialize(table(n));
  const reviver = new TableReviver();
  // The median of three: what the rest of the process frees meanwhile counts against one reading.
  const median = async (make: () => unknown) => {
    const readings = [await bytes(make), await bytes(make), await bytes(make)];
    return readings.sort((x, y) => x - y)[1]!;
  };
  const cloned = await median(() => deserialize(wire));
  const revived = await median(() => reviver.revive(deserialize(wire) as TableMessage));
  assert.ok(revived < 0.85 * cloned, `revived ${revived} bytes, cloned ${cloned}`);
});
