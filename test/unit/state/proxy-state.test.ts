import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Intake } from '../../../src/source/intake.ts';
import type { EndpointSlice, EndpointSliceEndpoint, Node, Service } from '../../../src/source/objects.ts';
import { ProxyState, triggerTime } from '../../../src/state/proxy-state.ts';
import type { ServicePortKey } from '../../../src/state/service-port.ts';
import type { Snapshot } from '../../../src/state/snapshot.ts';
import { collectGarbage, usedHeap } from '../../helpers/heap.ts';

const NODE = 'node-a';
type Spec = NonNullable<Service['spec']>;

function svc(name: string, spec: Partial<Spec> = {}, labels?: Record<string, string>): Service {
  return {
    metadata: { namespace: 'ns', name, ...(labels ? { labels } : {}) },
    spec: { clusterIP: '10.96.0.1', ports: [{ name: 'http', protocol: 'TCP', port: 80 }], ...spec },
  };
}

function slice(
  name: string,
  service: string,
  ips: (string | EndpointSliceEndpoint)[],
  o: { addressType?: string; trigger?: string; labels?: Record<string, string> } = {},
): EndpointSlice {
  return {
    metadata: {
      namespace: 'ns',
      name,
      labels: { 'kubernetes.io/service-name': service, ...o.labels },
      ...(o.trigger
        ? { annotations: { 'endpoints.kubernetes.io/last-change-trigger-time': o.trigger } }
        : {}),
    },
    addressType: o.addressType ?? 'IPv4',
    endpoints: ips.map((ip) => (typeof ip === 'string' ? { addresses: [ip] } : ip)),
    ports: [{ name: 'http', protocol: 'TCP', port: 8080 }],
  };
}

function node(zone: string | undefined, name = NODE): Node {
  return { metadata: { name, labels: zone === undefined ? {} : { 'topology.kubernetes.io/zone': zone } } };
}

const key = (name: string, port = 'http', proto = 'TCP') => `ns/${name}:${port}/${proto}` as ServicePortKey;

function setup() {
  const warnings: { msg: string; fields: Record<string, unknown> }[] = [];
  let changes = 0;
  const warn = (msg: string, fields: Record<string, unknown>) => warnings.push({ msg, fields });
  const state = new ProxyState({ nodeName: NODE, warn, onChange: () => changes++ });
  // Events reach the state as a source delivers them: through the intake.
  const intake = new Intake(state, { warn, nodeName: NODE });
  return { state, intake, warnings, changes: () => changes };
}

function eps(snap: Snapshot, k: ServicePortKey): string[] | undefined {
  return snap.endpoints.get(k)?.cluster.map((e) => e.key);
}

const sorted = (s: ReadonlySet<string>) => [...s].sort();

test('isInitialized needs both syncs; becoming initialized asks for a sync', () => {
  const { state, intake, changes } = setup();
  assert.equal(state.isInitialized, false);
  intake.onServicesSynced();
  assert.equal(state.isInitialized, false);
  assert.equal(changes(), 0);
  intake.onEndpointSlicesSynced();
  assert.equal(state.isInitialized, true);
  assert.equal(changes(), 1);
  intake.onServicesSynced();
  assert.equal(changes(), 1);
});

