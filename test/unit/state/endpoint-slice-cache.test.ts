import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { EndpointSlice, EndpointSliceEndpoint, EndpointSlicePort } from '../../../src/source/objects.ts';
import { EndpointSliceCache, serviceKey, sliceServiceKey } from '../../../src/state/endpoint-slice-cache.ts';
import type { ServicePortKey } from '../../../src/state/service-port.ts';
import { usedHeap } from '../../helpers/heap.ts';

const NODE = 'node-a';
const WEB = serviceKey('ns', 'web');
const HTTP = 'ns/web:http/TCP' as ServicePortKey;

type EpOpts = {
  ready?: boolean;
  serving?: boolean;
  terminating?: boolean;
  node?: string;
  zones?: string[];
  forNodes?: string[];
};

function ep(ip: string, o: EpOpts = {}): EndpointSliceEndpoint {
  const conditions: EndpointSliceEndpoint['conditions'] = {};
  if (o.ready !== undefined) conditions.ready = o.ready;
  if (o.serving !== undefined) conditions.serving = o.serving;
  if (o.terminating !== undefined) conditions.terminating = o.terminating;
  return {
    addresses: [ip],
    conditions,
    ...(o.node === undefined ? {} : { nodeName: o.node }),
    ...(o.zones === undefined && o.forNodes === undefined
      ? {}
      : {
          hints: {
            ...(o.zones === undefined ? {} : { forZones: o.zones.map((name) => ({ name })) }),
            ...(o.forNodes === undefined ? {} : { forNodes: o.forNodes.map((name) => ({ name })) }),
          },
        }),
  };
}

function slice(
  name: string,
  endpoints: EndpointSliceEndpoint[],
  o: { ports?: EndpointSlicePort[]; addressType?: string; service?: string | null } = {},
): EndpointSlice {
  const labels: Record<string, string> = {};
  if (o.service !== null) labels['kubernetes.io/service-name'] = o.service ?? 'web';
  return {
    metadata: { namespace: 'ns', name, labels },
    addressType: o.addressType ?? 'IPv4',
    endpoints,
    ports: o.ports ?? [{ name: 'http', protocol: 'TCP', port: 8080 }],
  };
}

/** What a delete of a slice may carry: its namespace and name only. */
function named(name: string): EndpointSlice {
  return { metadata: { namespace: 'ns', name } };
}

// `ip:port` keys per service port key, optionally with a flag summary per endpoint.
function keys(cache: EndpointSliceCache, service = WEB): Record<string, string[]> {
  const out: Record<string, string[]> = {};
  for (const [k, eps] of cache.endpoints(service)) out[k] = eps.map((e) => e.key);
  return out;
}

function flags(cache: EndpointSliceCache, key = HTTP): string[] {
  return (cache.endpoints(WEB).get(key) ?? []).map(
    (e) =>
      `${e.key} ${e.ready ? 'R' : '-'}${e.serving ? 'S' : '-'}${e.terminating ? 'T' : '-'}${e.isLocal ? 'L' : '-'}`,
  );
}

type Step = { do: 'update' | 'delete'; slice: EndpointSlice; changed: string[] };
type Case = { name: string; steps: Step[]; want: Record<string, string[]> };

