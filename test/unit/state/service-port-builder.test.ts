import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ANNOTATION_TRACE } from '../../../src/lib/kubernetes-labels.ts';
import type { Service } from '../../../src/source/objects.ts';
import type { ServicePort, ServicePortKey, ServicePortName } from '../../../src/state/service-port.ts';
import {
  clusterIPsOf,
  sameServicePorts,
  servicePortsFromService,
  shouldSkipService,
} from '../../../src/state/service-port-builder.ts';

type Spec = NonNullable<Service['spec']>;

function svc(spec: Partial<Spec> = {}, extra: Partial<Service> = {}): Service {
  return {
    metadata: { namespace: 'ns', name: 'web' },
    spec: {
      type: 'ClusterIP',
      clusterIP: '10.0.0.1',
      ports: [{ name: 'http', protocol: 'TCP', port: 80 }],
      ...spec,
    },
    ...extra,
  };
}

function build(s: Service): { ports: readonly ServicePort[]; warnings: string[] } {
  const warnings: string[] = [];
  const ports = servicePortsFromService(s, (msg) => warnings.push(msg));
  return { ports, warnings };
}

const base: ServicePort = {
  key: 'ns/web:http/TCP' as ServicePortKey,
  name: 'ns/web:http' as ServicePortName,
  namespace: 'ns',
  serviceName: 'web',
  portName: 'http',
  protocol: 'TCP',
  clusterIPs: ['10.0.0.1'],
  port: 80,
  nodePort: 0,
  externalIPs: [],
  loadBalancerIPs: [],
  loadBalancerSourceRanges: [],
  sessionAffinity: 'None',
  stickyMaxAgeSeconds: 10800,
  externallyAccessible: false,
  externalPolicyLocal: false,
  internalPolicyLocal: false,
  healthCheckNodePort: 0,
  trace: undefined,
  proxyProtocol: undefined,
};

// The identity fields of port `portName` of ns/web.
function named(portName: string, protocol: 'TCP' | 'UDP' = 'TCP'): Partial<ServicePort> {
  const name = `ns/web:${portName}` as ServicePortName;
  return { key: `${name}/${protocol}` as ServicePortKey, name, portName, protocol };
}

type Case = { name: string; svc: Service; want: Partial<ServicePort>[]; warnings?: number };