test('services and slices become service ports and endpoints, with changed sets', () => {
  const { state, intake, changes } = setup();
  intake.onServiceAdd(svc('web'));
  intake.onServiceAdd(svc('api', { clusterIP: '10.96.0.2' }));
  intake.onEndpointSliceAdd(slice('web-a', 'web', ['10.0.0.1']));
  intake.onEndpointSliceAdd(slice('web-b', 'web', ['10.0.0.2']));
  assert.equal(changes(), 4);
  assert.equal(state.pendingServiceChanges, 2);
  assert.equal(state.pendingEndpointChanges, 2);

  const s1 = state.checkout();
  assert.deepEqual([...s1.servicePorts.keys()].sort(), [key('api'), key('web')]);
  assert.equal(s1.servicePorts.get(key('web'))?.clusterIPs[0], '10.96.0.1');
  assert.deepEqual(eps(s1, key('web')), ['10.0.0.1:8080', '10.0.0.2:8080']);
  assert.deepEqual(eps(s1, key('api')), []);
  assert.deepEqual(sorted(s1.changedServicePorts), [key('api'), key('web')]);
  assert.deepEqual(sorted(s1.changedEndpoints), [key('web')]);
  assert.equal(state.pendingServiceChanges, 0);
  assert.equal(state.pendingEndpointChanges, 0);

  const s2 = state.checkout();
  assert.equal(s2.changedServicePorts.size, 0);
  assert.equal(s2.changedEndpoints.size, 0);
  assert.equal(s2.servicePorts, s1.servicePorts, 'unchanged maps are reused');
  assert.equal(s2.endpoints, s1.endpoints);

  intake.onEndpointSliceUpdate(slice('web-b', 'web', ['10.0.0.2']), slice('web-b', 'web', ['10.0.0.3']));
  const s3 = state.checkout();
  assert.deepEqual(eps(s3, key('web')), ['10.0.0.1:8080', '10.0.0.3:8080']);
  assert.deepEqual(sorted(s3.changedEndpoints), [key('web')]);
  assert.equal(s3.changedServicePorts.size, 0);
  assert.equal(s3.servicePorts, s1.servicePorts);
  // The maps are the state's own (no copy per checkout): an older snapshot's maps show the latest
  // checkout; its changed sets stay its own.
  assert.equal(s3.endpoints, s1.endpoints);
  assert.deepEqual(eps(s1, key('web')), ['10.0.0.1:8080', '10.0.0.3:8080']);
  assert.equal(s2.changedEndpoints.size, 0);
});

test('add then delete before a checkout cancels out', () => {
  const { state, intake } = setup();
  intake.onServiceAdd(svc('web'));
  assert.equal(state.pendingServiceChanges, 1);
  intake.onServiceDelete(svc('web'));
  assert.equal(state.pendingServiceChanges, 0);
  assert.equal(state.serviceChangesTotal, 2);
  const snap = state.checkout();
  assert.equal(snap.servicePorts.size, 0);
  assert.equal(snap.changedServicePorts.size, 0);
});

test('an update reverted before a checkout cancels out; a no-op update is not pending', () => {
  const { state, intake } = setup();
  intake.onServiceAdd(svc('web'));
  state.checkout();
  intake.onServiceUpdate(svc('web'), svc('web', { externalIPs: ['192.0.2.1'] }));
  assert.equal(state.pendingServiceChanges, 1);
  intake.onServiceUpdate(svc('web', { externalIPs: ['192.0.2.1'] }), svc('web'));
  assert.equal(state.pendingServiceChanges, 0);
  // Only a label changed: same service ports, nothing pending.
  intake.onServiceUpdate(svc('web'), svc('web', {}, { team: 'a' }));
  assert.equal(state.pendingServiceChanges, 0);
  assert.equal(state.serviceChangesTotal, 4);
  assert.equal(state.checkout().changedServicePorts.size, 0);
});

test('renaming a port changes both keys; delete removes ports and endpoints', () => {
  const { state, intake } = setup();
  intake.onServiceAdd(svc('web'));
  intake.onEndpointSliceAdd(slice('web-a', 'web', ['10.0.0.1']));
  state.checkout();

  const renamed = svc('web', { ports: [{ name: 'web', protocol: 'TCP', port: 80 }] });
  intake.onServiceUpdate(svc('web'), renamed);
  const s1 = state.checkout();
  assert.deepEqual(sorted(s1.changedServicePorts), [key('web'), key('web', 'web')]);
  assert.deepEqual(sorted(s1.changedEndpoints), [key('web')], 'slice port "http" no longer matches');
  assert.equal(s1.endpoints.has(key('web')), false);

  intake.onServiceUpdate(renamed, svc('web'));
  const s2 = state.checkout();
  assert.deepEqual(eps(s2, key('web')), ['10.0.0.1:8080']);
  assert.deepEqual(sorted(s2.changedEndpoints), [key('web')]);

  intake.onServiceDelete(svc('web'));
  const s3 = state.checkout();
  assert.deepEqual(sorted(s3.changedServicePorts), [key('web')]);
  assert.deepEqual(sorted(s3.changedEndpoints), [key('web')]);
  assert.equal(s3.servicePorts.size, 0);
  assert.equal(s3.endpoints.size, 0);
});