const cases: Case[] = [
  {
    name: 'endpoints of several slices are merged and sorted',
    steps: [
      { do: 'update', slice: slice('web-a', [ep('10.0.0.3'), ep('10.0.0.1')]), changed: ['ns/web'] },
      { do: 'update', slice: slice('web-b', [ep('10.0.0.2'), ep('10.0.0.10')]), changed: ['ns/web'] },
    ],
    want: { [HTTP]: ['10.0.0.10:8080', '10.0.0.1:8080', '10.0.0.2:8080', '10.0.0.3:8080'] },
  },
  {
    name: 'an update replaces only that slice',
    steps: [
      { do: 'update', slice: slice('web-a', [ep('10.0.0.1')]), changed: ['ns/web'] },
      { do: 'update', slice: slice('web-b', [ep('10.0.0.2')]), changed: ['ns/web'] },
      { do: 'update', slice: slice('web-a', [ep('10.0.0.3')]), changed: ['ns/web'] },
    ],
    want: { [HTTP]: ['10.0.0.2:8080', '10.0.0.3:8080'] },
  },
  {
    name: 'endpoint moving between slices: added to the new one before removed from the old',
    steps: [
      { do: 'update', slice: slice('web-a', [ep('10.0.0.1'), ep('10.0.0.2')]), changed: ['ns/web'] },
      { do: 'update', slice: slice('web-b', [ep('10.0.0.2')]), changed: ['ns/web'] },
      { do: 'update', slice: slice('web-a', [ep('10.0.0.1')]), changed: ['ns/web'] },
    ],
    want: { [HTTP]: ['10.0.0.1:8080', '10.0.0.2:8080'] },
  },
  {
    name: 'endpoint moving between slices: removed from the old one first',
    steps: [
      { do: 'update', slice: slice('web-a', [ep('10.0.0.1'), ep('10.0.0.2')]), changed: ['ns/web'] },
      { do: 'update', slice: slice('web-a', [ep('10.0.0.1')]), changed: ['ns/web'] },
      { do: 'update', slice: slice('web-b', [ep('10.0.0.2')]), changed: ['ns/web'] },
    ],
    want: { [HTTP]: ['10.0.0.1:8080', '10.0.0.2:8080'] },
  },
  {
    name: 'deleting a slice removes only its endpoints; deleting an unknown one is a no-op',
    steps: [
      { do: 'update', slice: slice('web-a', [ep('10.0.0.1')]), changed: ['ns/web'] },
      { do: 'update', slice: slice('web-b', [ep('10.0.0.2')]), changed: ['ns/web'] },
      { do: 'delete', slice: slice('web-a', []), changed: ['ns/web'] },
      { do: 'delete', slice: slice('web-zzz', []), changed: [] },
    ],
    want: { [HTTP]: ['10.0.0.2:8080'] },
  },
  {
    name: 'an identical update is not a change',
    steps: [
      { do: 'update', slice: slice('web-a', [ep('10.0.0.1', { node: NODE })]), changed: ['ns/web'] },
      { do: 'update', slice: slice('web-a', [ep('10.0.0.1', { node: NODE })]), changed: [] },
    ],
    want: { [HTTP]: ['10.0.0.1:8080'] },
  },
  {
    name: 'ports: missing name and missing or zero port are skipped, "" is the unnamed port',
    steps: [
      {
        do: 'update',
        slice: slice('web-a', [ep('10.0.0.1')], {
          ports: [
            { protocol: 'TCP', port: 1 },
            { name: 'zero', port: 0 },
            { name: 'none' },
            { name: '', port: 9090 },
            { name: 'dns', protocol: 'UDP', port: 53 },
            { name: 'sctp', protocol: 'SCTP', port: 7 },
          ],
        }),
        changed: ['ns/web'],
      },
    ],
    want: { 'ns/web:/TCP': ['10.0.0.1:9090'], 'ns/web:dns/UDP': ['10.0.0.1:53'] },
  },
  {
    name: 'only the first address is used; a bad first address drops the endpoint',
    steps: [
      {
        do: 'update',
        slice: slice('web-a', [
          { addresses: ['10.0.0.1', '10.0.0.9'] },
          { addresses: ['10.0.0.999', '10.0.0.8'] },
          { addresses: [] },
          {},
        ]),
        changed: ['ns/web'],
      },
    ],
    want: { [HTTP]: ['10.0.0.1:8080'] },
  },
  {
    name: 'IPv6 slice: canonical, bracketed keys; IPv4 addresses in it dropped',
    steps: [
      {
        do: 'update',
        slice: slice('web-v6', [ep('FD00::0002'), ep('fd00::1'), ep('10.0.0.1')], { addressType: 'IPv6' }),
        changed: ['ns/web'],
      },
    ],
    want: { [HTTP]: ['[fd00::1]:8080', '[fd00::2]:8080'] },
  },
  {
    name: 'FQDN slice is ignored',
    steps: [
      {
        do: 'update',
        slice: slice('web-f', [{ addresses: ['a.example'] }], { addressType: 'FQDN' }),
        changed: [],
      },
    ],
    want: {},
  },
  {
    name: 'slice without the service-name label is ignored',
    steps: [{ do: 'update', slice: slice('web-x', [ep('10.0.0.1')], { service: null }), changed: [] }],
    want: {},
  },
  {
    name: 'a slice losing its label is removed',
    steps: [
      { do: 'update', slice: slice('web-a', [ep('10.0.0.1')]), changed: ['ns/web'] },
      { do: 'update', slice: slice('web-a', [ep('10.0.0.1')], { service: null }), changed: ['ns/web'] },
    ],
    want: {},
  },
  {
    name: 'a slice moving to another service changes both',
    steps: [
      { do: 'update', slice: slice('web-a', [ep('10.0.0.1')]), changed: ['ns/web'] },
      {
        do: 'update',
        slice: slice('web-a', [ep('10.0.0.1')], { service: 'api' }),
        changed: ['ns/web', 'ns/api'],
      },
    ],
    want: {},
  },
  {
    name: 'a slice not named after its Service (no controller wrote it) is deleted by its name alone',
    steps: [
      { do: 'update', slice: slice('custom', [ep('10.0.0.1')]), changed: ['ns/web'] },
      { do: 'update', slice: slice('web-a', [ep('10.0.0.2')]), changed: ['ns/web'] },
      { do: 'delete', slice: named('custom'), changed: ['ns/web'] },
      { do: 'delete', slice: named('custom'), changed: [] },
    ],
    want: { [HTTP]: ['10.0.0.2:8080'] },
  },
  {
    name: 'dashes in Service names: each slice is found under its own Service, named after it or not',
    steps: [
      {
        do: 'update',
        slice: slice('web-api-1', [ep('10.0.0.1')], { service: 'web-api' }),
        changed: ['ns/web-api'],
      },
      { do: 'update', slice: slice('web-api-2', [ep('10.0.0.2')]), changed: ['ns/web'] },
      {
        do: 'update',
        slice: slice('web-1', [ep('10.0.0.3')], { service: 'web-api' }),
        changed: ['ns/web-api'],
      },
      { do: 'update', slice: slice('web-api-2', [ep('10.0.0.4')]), changed: ['ns/web'] },
      { do: 'delete', slice: named('web-api-1'), changed: ['ns/web-api'] },
      { do: 'delete', slice: named('web-1'), changed: ['ns/web-api'] },
      {
        do: 'update',
        slice: slice('web-api-2', [ep('10.0.0.4')], { service: 'web-api' }),
        changed: ['ns/web', 'ns/web-api'],
      },
      { do: 'update', slice: slice('web-b', [ep('10.0.0.5')]), changed: ['ns/web'] },
      { do: 'delete', slice: named('web-api-2'), changed: ['ns/web-api'] },
    ],
    want: { [HTTP]: ['10.0.0.5:8080'] },
  },
];

