import assert from 'node:assert/strict';
import { test } from 'node:test';
import { canonicalIP, isValidCIDR, isValidIP } from '../../../src/lib/ip.ts';
import {
  formatPath,
  formatProblem,
  hasErrors,
  type Problem,
  validateEndpointSlice,
  validateNode,
  validateService,
} from '../../../src/source/validate.ts';

// Problems as `path severity` strings, sorted, so cases read like the log lines they produce.
function brief(problems: Problem[]): string[] {
  return problems.map((p) => `${formatPath(p.path)} ${p.severity}`).sort();
}

const meta = { name: 'web', namespace: 'default' };
const goodService = {
  apiVersion: 'v1',
  kind: 'Service',
  metadata: { ...meta, labels: { app: 'web' }, annotations: { a: 'b' }, resourceVersion: '7' },
  spec: {
    type: 'LoadBalancer',
    clusterIP: '10.96.0.10',
    clusterIPs: ['10.96.0.10', 'fd00::10'],
    ipFamilies: ['IPv4', 'IPv6'],
    ipFamilyPolicy: 'PreferDualStack',
    ports: [
      { name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, nodePort: 30080 },
      { name: 'dns', protocol: 'UDP', port: 53, targetPort: 'dns' },
    ],
    externalIPs: ['192.0.2.1'],
    loadBalancerSourceRanges: [' 10.0.0.0/8 '],
    sessionAffinity: 'ClientIP',
    sessionAffinityConfig: { clientIP: { timeoutSeconds: 60 } },
    externalTrafficPolicy: 'Local',
    internalTrafficPolicy: 'Cluster',
    healthCheckNodePort: 32000,
    selector: { app: 'web' },
    somethingNew: { nested: true },
  },
  status: { loadBalancer: { ingress: [{ ip: '203.0.113.1', ipMode: 'VIP' }, { hostname: 'lb.example' }] } },
};

function service(spec: Record<string, unknown>, extra: Record<string, unknown> = {}): unknown {
  return { metadata: meta, spec: { clusterIP: '10.0.0.1', ports: [{ port: 80 }], ...spec }, ...extra };
}