test('endpoints without a Service are kept but not in the snapshot until it exists', () => {
  const { state, intake } = setup();
  intake.onEndpointSliceAdd(slice('web-a', 'web', ['10.0.0.1']));
  const s1 = state.checkout();
  assert.equal(s1.endpoints.size, 0);
  assert.equal(s1.changedEndpoints.size, 0);
  intake.onServiceAdd(svc('web'));
  const s2 = state.checkout();
  assert.deepEqual(eps(s2, key('web')), ['10.0.0.1:8080']);
  assert.deepEqual(sorted(s2.changedEndpoints), [key('web')]);
});

test('skipped services (headless, ExternalName, no clusterIP, SCTP) give no ports and do not throw', () => {
  const { state, intake, warnings } = setup();
  intake.onServiceAdd(svc('headless', { clusterIP: 'None' }));
  intake.onServiceAdd(svc('ext', { type: 'ExternalName', externalName: 'example.com', clusterIP: '' }));
  intake.onServiceAdd(svc('pending', { clusterIP: '' }));
  intake.onServiceAdd(svc('sctp', { ports: [{ name: 'http', protocol: 'SCTP', port: 80 }] }));
  intake.onEndpointSliceAdd(slice('headless-a', 'headless', ['10.0.0.1']));
  const snap = state.checkout();
  assert.equal(snap.servicePorts.size, 0);
  assert.equal(snap.endpoints.size, 0);
  assert.equal(state.pendingServiceChanges, 0);
  assert.equal(warnings.length, 1, 'one warning, for SCTP');
  assert.match(warnings[0]!.msg, /SCTP/);
});

test('a Service whose update keeps the same problem is warned about once, and again after it is fixed and broken', () => {
  const { intake, warnings } = setup();
  const sctp = (annotation: string) => {
    const s = svc('sctp', { ports: [{ name: 'dns', protocol: 'SCTP', port: 53 }] });
    s.metadata = { ...s.metadata, annotations: { note: annotation } };
    return s;
  };
  intake.onServiceAdd(sctp('a'));
  intake.onServiceUpdate(sctp('a'), sctp('b'));
  intake.onServiceUpdate(sctp('b'), sctp('c'));
  assert.equal(warnings.length, 1, 'annotation-only updates say nothing new');
  intake.onServiceUpdate(sctp('c'), svc('sctp'));
  intake.onServiceUpdate(svc('sctp'), sctp('d'));
  assert.equal(warnings.length, 2, 'broken again after a fix: warned again');
  intake.onServiceDelete(sctp('d'));
  intake.onServiceAdd(sctp('e'));
  assert.equal(warnings.length, 3, 'a new Service of the same name is warned about');
});

test('FQDN slices and slices without the label are ignored; counters follow kube-proxy', () => {
  const { state, intake, warnings } = setup();
  intake.onServiceAdd(svc('web'));
  intake.onEndpointSliceAdd(slice('web-f', 'web', [{ addresses: ['a.example'] }], { addressType: 'FQDN' }));
  const unlabelled = slice('web-x', 'web', ['10.0.0.1']);
  unlabelled.metadata!.labels = {};
  intake.onEndpointSliceAdd(unlabelled);
  assert.equal(state.endpointChangesTotal, 0);
  assert.equal(state.pendingEndpointChanges, 0);
  assert.equal(warnings.length, 1);
  assert.match(warnings[0]!.msg, /service-name/);

  intake.onEndpointSliceAdd(slice('web-a', 'web', ['10.0.0.1']));
  intake.onEndpointSliceUpdate(slice('web-a', 'web', ['10.0.0.1']), slice('web-a', 'web', ['10.0.0.1']));
  assert.equal(state.endpointChangesTotal, 2, 'every considered update counts');
  assert.equal(state.pendingEndpointChanges, 1, 'only the one that changed something is pending');
  assert.deepEqual(eps(state.checkout(), key('web')), ['10.0.0.1:8080']);
});