for (const c of cases) {
  test(c.name, () => {
    const cache = new EndpointSliceCache(NODE);
    for (const [i, step] of c.steps.entries()) {
      const changed = step.do === 'update' ? cache.update(step.slice) : cache.delete(step.slice);
      assert.deepEqual(changed, step.changed, `step ${i}`);
    }
    assert.deepEqual(keys(cache), c.want);
  });
}

// ready is trusted as kube-proxy trusts it: the slice controller publishes terminating endpoints of a
// Service with publishNotReadyAddresses as ready:true, terminating:true, and they must keep their traffic.
test('conditions: ready nil→true, serving nil→true, terminating nil→false; ready+terminating stays ready', () => {
  const cache = new EndpointSliceCache(NODE);
  cache.update(
    slice('web-a', [
      ep('10.0.0.1'),
      ep('10.0.0.2', { ready: false }),
      ep('10.0.0.3', { ready: false, serving: true, terminating: true }),
      ep('10.0.0.4', { ready: false, serving: false, terminating: true }),
      ep('10.0.0.5', { ready: true, terminating: true }),
      ep('10.0.0.6', { node: NODE }),
      ep('10.0.0.7', { node: 'node-b' }),
    ]),
  );
  assert.deepEqual(flags(cache), [
    '10.0.0.1:8080 RS--',
    '10.0.0.2:8080 -S--',
    '10.0.0.3:8080 -ST-',
    '10.0.0.4:8080 --T-',
    '10.0.0.5:8080 RST-',
    '10.0.0.6:8080 RS-L',
    '10.0.0.7:8080 RS--',
  ]);
});

