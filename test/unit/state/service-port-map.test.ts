// ServicePortMap: kept a Service at a time, read as a map of service port key → ServicePort.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { serviceKey } from '../../../src/state/endpoint-slice-cache.ts';
import type { ServicePort, ServicePortKey } from '../../../src/state/service-port.ts';
import { ServicePortMap, serviceKeyOf } from '../../../src/state/service-port-map.ts';
import { portal } from '../../helpers/portals.ts';

const sp = (service: string, port: string, protocol: 'TCP' | 'UDP' = 'TCP'): ServicePort =>
  portal('ns', service, port, { protocol }).servicePort;

const web = [sp('web', 'http'), sp('web', 'dns', 'UDP')];
const webApi = [sp('web-api', 'http')];
const api = [sp('api', '')];

const cases: { name: string; set: [string, ServicePort[]][]; want: ServicePort[] }[] = [
  { name: 'nothing set', set: [], want: [] },
  { name: 'one Service of two ports', set: [['web', web]], want: web },
  {
    name: 'Services whose names start alike, an unnamed port',
    set: [
      ['web', web],
      ['web-api', webApi],
      ['api', api],
    ],
    want: [...web, ...webApi, ...api],
  },
  {
    name: 'a Service loses a port, another all of them',
    set: [
      ['web', web],
      ['api', api],
      ['web', [web[1]!]],
      ['api', []],
    ],
    want: [web[1]!],
  },
];

for (const c of cases)
  test(`ServicePortMap: ${c.name}`, () => {
    const map = new ServicePortMap();
    for (const [name, ports] of c.set) map.setPorts(serviceKey('ns', name), ports);
    assert.equal(map.size, c.want.length);
    assert.deepEqual(
      [...map],
      c.want.map((p) => [p.key, p]),
    );
    assert.deepEqual(
      [...map.keys()],
      c.want.map((p) => p.key),
    );
    assert.deepEqual([...map.values()], c.want);
    const seen: ServicePortKey[] = [];
    map.forEach((p, key, self) => {
      assert.equal(p.key, key);
      assert.equal(self, map);
      seen.push(key);
    });
    assert.deepEqual(
      seen,
      c.want.map((p) => p.key),
    );
    for (const p of [...web, ...webApi, ...api]) {
      const held = c.want.includes(p);
      assert.equal(map.get(p.key), held ? p : undefined, p.key);
      assert.equal(map.has(p.key), held, p.key);
    }
    assert.equal(map.get('ns/web:grpc/TCP' as ServicePortKey), undefined, 'a port its Service has not');
  });

test('serviceKeyOf: the Service of a service port key', () => {
  assert.equal(serviceKeyOf(web[0]!.key), serviceKey('ns', 'web'));
  assert.equal(serviceKeyOf(api[0]!.key), serviceKey('ns', 'api'));
});