test('an endpoint moving between slices is never lost', () => {
  const { state, intake } = setup();
  intake.onServiceAdd(svc('web'));
  intake.onEndpointSliceAdd(slice('web-a', 'web', ['10.0.0.1', '10.0.0.2']));
  state.checkout();
  intake.onEndpointSliceAdd(slice('web-b', 'web', ['10.0.0.2']));
  intake.onEndpointSliceUpdate(slice('web-a', 'web', []), slice('web-a', 'web', ['10.0.0.1']));
  const snap = state.checkout();
  assert.deepEqual(eps(snap, key('web')), ['10.0.0.1:8080', '10.0.0.2:8080']);
  assert.equal(snap.changedEndpoints.size, 0, 'same endpoints as before');
});

test('terminating fallback and traffic policies reach the snapshot', () => {
  const { state, intake } = setup();
  intake.onServiceAdd(svc('web', { internalTrafficPolicy: 'Local' }));
  intake.onServiceAdd(
    svc('lb', { type: 'LoadBalancer', externalTrafficPolicy: 'Local', healthCheckNodePort: 32000 }),
  );
  intake.onEndpointSliceAdd(slice('web-a', 'web', [{ addresses: ['10.0.0.1'], nodeName: 'node-b' }]));
  intake.onEndpointSliceAdd(
    slice('lb-a', 'lb', [
      {
        addresses: ['10.0.1.1'],
        nodeName: NODE,
        conditions: { ready: false, serving: true, terminating: true },
      },
      { addresses: ['10.0.1.2'], nodeName: 'node-b' },
    ]),
  );
  const snap = state.checkout();
  assert.deepEqual(eps(snap, key('web')), [], 'ITP Local with only remote endpoints');
  assert.deepEqual(
    snap.endpoints.get(key('lb'))?.local.map((e) => e.key),
    ['10.0.1.1:8080'],
  );
  assert.deepEqual(eps(snap, key('lb')), ['10.0.1.2:8080']);
  assert.equal(snap.endpoints.get(key('lb'))?.localReadyCount, 0);
  assert.equal(snap.servicePorts.get(key('lb'))?.healthCheckNodePort, 32000);
});

test('dual-stack service gets IPv4 and IPv6 slices; single-stack only its own', () => {
  const { state, intake } = setup();
  intake.onServiceAdd(svc('dual', { clusterIP: '10.96.0.5', clusterIPs: ['10.96.0.5', 'fd00::5'] }));
  intake.onServiceAdd(svc('v4'));
  for (const s of ['dual', 'v4']) {
    intake.onEndpointSliceAdd(slice(`${s}-4`, s, ['10.0.0.1']));
    intake.onEndpointSliceAdd(slice(`${s}-6`, s, ['fd00::1'], { addressType: 'IPv6' }));
  }
  const snap = state.checkout();
  assert.deepEqual(snap.servicePorts.get(key('dual'))?.clusterIPs, ['10.96.0.5', 'fd00::5']);
  assert.deepEqual(eps(snap, key('dual')), ['10.0.0.1:8080', '[fd00::1]:8080']);
  assert.deepEqual(eps(snap, key('v4')), ['10.0.0.1:8080']);
});