const cases: Case[] = [
  { name: 'plain ClusterIP service', svc: svc(), want: [{}] },
  { name: 'headless (None) is skipped', svc: svc({ clusterIP: 'None' }), want: [] },
  { name: 'no clusterIP yet is skipped', svc: svc({ clusterIP: '' }), want: [] },
  { name: 'absent clusterIP is skipped', svc: svc({ clusterIP: undefined }), want: [] },
  { name: 'no spec is skipped', svc: { metadata: { namespace: 'ns', name: 'web' } }, want: [] },
  {
    name: 'ExternalName is skipped even with a clusterIP',
    svc: svc({ type: 'ExternalName', externalName: 'example.com' }),
    want: [],
  },
  {
    name: 'unnamed port gives an empty port name',
    svc: svc({ ports: [{ port: 8080 }] }),
    want: [{ ...named(''), port: 8080 }],
  },
  {
    name: 'one service port per spec port, SCTP skipped with a warning',
    svc: svc({
      ports: [
        { name: 'dns', protocol: 'UDP', port: 53 },
        { name: 'dns-tcp', protocol: 'TCP', port: 53 },
        { name: 'sctp', protocol: 'SCTP', port: 9 },
      ],
    }),
    want: [
      { ...named('dns', 'UDP'), port: 53 },
      { ...named('dns-tcp'), port: 53 },
    ],
    warnings: 1,
  },
  {
    name: 'unknown protocol skipped with a warning',
    svc: svc({ ports: [{ name: 'x', protocol: 'QUIC', port: 1 }] }),
    want: [],
    warnings: 1,
  },
  {
    name: 'duplicate name and protocol keeps the first',
    svc: svc({
      ports: [
        { name: 'http', port: 80 },
        { name: 'http', port: 81 },
      ],
    }),
    want: [{}],
    warnings: 1,
  },
  {
    name: 'dual-stack: clusterIPs primary first, canonical',
    svc: svc({ clusterIP: 'FD00::0010', clusterIPs: ['FD00::0010', '10.0.0.1'] }),
    want: [{ clusterIPs: ['fd00::10', '10.0.0.1'] }],
  },
  {
    name: 'externalIPs: invalid dropped, other family dropped with a warning, duplicates once',
    svc: svc({ externalIPs: ['192.0.2.1', 'bogus', 'fd00::1', '192.0.2.1', '192.0.2.2'] }),
    want: [{ externalIPs: ['192.0.2.1', '192.0.2.2'], externallyAccessible: true }],
    warnings: 1,
  },
  {
    name: 'LoadBalancer: VIP and unset ipMode used, Proxy and hostname-only skipped, NodePort kept',
    svc: svc(
      { type: 'LoadBalancer', ports: [{ name: 'http', port: 80, nodePort: 30080 }] },
      {
        status: {
          loadBalancer: {
            ingress: [
              { ip: '203.0.113.1' },
              { ip: '203.0.113.2', ipMode: 'Proxy' },
              { hostname: 'x' },
              { ip: '203.0.113.3', ipMode: 'VIP' },
            ],
          },
        },
      },
    ),
    want: [{ nodePort: 30080, loadBalancerIPs: ['203.0.113.1', '203.0.113.3'], externallyAccessible: true }],
  },
  {
    name: 'source ranges trimmed, invalid and other-family dropped',
    svc: svc({ loadBalancerSourceRanges: [' 10.0.0.0/8 ', 'x', 'fd00::/8', '192.168.0.0/16'] }),
    want: [{ loadBalancerSourceRanges: ['10.0.0.0/8', '192.168.0.0/16'] }],
  },
  {
    name: 'ClientIP with the default timeout',
    svc: svc({ sessionAffinity: 'ClientIP' }),
    want: [{ sessionAffinity: 'ClientIP', stickyMaxAgeSeconds: 10800 }],
  },
  {
    name: 'ClientIP with a timeout',
    svc: svc({ sessionAffinity: 'ClientIP', sessionAffinityConfig: { clientIP: { timeoutSeconds: 60 } } }),
    want: [{ sessionAffinity: 'ClientIP', stickyMaxAgeSeconds: 60 }],
  },
  {
    name: 'ETP Local on a plain ClusterIP service is not external',
    svc: svc({ externalTrafficPolicy: 'Local' }),
    want: [{ externalPolicyLocal: false }],
  },
  {
    name: 'ETP Local on a ClusterIP service with externalIPs',
    svc: svc({ externalTrafficPolicy: 'Local', externalIPs: ['192.0.2.1'] }),
    want: [{ externalPolicyLocal: true, externallyAccessible: true, externalIPs: ['192.0.2.1'] }],
  },
  {
    name: 'ETP Local on a NodePort service, no health check',
    svc: svc({
      type: 'NodePort',
      externalTrafficPolicy: 'Local',
      healthCheckNodePort: 32000,
      ports: [{ name: 'http', port: 80, nodePort: 30080 }],
    }),
    want: [
      { externalPolicyLocal: true, externallyAccessible: true, nodePort: 30080, healthCheckNodePort: 0 },
    ],
  },
  {
    name: 'ETP Local LoadBalancer gets its health check node port',
    svc: svc({ type: 'LoadBalancer', externalTrafficPolicy: 'Local', healthCheckNodePort: 32000 }),
    want: [{ externalPolicyLocal: true, externallyAccessible: true, healthCheckNodePort: 32000 }],
  },
  {
    name: 'ETP Local LoadBalancer without healthCheckNodePort warns once for all ports',
    svc: svc({
      type: 'LoadBalancer',
      externalTrafficPolicy: 'Local',
      ports: [
        { name: 'a', port: 1 },
        { name: 'b', port: 2 },
      ],
    }),
    want: [
      { ...named('a'), port: 1, externalPolicyLocal: true, externallyAccessible: true },
      { ...named('b'), port: 2, externalPolicyLocal: true, externallyAccessible: true },
    ],
    warnings: 1,
  },
  {
    name: 'ETP Cluster LoadBalancer has no health check',
    svc: svc({ type: 'LoadBalancer', externalTrafficPolicy: 'Cluster', healthCheckNodePort: 32000 }),
    want: [{ externallyAccessible: true }],
  },
  { name: 'ITP Local', svc: svc({ internalTrafficPolicy: 'Local' }), want: [{ internalPolicyLocal: true }] },
  {
    name: 'trace annotation',
    svc: svc(
      {},
      { metadata: { namespace: 'ns', name: 'web', annotations: { [ANNOTATION_TRACE]: 'protocols' } } },
    ),
    want: [{ trace: 'protocols' }],
  },
  {
    name: 'unknown trace annotation value warns',
    svc: svc({}, { metadata: { namespace: 'ns', name: 'web', annotations: { [ANNOTATION_TRACE]: 'all' } } }),
    want: [{ trace: undefined }],
    warnings: 1,
  },
];