const serviceCases: { name: string; obj: unknown; want: string[] }[] = [
  { name: 'a complete Service has no problems', obj: goodService, want: [] },
  { name: 'not an object', obj: 'Service', want: ['(object) error'] },
  { name: 'null', obj: null, want: ['(object) error'] },
  { name: 'no metadata', obj: { spec: {} }, want: ['metadata error'] },
  {
    name: 'name and namespace missing',
    obj: { metadata: {} },
    want: ['metadata.name error', 'metadata.namespace error'],
  },
  {
    name: 'name of the wrong type',
    obj: { metadata: { name: 5, namespace: 'x' } },
    want: ['metadata.name error'],
  },
  {
    name: 'name with a slash cannot be keyed',
    obj: { metadata: { name: 'a/b', namespace: 'x' } },
    want: ['metadata.name error'],
  },
  {
    name: 'label value not a string',
    obj: { metadata: { ...meta, labels: { a: 1 } } },
    want: ['metadata.labels.a error'],
  },
  {
    name: 'annotations not an object',
    obj: { metadata: { ...meta, annotations: [] } },
    want: ['metadata.annotations error'],
  },
  { name: 'spec not an object', obj: { metadata: meta, spec: 'x' }, want: ['spec error'] },
  { name: 'no spec is fine (skipped later)', obj: { metadata: meta }, want: [] },
  { name: 'unknown type is a warning', obj: service({ type: 'Magic' }), want: ['spec.type warning'] },
  { name: 'headless clusterIP None', obj: service({ clusterIP: 'None', clusterIPs: ['None'] }), want: [] },
  { name: 'empty clusterIP', obj: service({ clusterIP: '' }), want: [] },
  { name: 'malformed clusterIP', obj: service({ clusterIP: '10.0.0.256' }), want: ['spec.clusterIP error'] },
  {
    name: 'leading zero in clusterIP',
    obj: service({ clusterIP: '010.0.0.1' }),
    want: ['spec.clusterIP error'],
  },
  { name: 'clusterIP not a string', obj: service({ clusterIP: 10 }), want: ['spec.clusterIP error'] },
  {
    name: 'malformed clusterIPs entry',
    obj: service({ clusterIPs: ['10.0.0.1', 'nope'] }),
    want: ['spec.clusterIPs[1] error'],
  },
  {
    name: 'two IPv4 cluster IPs',
    obj: service({ clusterIPs: ['10.0.0.1', '10.0.0.2'] }),
    want: ['spec.clusterIPs[1] error'],
  },
  {
    name: 'clusterIPs[0] differs from clusterIP',
    obj: service({ clusterIPs: ['10.0.0.2'] }),
    want: ['spec.clusterIPs[0] error'],
  },
  {
    name: 'clusterIPs not an array',
    obj: service({ clusterIPs: '10.0.0.1' }),
    want: ['spec.clusterIPs error'],
  },
  {
    name: 'unknown ipFamilies entry',
    obj: service({ ipFamilies: ['IPv5'] }),
    want: ['spec.ipFamilies[0] warning'],
  },
  { name: 'ports not an array', obj: service({ ports: {} }), want: ['spec.ports error'] },
  { name: 'port entry not an object', obj: service({ ports: [80] }), want: ['spec.ports[0] error'] },
  { name: 'port missing', obj: service({ ports: [{ name: 'a' }] }), want: ['spec.ports[0].port error'] },
  { name: 'port 0', obj: service({ ports: [{ port: 0 }] }), want: ['spec.ports[0].port error'] },
  { name: 'port 65536', obj: service({ ports: [{ port: 65536 }] }), want: ['spec.ports[0].port error'] },
  { name: 'port as a string', obj: service({ ports: [{ port: '80' }] }), want: ['spec.ports[0].port error'] },
  {
    name: 'port not an integer',
    obj: service({ ports: [{ port: 80.5 }] }),
    want: ['spec.ports[0].port error'],
  },
  { name: 'SCTP is accepted here', obj: service({ ports: [{ port: 80, protocol: 'SCTP' }] }), want: [] },
  {
    name: 'unknown protocol is a warning',
    obj: service({ ports: [{ port: 80, protocol: 'QUIC' }] }),
    want: ['spec.ports[0].protocol warning'],
  },
  {
    name: 'port name with capitals',
    obj: service({ ports: [{ port: 80, name: 'HTTP' }] }),
    want: ['spec.ports[0].name error'],
  },
  {
    name: 'duplicate port name and protocol',
    obj: service({
      ports: [
        { port: 80, name: 'a' },
        { port: 81, name: 'a', protocol: 'TCP' },
      ],
    }),
    want: ['spec.ports[1] error'],
  },
  {
    name: 'same name, other protocol is allowed here',
    obj: service({
      ports: [
        { port: 53, name: 'dns' },
        { port: 53, name: 'dns', protocol: 'UDP' },
      ],
    }),
    want: [],
  },
  { name: 'nodePort 0 is none', obj: service({ ports: [{ port: 80, nodePort: 0 }] }), want: [] },
  {
    name: 'nodePort out of range',
    obj: service({ ports: [{ port: 80, nodePort: 70000 }] }),
    want: ['spec.ports[0].nodePort error'],
  },
  {
    name: 'bad externalIP is dropped with a warning',
    obj: service({ externalIPs: ['1.2.3.4', 'bad', '1.2.3.04'] }),
    want: ['spec.externalIPs[1] warning', 'spec.externalIPs[2] warning'],
  },
  {
    name: 'externalIP not a string',
    obj: service({ externalIPs: [1] }),
    want: ['spec.externalIPs[0] error'],
  },
  {
    name: 'bad source range',
    obj: service({ loadBalancerSourceRanges: ['10.0.0.0/33'] }),
    want: ['spec.loadBalancerSourceRanges[0] warning'],
  },
  {
    name: 'unknown sessionAffinity',
    obj: service({ sessionAffinity: 'Cookie' }),
    want: ['spec.sessionAffinity error'],
  },
  {
    name: 'timeoutSeconds 0',
    obj: service({ sessionAffinityConfig: { clientIP: { timeoutSeconds: 0 } } }),
    want: ['spec.sessionAffinityConfig.clientIP.timeoutSeconds error'],
  },
  {
    name: 'timeoutSeconds above a day',
    obj: service({ sessionAffinityConfig: { clientIP: { timeoutSeconds: 86401 } } }),
    want: ['spec.sessionAffinityConfig.clientIP.timeoutSeconds error'],
  },
  {
    name: 'unknown traffic policies are warnings',
    obj: service({ externalTrafficPolicy: 'Global', internalTrafficPolicy: 'Zone' }),
    want: ['spec.externalTrafficPolicy warning', 'spec.internalTrafficPolicy warning'],
  },
  {
    name: 'healthCheckNodePort out of range',
    obj: service({ healthCheckNodePort: -1 }),
    want: ['spec.healthCheckNodePort error'],
  },
  {
    name: 'bad LB ingress IP and unknown ipMode are warnings',
    obj: service(
      {},
      { status: { loadBalancer: { ingress: [{ ip: 'x' }, { ip: '1.2.3.4', ipMode: 'Magic' }] } } },
    ),
    want: ['status.loadBalancer.ingress[0].ip warning', 'status.loadBalancer.ingress[1].ipMode warning'],
  },
  {
    name: 'LB ingress not an array',
    obj: service({}, { status: { loadBalancer: { ingress: {} } } }),
    want: ['status.loadBalancer.ingress error'],
  },
];