test('a zone change recomputes every service; another node is ignored', () => {
  const { state, intake, changes } = setup();
  const hinted = (ip: string, zone: string): EndpointSliceEndpoint => ({
    addresses: [ip],
    hints: { forZones: [{ name: zone }] },
  });
  intake.onServiceAdd(svc('web'));
  intake.onServiceAdd(svc('plain', { clusterIP: '10.96.0.9' }));
  intake.onEndpointSliceAdd(slice('web-a', 'web', [hinted('10.0.0.1', 'z1'), hinted('10.0.0.2', 'z2')]));
  intake.onEndpointSliceAdd(slice('plain-a', 'plain', ['10.0.0.9']));
  assert.deepEqual(eps(state.checkout(), key('web')), ['10.0.0.1:8080', '10.0.0.2:8080']);

  const before = changes();
  intake.onNodeUpdate(node('z2', 'node-b'));
  assert.equal(changes(), before);
  intake.onNodeUpdate(node('z2'));
  assert.equal(state.nodeZone, 'z2');
  assert.equal(changes(), before + 1);
  const s1 = state.checkout();
  assert.deepEqual(eps(s1, key('web')), ['10.0.0.2:8080']);
  assert.deepEqual(sorted(s1.changedEndpoints), [key('web')]);

  intake.onNodeUpdate(node('z2'));
  assert.equal(changes(), before + 1, 'same zone: nothing to do');
  intake.onNodeDelete(node('z2'));
  assert.deepEqual(eps(state.checkout(), key('web')), ['10.0.0.1:8080', '10.0.0.2:8080']);
});

test('trigger times: parsed from non-delete updates that change something, cleared by a delete', () => {
  const { state, intake } = setup();
  intake.onServiceAdd(svc('web'));
  intake.onEndpointSliceAdd(
    slice('web-a', 'web', ['10.0.0.1'], { trigger: '2024-05-06T07:08:09.123456789Z' }),
  );
  intake.onEndpointSliceAdd(slice('web-b', 'web', ['10.0.0.2'], { trigger: '2024-05-06T07:08:10Z' }));
  intake.onEndpointSliceAdd(slice('api-a', 'api', ['10.0.0.3'], { trigger: '2024-05-06T07:08:11+01:00' }));
  intake.onEndpointSliceAdd(slice('api-a', 'api', ['10.0.0.3'], { trigger: '2024-05-06T07:08:12Z' }));
  assert.deepEqual([...state.checkout().triggerTimes].sort(), [
    Date.UTC(2024, 4, 6, 6, 8, 11),
    Date.UTC(2024, 4, 6, 7, 8, 9, 123),
    Date.UTC(2024, 4, 6, 7, 8, 10),
  ]);
  assert.deepEqual(state.checkout().triggerTimes, []);
  intake.onEndpointSliceUpdate(
    slice('web-a', 'web', []),
    slice('web-a', 'web', ['10.0.0.5'], { trigger: '2024-05-06T07:09:00Z' }),
  );
  intake.onEndpointSliceDelete(slice('web-b', 'web', [], { trigger: '2024-05-06T07:09:01Z' }));
  assert.deepEqual(state.checkout().triggerTimes, []);
});

test('triggerTime parses RFC 3339 with nanoseconds and rejects anything else', () => {
  assert.equal(triggerTime('1970-01-01T00:00:01.5Z'), 1500);
  assert.equal(triggerTime('1970-01-01T00:00:01.999999999Z'), 1999);
  assert.equal(triggerTime('1970-01-01'), undefined);
  assert.equal(triggerTime('yesterday'), undefined);
  assert.equal(triggerTime(undefined), undefined);
});

test('startTimeMs drops trigger times that predate the tracker', () => {
  const state = new ProxyState({ nodeName: NODE, warn: () => {}, startTimeMs: Date.UTC(2024, 0, 1) });
  state.onEndpointSliceAdd(slice('web-a', 'web', ['10.0.0.1'], { trigger: '2023-12-31T23:59:59Z' }));
  state.onEndpointSliceAdd(slice('web-b', 'web', ['10.0.0.2'], { trigger: '2024-01-01T00:00:01Z' }));
  assert.deepEqual(state.checkout().triggerTimes, [Date.UTC(2024, 0, 1, 0, 0, 1)]);
});