test('node hints (hints.forNodes) are read, and a change of them is a change', () => {
  const cache = new EndpointSliceCache(NODE);
  cache.update(slice('web-a', [ep('10.0.0.1', { forNodes: [NODE] }), ep('10.0.0.2', { zones: ['z1'] })]));
  const got = cache.endpoints(WEB).get(HTTP)!;
  assert.deepEqual(
    got.map((e) => [e.key, e.nodeHints, e.zoneHints]),
    [
      ['10.0.0.1:8080', [NODE], undefined],
      ['10.0.0.2:8080', undefined, ['z1']],
    ],
  );
  assert.deepEqual(
    cache.update(
      slice('web-a', [ep('10.0.0.1', { forNodes: ['node-b'] }), ep('10.0.0.2', { zones: ['z1'] })]),
    ),
    [WEB],
  );
});

test('duplicate across slices: first kept unless a later one is not terminating', () => {
  const cache = new EndpointSliceCache(NODE);
  // Slices are merged in name order: a, b, c.
  cache.update(
    slice('web-a', [ep('10.0.0.1', { ready: false, terminating: true }), ep('10.0.0.2', { node: NODE })]),
  );
  cache.update(
    slice('web-b', [ep('10.0.0.1', { node: NODE }), ep('10.0.0.2', { ready: false, terminating: true })]),
  );
  cache.update(slice('web-c', [ep('10.0.0.2', { ready: false, terminating: true, node: 'node-c' })]));
  assert.deepEqual(flags(cache), ['10.0.0.1:8080 RS-L', '10.0.0.2:8080 RS-L']);
});

test('zone hints and node name are carried on the endpoint', () => {
  const cache = new EndpointSliceCache(NODE);
  cache.update(slice('web-a', [ep('10.0.0.1', { zones: ['z1', 'z2'], node: 'node-b' }), ep('10.0.0.2')]));
  const [a, b] = cache.endpoints(WEB).get(HTTP)!;
  assert.deepEqual(a?.zoneHints, ['z1', 'z2']);
  assert.equal(a?.nodeName, 'node-b');
  assert.equal(b?.zoneHints, undefined);
  assert.equal(b?.nodeName, undefined);
});

test('sliceServiceKey ignores FQDN, unlabelled and unnamed slices', () => {
  assert.equal(sliceServiceKey(slice('web-a', [])), 'ns/web');
  assert.equal(sliceServiceKey(slice('web-a', [], { addressType: 'FQDN' })), undefined);
  assert.equal(sliceServiceKey(slice('web-a', [], { service: null })), undefined);
  assert.equal(sliceServiceKey(slice('web-a', [], { service: '' })), undefined);
  assert.equal(sliceServiceKey({ addressType: 'IPv4', metadata: { namespace: 'ns' } }), undefined);
});

test('size counts services with slices', () => {
  const cache = new EndpointSliceCache(NODE);
  cache.update(slice('web-a', [ep('10.0.0.1')]));
  cache.update(slice('api-a', [ep('10.0.0.1')], { service: 'api' }));
  assert.equal(cache.size, 2);
  cache.delete(slice('web-a', []));
  assert.equal(cache.size, 1);
  assert.deepEqual(keys(cache), {});
});

