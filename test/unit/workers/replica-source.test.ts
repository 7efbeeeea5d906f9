import assert from 'node:assert/strict';
import { readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { writeHeapSnapshot } from 'node:v8';
import type { ServicePortEndpoints } from '../../../src/state/endpoint.ts';
import type { ServicePortKey } from '../../../src/state/service-port.ts';
import { ReplicaSource, servicePortKeyOf } from '../../../src/workers/replica-source.ts';
import { ep } from '../../helpers/endpoints.ts';
import { portal } from '../../helpers/portals.ts';

const web = portal('default', 'web', 'http').servicePort;
const dns = portal('default', 'dns', 'dns', { protocol: 'UDP' }).servicePort;
const eps = (ip: string): ServicePortEndpoints => ({ cluster: [ep(ip, 8080)], local: [] }) as never;
const keys = (s: ReadonlySet<ServicePortKey>) => [...s].sort();

test('servicePortKeyOf: the service port of every listener key', () => {
  assert.equal(servicePortKeyOf('ns/web:http/TCP'), 'ns/web:http/TCP');
  assert.equal(servicePortKeyOf('ns/web:http/TCP/local'), 'ns/web:http/TCP');
  assert.equal(servicePortKeyOf('ns/web:http/TCP/to/203.0.113.7/local'), 'ns/web:http/TCP');
  assert.equal(servicePortKeyOf('ns/web:/TCP/to/fd00::1'), 'ns/web:/TCP');
});

test('only service ports the main process runs (a port for them) are shown; deltas apply in order', () => {
  const r = new ReplicaSource();
  assert.equal(r.isInitialized, false);
  r.apply({
    t: 'table',
    full: true,
    servicePorts: [
      [web.key, web],
      [dns.key, dns],
    ],
    endpoints: [[web.key, eps('10.244.0.10')]],
    ports: [[web.key, 40000]],
  });
  assert.equal(r.isInitialized, true);
  let s = r.checkout();
  assert.deepEqual([...s.servicePorts.keys()], [web.key], 'dns has no port from the main process');
  assert.deepEqual(keys(s.changedServicePorts), [dns.key, web.key].sort());
  assert.equal(r.pending, false);
  // The main process opened dns: its port arrives (a delta names only what changed).
  r.apply({ t: 'table', full: false, servicePorts: [], endpoints: [], ports: [[dns.key, 40001]] });
  s = r.checkout();
  assert.deepEqual([...s.servicePorts.keys()].sort(), [dns.key, web.key].sort());
  assert.deepEqual(keys(s.changedServicePorts), [dns.key]);
  // An endpoint change alone: the fast path.
  r.apply({ t: 'table', full: false, servicePorts: [], endpoints: [[web.key, eps('10.244.0.11')]] });
  assert.equal(r.onlyEndpointsPending, true);
  s = r.checkout();
  assert.deepEqual(keys(s.changedEndpoints), [web.key]);
  assert.equal(s.endpoints.get(web.key)?.cluster[0]?.ip, '10.244.0.11');
  // Removed.
  r.apply({
    t: 'table',
    full: false,
    servicePorts: [[dns.key, null]],
    endpoints: [],
    ports: [[dns.key, null]],
  });
  s = r.checkout();
  assert.deepEqual([...s.servicePorts.keys()], [web.key]);
  assert.deepEqual([...r.ports], [[web.key, 40000]]);
});

test('a delta of one proxy port among many touches that service port only', () => {
  const r = new ReplicaSource();
  const many = Array.from({ length: 100 }, (_, i) => portal('default', `s${i}`, 'http').servicePort);
  r.apply({
    t: 'table',
    full: true,
    servicePorts: many.map((sp) => [sp.key, sp] as const),
    endpoints: [],
    ports: many.map((sp, i) => [sp.key, 40000 + i] as const),
  });
  r.checkout();
  r.apply({
    t: 'table',
    full: false,
    servicePorts: [[web.key, web]],
    endpoints: [],
    ports: [[web.key, 41000]],
  });
  const s = r.checkout();
  assert.deepEqual(keys(s.changedServicePorts), [web.key]);
  assert.equal(s.servicePorts.size, 101);
  assert.equal(r.ports.size, 101);
  // The same table again as a full one (a restarted worker's): nothing moved, nothing reopens.
  r.apply({
    t: 'table',
    full: true,
    servicePorts: [...many, web].map((sp) => [sp.key, sp] as const),
    endpoints: [],
    ports: [...many.map((sp, i) => [sp.key, 40000 + i] as const), [web.key, 41000] as const],
  });
  assert.equal(r.checkout().servicePorts.size, 101);
  assert.equal(r.pending, false, 'no service port reopens');
});

test('a service port whose port moved is closed in one checkout and opened on the new port in the next', () => {
  const r = new ReplicaSource();
  r.apply({
    t: 'table',
    full: true,
    servicePorts: [[web.key, web]],
    endpoints: [],
    ports: [[web.key, 40000]],
  });
  r.checkout();
  r.apply({ t: 'table', full: false, servicePorts: [], endpoints: [], ports: [[web.key, 40005]] });
  let s = r.checkout();
  assert.equal(s.servicePorts.has(web.key), false, 'closed first');
  assert.deepEqual(keys(s.changedServicePorts), [web.key]);
  assert.equal(r.pending, true);
  s = r.checkout();
  assert.equal(s.servicePorts.has(web.key), true);
  assert.equal(r.ports.get(web.key), 40005);
  // A second listener's port moving (`/local`) reopens the service port too.
  r.apply({ t: 'table', full: false, servicePorts: [], endpoints: [], ports: [[`${web.key}/local`, 40006]] });
  s = r.checkout();
  assert.equal(s.servicePorts.has(web.key), false);
  assert.equal(r.checkout().servicePorts.has(web.key), true);
});

test('a full table replaces what was there (a worker that restarted, or a reset)', () => {
  const r = new ReplicaSource();
  r.apply({
    t: 'table',
    full: true,
    servicePorts: [[web.key, web]],
    endpoints: [],
    ports: [[web.key, 40000]],
  });
  r.checkout();
  r.apply({
    t: 'table',
    full: true,
    servicePorts: [[dns.key, dns]],
    endpoints: [],
    ports: [[dns.key, 40001]],
  });
  const s = r.checkout();
  assert.deepEqual([...s.servicePorts.keys()], [dns.key]);
  assert.deepEqual(keys(s.changedServicePorts), [dns.key, web.key].sort());
});

/** How many strings with exactly this text are alive (a heap snapshot of this process). */
function copiesOf(text: string): number {
  const file = writeHeapSnapshot(join(tmpdir(), `replica-${process.pid}.heapsnapshot`));
  const snapshot = JSON.parse(readFileSync(file, 'utf8'));
  rmSync(file);
  const { node_fields: fields, node_types: types } = snapshot.snapshot.meta;
  const typeAt = fields.indexOf('type');
  const nameAt = fields.indexOf('name');
  const stringType = types[0].indexOf('string');
  let n = 0;
  for (let i = 0; i < snapshot.nodes.length; i += fields.length)
    if (snapshot.nodes[i + typeAt] === stringType && snapshot.strings[snapshot.nodes[i + nameAt]] === text)
      n++;
  return n;
}

test('endpoints and ports that came before their service port end up keyed by its own key string', () => {
  const r = new ReplicaSource();
  const name = `web-${Math.random().toString(36).slice(2)}`;
  const sp = portal('default', name, 'http').servicePort;
  // As the channel delivers them: each message a copy of its own (the endpoints first, as the main
  // process sends them when its balancers have them, then the sync's service ports and ports).
  r.apply(structuredClone({ t: 'table', full: true, servicePorts: [], endpoints: [], ports: [] }));
  r.apply(
    structuredClone({ t: 'table', full: false, servicePorts: [], endpoints: [[sp.key, eps('10.244.0.10')]] }),
  );
  r.apply(
    structuredClone({
      t: 'table',
      full: false,
      servicePorts: [[sp.key, sp]],
      endpoints: [],
      ports: [[sp.key, 40000]],
    }),
  );
  assert.equal(r.checkout().endpoints.get(sp.key)?.cluster[0]?.ip, '10.244.0.10');
  assert.equal(r.ports.get(sp.key), 40000);
  r.checkout(); // the last checkout's change sets (what this test is not about) are let go
  // This test's own `sp` and the replica's service port: two. Before: the endpoints' and the port's copies too.
  assert.equal(copiesOf(sp.key), 2);
});