test('bad objects are skipped with one warning; the rest still appear', () => {
  const { state, intake, warnings } = setup();
  intake.onServiceAdd(svc('web'));
  intake.onServiceAdd(svc('bad', { ports: [{ name: 'http', protocol: 'TCP', port: 0 }] }));
  intake.onServiceAdd({ metadata: { namespace: 'ns' }, spec: {} } as Service);
  intake.onEndpointSliceAdd(slice('web-a', 'web', ['10.0.0.1']));
  intake.onEndpointSliceAdd({ ...slice('web-b', 'web', ['10.0.0.2']), addressType: 'IPv5' });
  intake.onEndpointSliceAdd(slice('web-c', 'web', ['10.0.0.300', '10.0.0.3']));
  const snap = state.checkout();
  assert.deepEqual([...snap.servicePorts.keys()], [key('web')]);
  assert.deepEqual(eps(snap, key('web')), ['10.0.0.1:8080', '10.0.0.3:8080']);
  assert.deepEqual(
    warnings.map((w) => [w.msg, w.fields['kind'], w.fields['object']]),
    [
      ['Ignoring invalid object', 'Service', 'ns/bad'],
      ['Ignoring invalid object', 'Service', '(unnamed)'],
      ['Ignoring invalid object', 'EndpointSlice', 'ns/web-b'],
      ['Ignoring parts of an object', 'EndpointSlice', 'ns/web-c'],
    ],
  );
  assert.deepEqual(warnings[0]!.fields['problems'], [
    'spec.ports[0].port: must be between 1 and 65535 (error)',
  ]);
});

test('a bad update keeps the last good version, warns once, and a delete still removes it', () => {
  const { state, intake, warnings } = setup();
  intake.onServiceAdd(svc('web'));
  intake.onEndpointSliceAdd(slice('web-a', 'web', ['10.0.0.1']));
  state.checkout();
  const bad = svc('web', { sessionAffinity: 'Sticky' });
  intake.onServiceUpdate(svc('web'), bad);
  intake.onServiceUpdate(bad, bad);
  intake.onEndpointSliceUpdate(slice('web-a', 'web', []), {
    ...slice('web-a', 'web', ['10.0.0.2']),
    endpoints: 'x',
  } as never);
  assert.equal(warnings.length, 2, 'the same bad object is reported once');
  assert.equal(state.pendingServiceChanges, 0);
  const s1 = state.checkout();
  assert.equal(s1.servicePorts.get(key('web'))?.sessionAffinity, 'None');
  assert.deepEqual(eps(s1, key('web')), ['10.0.0.1:8080']);

  intake.onServiceDelete(bad);
  intake.onEndpointSliceDelete(slice('web-a', 'web', []));
  const s2 = state.checkout();
  assert.equal(s2.servicePorts.size, 0);
  assert.equal(s2.endpoints.size, 0);
});

test('objects labelled for another proxy are treated as absent', () => {
  const { state, intake } = setup();
  intake.onServiceAdd(svc('web'));
  intake.onServiceAdd(svc('other', {}, { 'service.kubernetes.io/service-proxy-name': 'foo' }));
  intake.onEndpointSliceAdd(slice('web-a', 'web', ['10.0.0.1']));
  assert.deepEqual([...state.checkout().servicePorts.keys()], [key('web')]);
  intake.onServiceUpdate(svc('web'), svc('web', {}, { 'service.kubernetes.io/service-proxy-name': 'foo' }));
  intake.onEndpointSliceUpdate(
    slice('web-a', 'web', []),
    slice('web-a', 'web', ['10.0.0.1'], { labels: { 'service.kubernetes.io/headless': '' } }),
  );
  const snap = state.checkout();
  assert.equal(snap.servicePorts.size, 0);
  assert.equal(snap.endpoints.size, 0);
});