test("one slice: endpoints() hands out that slice's parsed list itself, the same objects every time", () => {
  const cache = new EndpointSliceCache(NODE);
  cache.update(slice('web-a', [ep('10.0.0.2'), ep('10.0.0.1')]));
  cache.update(slice('api-a', [ep('10.0.0.9')], { service: 'api' }));
  const first = cache.endpoints(WEB).get(HTTP);
  assert.deepEqual(
    first?.map((e) => e.key),
    ['10.0.0.1:8080', '10.0.0.2:8080'],
  );
  // Another Service's slice changes; this one's list is still the parsed one, not a new merge.
  cache.update(slice('api-a', [ep('10.0.0.8')], { service: 'api' }));
  assert.equal(cache.endpoints(WEB).get(HTTP), first);
  // Two slices: one merged list, whose endpoints are still the slices' own objects.
  cache.update(slice('web-b', [ep('10.0.0.3')]));
  const merged = cache.endpoints(WEB).get(HTTP)!;
  assert.deepEqual(
    merged.map((e) => e.key),
    ['10.0.0.1:8080', '10.0.0.2:8080', '10.0.0.3:8080'],
  );
  assert.equal(merged[0], first?.[0]);
  assert.equal(merged[1], first?.[1]);
});

// The bench's 10,000 Services share five pods: each endpoint was 112 bytes plus 64 of key and IP strings
// per Service (~0.9 KiB per service port of five endpoints).
test('an endpoint alike in the slices of several Services is one object, let go of with the last slice', () => {
  const cache = new EndpointSliceCache(NODE);
  const API = serviceKey('ns', 'api');
  const API_HTTP = 'ns/api:http/TCP' as ServicePortKey;
  cache.update(slice('web-a', [ep('10.0.0.1'), ep('10.0.0.2')]));
  cache.update(slice('api-a', [ep('10.0.0.2'), ep('10.0.0.1')], { service: 'api' }));
  const web = cache.endpoints(WEB).get(HTTP)!;
  const api = cache.endpoints(API).get(API_HTTP)!;
  assert.equal(web.length, 2);
  assert.equal(api[0], web[0]);
  assert.equal(api[1], web[1]);
  assert.equal(cache.pooledEndpoints, 2);
  // The same slice again, and a changed one: still the pooled objects.
  cache.update(slice('api-a', [ep('10.0.0.2'), ep('10.0.0.1')], { service: 'api' }));
  cache.update(slice('api-a', [ep('10.0.0.1')], { service: 'api' }));
  assert.equal(cache.endpoints(API).get(API_HTTP)![0], web[0]);
  assert.equal(cache.pooledEndpoints, 2);
  cache.delete(slice('web-a', []));
  assert.equal(cache.pooledEndpoints, 1);
  cache.delete(slice('api-a', [], { service: 'api' }));
  assert.equal(cache.pooledEndpoints, 0);
});

test('an endpoint with other conditions, node or hints in another slice stays its own', () => {
  const cache = new EndpointSliceCache(NODE);
  const API = serviceKey('ns', 'api');
  const API_HTTP = 'ns/api:http/TCP' as ServicePortKey;
  cache.update(slice('web-a', [ep('10.0.0.1'), ep('10.0.0.2', { node: NODE }), ep('10.0.0.3')]));
  cache.update(
    slice('api-a', [ep('10.0.0.1', { ready: false }), ep('10.0.0.2'), ep('10.0.0.3', { zones: ['z1'] })], {
      service: 'api',
    }),
  );
  const web = cache.endpoints(WEB).get(HTTP)!;
  const api = cache.endpoints(API).get(API_HTTP)!;
  assert.deepEqual(
    web.map((e) => [e.ready, e.isLocal, e.zoneHints]),
    [
      [true, false, undefined],
      [true, true, undefined],
      [true, false, undefined],
    ],
  );
  assert.deepEqual(
    api.map((e) => [e.ready, e.isLocal, e.zoneHints]),
    [
      [false, false, undefined],
      [true, false, undefined],
      [true, false, ['z1']],
    ],
  );
  for (let i = 0; i < 3; i++) assert.notEqual(api[i], web[i]);
  // Letting go of the other Service's variants leaves the pooled ones in place.
  cache.delete(slice('api-a', [], { service: 'api' }));
  assert.equal(cache.pooledEndpoints, 3);
  cache.update(slice('api-a', [ep('10.0.0.3')], { service: 'api' }));
  assert.equal(cache.endpoints(API).get(API_HTTP)![0], web[2]);
});