for (const c of serviceCases) {
  test(`validateService: ${c.name}`, () => {
    assert.deepEqual(brief(validateService(c.obj)), [...c.want].sort());
  });
}

const sliceMeta = { name: 'web-abc', namespace: 'default', labels: { 'kubernetes.io/service-name': 'web' } };
const goodSlice = {
  apiVersion: 'discovery.k8s.io/v1',
  kind: 'EndpointSlice',
  metadata: {
    ...sliceMeta,
    annotations: { 'endpoints.kubernetes.io/last-change-trigger-time': '2024-01-01T00:00:00Z' },
  },
  addressType: 'IPv4',
  endpoints: [
    {
      addresses: ['10.1.0.1'],
      conditions: { ready: true, serving: true, terminating: false },
      nodeName: 'node-a',
      zone: 'z1',
      hints: { forZones: [{ name: 'z1' }], forNodes: [{ name: 'node-a' }] },
      targetRef: { kind: 'Pod', name: 'web-1' },
    },
    { addresses: ['10.1.0.2'] },
  ],
  ports: [
    { name: 'http', protocol: 'TCP', port: 8080, appProtocol: 'http' },
    { name: '', port: 9090 },
  ],
};

function slice(fields: Record<string, unknown>): unknown {
  return { metadata: sliceMeta, addressType: 'IPv4', endpoints: [], ports: [], ...fields };
}

const sliceCases: { name: string; obj: unknown; want: string[] }[] = [
  { name: 'a complete slice has no problems', obj: goodSlice, want: [] },
  {
    name: 'FQDN slice needs no IPs',
    obj: slice({ addressType: 'FQDN', endpoints: [{ addresses: ['a.b'] }] }),
    want: [],
  },
  { name: 'no addressType', obj: slice({ addressType: undefined }), want: ['addressType error'] },
  { name: 'unknown addressType', obj: slice({ addressType: 'IPv5' }), want: ['addressType error'] },
  { name: 'no namespace', obj: slice({ metadata: { name: 'x' } }), want: ['metadata.namespace error'] },
  {
    name: 'service-name label that is not a name',
    obj: slice({ metadata: { ...sliceMeta, labels: { 'kubernetes.io/service-name': 'a/b' } } }),
    want: ['metadata.labels.kubernetes.io/service-name error'],
  },
  { name: 'endpoints not an array', obj: slice({ endpoints: {} }), want: ['endpoints error'] },
  {
    name: 'bad addresses are warnings',
    obj: slice({ endpoints: [{ addresses: ['10.0.0.999'] }, { addresses: ['fd00::1'] }] }),
    want: ['endpoints[0].addresses[0] warning', 'endpoints[1].addresses[0] warning'],
  },
  {
    name: 'IPv6 slice with IPv6 addresses',
    obj: slice({ addressType: 'IPv6', endpoints: [{ addresses: ['fd00::1'] }] }),
    want: [],
  },
  {
    name: 'address not a string',
    obj: slice({ endpoints: [{ addresses: [1] }] }),
    want: ['endpoints[0].addresses[0] error'],
  },
  {
    name: 'condition not a boolean',
    obj: slice({ endpoints: [{ addresses: ['10.0.0.1'], conditions: { ready: 'true' } }] }),
    want: ['endpoints[0].conditions.ready error'],
  },
  {
    name: 'hint without a string name',
    obj: slice({ endpoints: [{ addresses: ['10.0.0.1'], hints: { forZones: [{ name: 1 }] } }] }),
    want: ['endpoints[0].hints.forZones[0].name error'],
  },
  {
    name: 'nodeName not a string',
    obj: slice({ endpoints: [{ addresses: ['10.0.0.1'], nodeName: 1 }] }),
    want: ['endpoints[0].nodeName error'],
  },
  {
    name: 'port out of range',
    obj: slice({ ports: [{ name: 'a', port: 70000 }] }),
    want: ['ports[0].port error'],
  },
  {
    name: 'port 0 is ignored',
    obj: slice({ ports: [{ name: 'a', port: 0 }] }),
    want: ['ports[0].port warning'],
  },
  { name: 'port without number or name is fine', obj: slice({ ports: [{}] }), want: [] },
  {
    name: 'unknown port protocol',
    obj: slice({ ports: [{ name: 'a', port: 1, protocol: 'ICMP' }] }),
    want: ['ports[0].protocol warning'],
  },
];