test('incremental: one change among 10,000 services reports just that service', () => {
  const { state, intake } = setup();
  const N = 10_000;
  const ip = (i: number, host: number) => `10.${(i >> 8) & 255}.${i & 255}.${host}`;
  for (let i = 0; i < N; i++) {
    intake.onServiceAdd(svc(`s${i}`, { clusterIP: `10.96.${(i >> 8) & 255}.${i & 255}` }));
    intake.onEndpointSliceAdd(slice(`s${i}-a`, `s${i}`, [ip(i, 1), ip(i, 2)]));
  }
  intake.onServicesSynced();
  intake.onEndpointSlicesSynced();
  const s0 = state.checkout();
  assert.equal(s0.servicePorts.size, N);
  assert.equal(s0.changedEndpoints.size, N);

  intake.onEndpointSliceUpdate(slice('s42-a', 's42', []), slice('s42-a', 's42', [ip(42, 1)]));
  const s1 = state.checkout();
  assert.deepEqual([...s1.changedEndpoints], [key('s42')]);
  assert.equal(s1.changedServicePorts.size, 0);
  assert.equal(s1.servicePorts, s0.servicePorts);
  assert.deepEqual(eps(s1, key('s42')), [`${ip(42, 1)}:8080`]);
  assert.equal(s1.endpoints.get(key('s43')), s0.endpoints.get(key('s43')));

  intake.onServiceUpdate(svc('s7'), svc('s7', { clusterIP: '10.96.0.7', sessionAffinity: 'ClientIP' }));
  const s2 = state.checkout();
  assert.deepEqual([...s2.changedServicePorts], [key('s7')]);
  assert.equal(s2.changedEndpoints.size, 0);
  assert.equal(s2.servicePorts.get(key('s7'))?.sessionAffinity, 'ClientIP');
  assert.equal(s2.servicePorts.size, N);
});

test('onlyEndpointsPending: true for slice changes alone, false once a Service or the zone changes', () => {
  const { state, intake } = setup();
  intake.onServicesSynced();
  intake.onEndpointSlicesSynced();
  assert.equal(state.onlyEndpointsPending, false);
  intake.onServiceAdd(svc('a'));
  intake.onEndpointSliceAdd(slice('a-1', 'a', ['10.0.0.1']));
  assert.equal(state.onlyEndpointsPending, false, 'a Service is pending');
  state.checkout();
  assert.equal(state.onlyEndpointsPending, false, 'nothing is pending');
  intake.onEndpointSliceUpdate(slice('a-1', 'a', ['10.0.0.1']), slice('a-1', 'a', ['10.0.0.2']));
  assert.equal(state.onlyEndpointsPending, true);
  const snap = state.checkout();
  assert.deepEqual(sorted(snap.changedEndpoints), [key('a')]);
  assert.equal(snap.changedServicePorts.size, 0);
  assert.deepEqual(eps(snap, key('a')), ['10.0.0.2:8080']);
  assert.equal(state.onlyEndpointsPending, false);
  intake.onEndpointSliceUpdate(slice('a-1', 'a', ['10.0.0.2']), slice('a-1', 'a', ['10.0.0.3']));
  intake.onNodeUpdate(node('zone-b'));
  assert.equal(state.onlyEndpointsPending, false, 'the zone changed');
});

test("one Endpoint representation: a checkout's lists are the slice's parsed list, kept across unrelated changes", () => {
  const { state, intake } = setup();
  intake.onServiceAdd(svc('web'));
  intake.onServiceAdd(svc('api', { clusterIP: '10.96.0.2' }));
  intake.onEndpointSliceAdd(slice('web-a', 'web', ['10.0.0.1', '10.0.0.2']));
  intake.onEndpointSliceAdd(slice('api-a', 'api', ['10.0.0.3']));
  intake.onServicesSynced();
  intake.onEndpointSlicesSynced();
  const web = state.checkout().endpoints.get(key('web'))!;
  assert.equal(web.cluster, web.all, 'every endpoint ready: one list');
  intake.onEndpointSliceUpdate(slice('api-a', 'api', ['10.0.0.3']), slice('api-a', 'api', ['10.0.0.4']));
  intake.onServiceUpdate(svc('web'), svc('web', { sessionAffinity: 'ClientIP' }));
  const again = state.checkout().endpoints.get(key('web'))!;
  assert.equal(again.all, web.all, 'recomputed, and still the same list of the same Endpoint objects');
});