for (const c of cases) {
  test(c.name, () => {
    const { ports, warnings } = build(c.svc);
    assert.deepEqual(
      ports,
      c.want.map((w) => ({ ...base, ...w })),
    );
    assert.equal(warnings.length, c.warnings ?? 0, `warnings: ${warnings.join('; ')}`);
  });
}

test('shouldSkipService', () => {
  assert.equal(shouldSkipService(svc()), false);
  assert.equal(shouldSkipService(svc({ clusterIP: 'None' })), true);
  assert.equal(shouldSkipService(svc({ clusterIP: undefined, clusterIPs: ['10.0.0.1'] })), false);
  assert.equal(shouldSkipService(svc({ type: 'ExternalName' })), true);
});

test('clusterIPsOf falls back to clusterIP and keeps one per family', () => {
  assert.deepEqual(clusterIPsOf(svc()), ['10.0.0.1']);
  assert.deepEqual(clusterIPsOf(svc({ clusterIPs: [] })), ['10.0.0.1']);
  assert.deepEqual(clusterIPsOf(svc({ clusterIPs: ['10.0.0.1', '10.0.0.2', 'fd00::1'] })), [
    '10.0.0.1',
    'fd00::1',
  ]);
});

test('a wrongly typed object does not throw', () => {
  const hostile = {
    metadata: { name: 'x', namespace: 'y' },
    spec: { clusterIP: '10.0.0.1', ports: [{ port: 'http' }, { port: 99999 }], externalIPs: [1] },
  };
  assert.deepEqual(build(hostile as unknown as Service).ports, []);
});

test('sameServicePorts compares every field', () => {
  const a = build(svc()).ports;
  assert.ok(sameServicePorts(a, build(svc()).ports));
  assert.ok(!sameServicePorts(a, build(svc({ externalIPs: ['192.0.2.1'] })).ports));
  assert.ok(!sameServicePorts(a, build(svc({ sessionAffinity: 'ClientIP' })).ports));
  assert.ok(!sameServicePorts(a, []));
});

test('empty lists are one shared frozen list, not one per Service', () => {
  const a = build(svc()).ports[0]!;
  const b = build(svc({ clusterIP: '10.0.0.2' })).ports[0]!;
  for (const field of ['externalIPs', 'loadBalancerIPs', 'loadBalancerSourceRanges'] as const) {
    assert.deepEqual(a[field], []);
    assert.equal(a[field], b[field], field);
    assert.ok(Object.isFrozen(a[field]), field);
  }
  assert.deepEqual(build(svc({ ports: [] })).ports, []);
  assert.deepEqual(b.clusterIPs, ['10.0.0.2']);
});