for (const c of sliceCases) {
  test(`validateEndpointSlice: ${c.name}`, () => {
    assert.deepEqual(brief(validateEndpointSlice(c.obj)), [...c.want].sort());
  });
}

test('validateNode: name required, labels typed, namespace not needed', () => {
  assert.deepEqual(brief(validateNode({ metadata: { name: 'node-a', labels: { zone: 'z' } } })), []);
  assert.deepEqual(brief(validateNode({ metadata: {} })), ['metadata.name error']);
  assert.deepEqual(brief(validateNode({ metadata: { name: 'n', labels: { z: 1 } } })), [
    'metadata.labels.z error',
  ]);
});

const ipCases: [string, boolean][] = [
  ['10.0.0.1', true],
  ['0.0.0.0', true],
  ['255.255.255.255', true],
  ['010.0.0.1', false],
  ['10.0.0.01', false],
  ['10.0.0', false],
  ['10.0.0.256', false],
  [' 10.0.0.1', false],
  ['10.0.0.1/32', false],
  ['', false],
  ['fd00::1', true],
  ['FD00::0001', true],
  ['::', true],
  ['2001:db8:0:0:1:0:0:1', true],
  ['fe80::1%eth0', false],
  ['::ffff:1.2.3.4', false],
  ['::ffff:102:304', false],
  ['fd00::g', false],
  ['[fd00::1]', false],
];

for (const [ip, want] of ipCases) {
  test(`isValidIP(${JSON.stringify(ip)}) is ${want}`, () => assert.equal(isValidIP(ip), want));
}

test('canonicalIP lower-cases and compresses IPv6, keeps IPv4', () => {
  assert.equal(canonicalIP('FD00:0:0::0001'), 'fd00::1');
  assert.equal(canonicalIP('2001:db8:0:0:1:0:0:1'), '2001:db8::1:0:0:1');
  assert.equal(canonicalIP('10.0.0.1'), '10.0.0.1');
});

test('isValidCIDR', () => {
  assert.ok(isValidCIDR('10.0.0.0/8'));
  assert.ok(isValidCIDR('10.0.0.1/32'));
  assert.ok(isValidCIDR('fd00::/64'));
  assert.ok(!isValidCIDR('10.0.0.0/33'));
  assert.ok(!isValidCIDR('10.0.0.0/08'));
  assert.ok(!isValidCIDR('10.0.0.0'));
  assert.ok(!isValidCIDR('fd00::/129'));
});

test('paths format as a manifest path and can be prefixed by the caller', () => {
  const [problem] = validateService(service({ ports: [{ port: 0 }] }));
  assert.ok(problem);
  assert.equal(formatPath(['items', 2, ...problem.path]), 'items[2].spec.ports[0].port');
  assert.equal(formatProblem(problem), 'spec.ports[0].port: must be between 1 and 65535 (error)');
  assert.ok(hasErrors([problem]));
  assert.ok(!hasErrors([{ ...problem, severity: 'warning' }]));
});