test('a checkout is not kept by the state: its change sets go once the caller drops them', async () => {
  const { state, intake } = setup();
  intake.onServiceAdd(svc('web'));
  intake.onEndpointSliceAdd(slice('web-a', 'web', ['10.0.0.1']));
  intake.onServicesSynced();
  intake.onEndpointSlicesSynced();
  let snap: Snapshot | undefined = state.checkout();
  assert.deepEqual(sorted(snap.changedServicePorts), [key('web')]);
  const changed = new WeakRef(snap.changedServicePorts);
  const changedEndpoints = new WeakRef(snap.changedEndpoints);
  snap = undefined;
  await collectGarbage();
  assert.equal(changed.deref(), undefined, 'changedServicePorts collected');
  assert.equal(changedEndpoints.deref(), undefined, 'changedEndpoints collected');
  assert.equal(state.checkout().servicePorts.size, 1, 'the state itself is intact');
});

test('a Service from one port to two and back to one: each step changes only the port that came or went', () => {
  const { state, intake } = setup();
  const one = svc('web');
  const two = svc('web', {
    ports: [
      { name: 'http', protocol: 'TCP', port: 80 },
      { name: 'dns', protocol: 'UDP', port: 53 },
    ],
  });
  intake.onServiceAdd(one);
  intake.onEndpointSliceAdd(slice('web-a', 'web', ['10.0.0.1']));
  state.checkout();
  intake.onServiceUpdate(one, two);
  const s1 = state.checkout();
  assert.deepEqual(sorted(s1.changedServicePorts), [key('web', 'dns', 'UDP')]);
  assert.deepEqual(eps(s1, key('web')), ['10.0.0.1:8080'], 'the first port keeps its endpoints');
  // Back and forth before a checkout: no change at all.
  intake.onServiceUpdate(two, one);
  intake.onServiceUpdate(one, two);
  assert.equal(state.pendingServiceChanges, 0);
  intake.onServiceUpdate(two, one);
  const s2 = state.checkout();
  assert.deepEqual(sorted(s2.changedServicePorts), [key('web', 'dns', 'UDP')]);
  assert.deepEqual([...s2.servicePorts.keys()], [key('web')]);
  assert.deepEqual(eps(s2, key('web')), ['10.0.0.1:8080']);
  intake.onServiceDelete(one);
  assert.deepEqual(sorted(state.checkout().changedServicePorts), [key('web')]);
});

test('the state holds a Service of one port, its slice of the same five pods as every other, in under 900 bytes', async () => {
  const { state, intake } = setup();
  intake.onServicesSynced();
  intake.onEndpointSlicesSynced();
  state.checkout();
  const pods = ['10.244.1.5', '10.244.2.5', '10.244.3.5', '10.244.4.5', '10.244.5.5'];
  const N = 20_000;
  const before = await usedHeap();
  for (let i = 0; i < N; i++) {
    intake.onServiceAdd(svc(`svc-${i}`, { clusterIP: `10.${100 + (i >> 16)}.${(i >> 8) & 255}.${i & 255}` }));
    intake.onEndpointSliceAdd(slice(`svc-${i}-x7k2p`, `svc-${i}`, pods));
  }
  assert.equal(state.checkout().servicePorts.size, N);
  const perService = ((await usedHeap()) - before) / N;
  // ~975 with a map of the service ports beside the ports of each Service, and a map from each slice's
  // name to its Service.
  assert.ok(perService < 900, `${perService.toFixed(0)} bytes a Service`);
});