test('one slice, then three, then one again: each step merges what the Service has, in slice-name order', () => {
  const cache = new EndpointSliceCache(NODE);
  const GRPC = 'ns/web:grpc/TCP' as ServicePortKey;
  const twoPorts = {
    ports: [
      { name: 'http', protocol: 'TCP' as const, port: 8080 },
      { name: 'grpc', protocol: 'TCP' as const, port: 9090 },
    ],
  };
  assert.deepEqual(cache.update(slice('web-b', [ep('10.0.0.2')])), [WEB]);
  assert.deepEqual(keys(cache), { [HTTP]: ['10.0.0.2:8080'] });
  cache.update(slice('web-c', [ep('10.0.0.3')], twoPorts));
  cache.update(slice('web-a', [ep('10.0.0.1')]));
  assert.deepEqual(keys(cache), {
    [HTTP]: ['10.0.0.1:8080', '10.0.0.2:8080', '10.0.0.3:8080'],
    [GRPC]: ['10.0.0.3:9090'],
  });
  // The same slice again is no change; the one in the middle replaced in place.
  assert.deepEqual(cache.update(slice('web-c', [ep('10.0.0.3')], twoPorts)), []);
  cache.update(slice('web-b', [ep('10.0.0.4')]));
  assert.deepEqual(keys(cache)[HTTP], ['10.0.0.1:8080', '10.0.0.3:8080', '10.0.0.4:8080']);
  assert.deepEqual(cache.delete(slice('web-a', [])), [WEB]);
  assert.deepEqual(cache.delete(slice('web-c', [])), [WEB]);
  assert.deepEqual(keys(cache), { [HTTP]: ['10.0.0.4:8080'] });
  cache.update(slice('web-b', [ep('10.0.0.5')], twoPorts));
  assert.deepEqual(keys(cache), { [HTTP]: ['10.0.0.5:8080'], [GRPC]: ['10.0.0.5:9090'] });
  assert.deepEqual(cache.update(slice('web-b', [ep('10.0.0.5')], twoPorts)), [], 'two ports, unchanged');
  cache.update(slice('web-b', [ep('10.0.0.5')]));
  assert.deepEqual(keys(cache), { [HTTP]: ['10.0.0.5:8080'] }, 'back to one port');
  cache.delete(slice('web-b', []));
  assert.deepEqual(keys(cache), {});
  assert.equal(cache.size, 0);
  assert.equal(cache.pooledEndpoints, 0, 'every endpoint let go of');
});

test('a slice named after its Service, as the controller names them, costs no entry of its own to find its owner', async () => {
  const N = 20_000;
  const slices = Array.from({ length: N }, (_, i) => {
    const s = slice(`svc-${i}-x7k2p`, [ep(`10.${i >> 16}.${(i >> 8) & 255}.${i & 255}`)], {
      service: `svc-${i}`,
    });
    s.metadata!.namespace = 'ns';
    return s;
  });
  const cache = new EndpointSliceCache(NODE);
  const before = await usedHeap();
  for (const s of slices) cache.update(s);
  const perSlice = ((await usedHeap()) - before) / N;
  assert.equal(cache.size, N);
  // ~550 with a map from each slice's name to its Service (and a count for each endpoint of one slice).
  assert.ok(perSlice < 500, `${perSlice.toFixed(0)} bytes a slice`);
  assert.deepEqual(cache.delete(slices[7]!), [serviceKey('ns', 'svc-7')]);
});
