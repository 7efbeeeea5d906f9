import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  categorizeEndpoints,
  type EndpointPolicy,
  externalEndpoints,
  internalEndpoints,
  type NodeTopology,
  sameServicePortEndpoints,
} from '../../../src/state/categorize-endpoints.ts';
import type { Endpoint } from '../../../src/state/endpoint.ts';
import { ep } from '../../helpers/endpoints.ts';

// Short endpoint builders: r = ready, t = serving+terminating, n = neither; `local` marks this node.
const r = (ip: string, extra: Partial<Endpoint> = {}) => ep(ip, 80, extra);
const t = (ip: string, extra: Partial<Endpoint> = {}) =>
  ep(ip, 80, { ready: false, serving: true, terminating: true, ...extra });
const n = (ip: string, extra: Partial<Endpoint> = {}) =>
  ep(ip, 80, { ready: false, serving: false, terminating: true, ...extra });
const local = { isLocal: true, nodeName: 'node-a' };

// A NodePort service (externally accessible); `cluster` and `external` below are the lists ClusterIP and
// external traffic get (internalEndpoints, externalEndpoints).
const V4: EndpointPolicy = {
  clusterIPs: ['10.96.0.1'],
  internalPolicyLocal: false,
  externalPolicyLocal: false,
  externallyAccessible: true,
};
const ITP: EndpointPolicy = { ...V4, internalPolicyLocal: true };
const ETP: EndpointPolicy = { ...V4, externalPolicyLocal: true };
/** internalTrafficPolicy Local on a ClusterIP-only service: the cluster list is not used at all. */
const ITP_ONLY: EndpointPolicy = { ...ITP, externallyAccessible: false };
const NODE = 'node-a';

type Case = {
  name: string;
  policy?: EndpointPolicy;
  zone?: string;
  endpoints: Endpoint[];
  cluster: string[];
  external: string[];
  localReady?: number;
  all?: string[];
  /** Default: some endpoint is ready or serving+terminating. */
  hasAny?: boolean;
};

const cases: Case[] = [
  { name: 'no endpoints', endpoints: [], cluster: [], external: [] },
  {
    name: 'ready endpoints only, not-ready ignored',
    endpoints: [r('10.0.0.1'), ep('10.0.0.2', 80, { ready: false }), r('10.0.0.3')],
    cluster: ['10.0.0.1:80', '10.0.0.3:80'],
    external: ['10.0.0.1:80', '10.0.0.3:80'],
  },
  {
    name: 'ready ones win over serving+terminating',
    endpoints: [r('10.0.0.1'), t('10.0.0.2')],
    cluster: ['10.0.0.1:80'],
    external: ['10.0.0.1:80'],
  },
  {
    name: 'no ready: fall back to serving+terminating, not the non-serving ones',
    endpoints: [t('10.0.0.1'), n('10.0.0.2'), t('10.0.0.3')],
    cluster: ['10.0.0.1:80', '10.0.0.3:80'],
    external: ['10.0.0.1:80', '10.0.0.3:80'],
  },
  {
    name: 'only non-serving terminating endpoints: nothing',
    endpoints: [n('10.0.0.1')],
    cluster: [],
    external: [],
    all: ['10.0.0.1:80'],
  },
  {
    name: 'ITP Local with only remote endpoints: empty cluster list, external unaffected',
    policy: ITP,
    endpoints: [r('10.0.0.1'), r('10.0.0.2')],
    cluster: [],
    external: ['10.0.0.1:80', '10.0.0.2:80'],
  },
  {
    name: 'ITP Local uses local ready endpoints',
    policy: ITP,
    endpoints: [r('10.0.0.1', local), r('10.0.0.2'), t('10.0.0.3', local)],
    cluster: ['10.0.0.1:80'],
    external: ['10.0.0.1:80', '10.0.0.2:80'],
    localReady: 1,
  },
  {
    name: 'ITP Local falls back to local serving+terminating even when remote ones are ready',
    policy: ITP,
    endpoints: [t('10.0.0.1', local), r('10.0.0.2'), n('10.0.0.3', local)],
    cluster: ['10.0.0.1:80'],
    external: ['10.0.0.2:80'],
  },
  {
    name: 'ETP Local: external traffic only to local endpoints, cluster traffic to all',
    policy: ETP,
    endpoints: [r('10.0.0.1'), r('10.0.0.2', local), r('10.0.0.3', local)],
    cluster: ['10.0.0.1:80', '10.0.0.2:80', '10.0.0.3:80'],
    external: ['10.0.0.2:80', '10.0.0.3:80'],
    localReady: 2,
  },
  {
    name: 'ETP Local with no local endpoints: external empty',
    policy: ETP,
    endpoints: [r('10.0.0.1')],
    cluster: ['10.0.0.1:80'],
    external: [],
  },
  {
    name: 'both Local',
    policy: { ...V4, internalPolicyLocal: true, externalPolicyLocal: true },
    endpoints: [r('10.0.0.1'), r('10.0.0.2', local)],
    cluster: ['10.0.0.2:80'],
    external: ['10.0.0.2:80'],
    localReady: 1,
  },
  {
    name: 'localReadyCount counts distinct IPs, not terminating ones',
    policy: ETP,
    endpoints: [r('10.0.0.1', local), ep('10.0.0.1', 81, local), t('10.0.0.2', local)],
    cluster: ['10.0.0.1:80', '10.0.0.1:81'],
    external: ['10.0.0.1:80', '10.0.0.1:81'],
    localReady: 1,
  },
  {
    name: 'zone hints: all hinted and one matches → filtered to this zone',
    zone: 'z1',
    endpoints: [
      r('10.0.0.1', { zoneHints: ['z1'] }),
      r('10.0.0.2', { zoneHints: ['z2'] }),
      r('10.0.0.3', { zoneHints: ['z2', 'z1'] }),
    ],
    cluster: ['10.0.0.1:80', '10.0.0.3:80'],
    external: ['10.0.0.1:80', '10.0.0.3:80'],
  },
  {
    name: 'zone hints: one ready endpoint without hints → hints ignored',
    zone: 'z1',
    endpoints: [r('10.0.0.1', { zoneHints: ['z1'] }), r('10.0.0.2')],
    cluster: ['10.0.0.1:80', '10.0.0.2:80'],
    external: ['10.0.0.1:80', '10.0.0.2:80'],
  },
  {
    name: 'zone hints: none matches this zone → hints ignored',
    zone: 'z3',
    endpoints: [r('10.0.0.1', { zoneHints: ['z1'] }), r('10.0.0.2', { zoneHints: ['z2'] })],
    cluster: ['10.0.0.1:80', '10.0.0.2:80'],
    external: ['10.0.0.1:80', '10.0.0.2:80'],
  },
  {
    name: 'zone hints: node without a zone label → hints ignored',
    endpoints: [r('10.0.0.1', { zoneHints: ['z1'] }), r('10.0.0.2', { zoneHints: ['z2'] })],
    cluster: ['10.0.0.1:80', '10.0.0.2:80'],
    external: ['10.0.0.1:80', '10.0.0.2:80'],
  },
  {
    name: 'zone hints: only ready endpoints are inspected',
    zone: 'z1',
    endpoints: [r('10.0.0.1', { zoneHints: ['z1'] }), r('10.0.0.2', { zoneHints: ['z2'] }), t('10.0.0.3')],
    cluster: ['10.0.0.1:80'],
    external: ['10.0.0.1:80'],
  },
  {
    name: 'zone hints: the terminating fallback ignores topology',
    zone: 'z1',
    endpoints: [t('10.0.0.1', { zoneHints: ['z1'] }), t('10.0.0.2', { zoneHints: ['z2'] })],
    cluster: ['10.0.0.1:80', '10.0.0.2:80'],
    external: ['10.0.0.1:80', '10.0.0.2:80'],
  },
  {
    name: 'zone hints do not narrow the local list',
    zone: 'z1',
    policy: ETP,
    endpoints: [r('10.0.0.1', { zoneHints: ['z1'] }), r('10.0.0.2', { ...local, zoneHints: ['z2'] })],
    cluster: ['10.0.0.1:80'],
    external: ['10.0.0.2:80'],
    localReady: 1,
  },
  {
    name: 'IPv4-only service ignores IPv6 endpoints',
    endpoints: [r('10.0.0.1'), r('fd00::1')],
    cluster: ['10.0.0.1:80'],
    external: ['10.0.0.1:80'],
    all: ['10.0.0.1:80'],
  },
  {
    name: 'IPv6-only service ignores IPv4 endpoints',
    policy: { ...V4, clusterIPs: ['fd00::10'] },
    endpoints: [r('10.0.0.1'), r('fd00::1')],
    cluster: ['[fd00::1]:80'],
    external: ['[fd00::1]:80'],
    all: ['[fd00::1]:80'],
  },
  {
    name: 'dual-stack service uses both families',
    policy: { ...V4, clusterIPs: ['10.96.0.1', 'fd00::10'] },
    endpoints: [r('10.0.0.1'), r('fd00::1')],
    cluster: ['10.0.0.1:80', '[fd00::1]:80'],
    external: ['10.0.0.1:80', '[fd00::1]:80'],
  },
  {
    name: 'ITP Local, ClusterIP only, no local endpoint: nothing for ClusterIP, yet endpoints exist (DROP)',
    policy: ITP_ONLY,
    endpoints: [r('10.0.0.1'), r('10.0.0.2')],
    cluster: [],
    external: [],
    hasAny: true,
  },
  {
    name: 'ITP Local, ClusterIP only, local endpoint: ClusterIP gets it',
    policy: ITP_ONLY,
    endpoints: [r('10.0.0.1'), r('10.0.0.2', local)],
    cluster: ['10.0.0.2:80'],
    external: [],
    localReady: 1,
  },
  {
    name: 'ITP Local on a NodePort service: external traffic keeps the cluster list',
    policy: ITP,
    endpoints: [r('10.0.0.1'), r('10.0.0.2')],
    cluster: [],
    external: ['10.0.0.1:80', '10.0.0.2:80'],
  },
  {
    name: 'ETP Local, no local endpoint: external traffic has none, ClusterIP keeps the cluster list',
    policy: ETP,
    endpoints: [r('10.0.0.1')],
    cluster: ['10.0.0.1:80'],
    external: [],
  },
  {
    name: 'both Local: both get the local list',
    policy: { ...V4, internalPolicyLocal: true, externalPolicyLocal: true },
    endpoints: [r('10.0.0.1'), r('10.0.0.2', local), t('10.0.0.3', local)],
    cluster: ['10.0.0.2:80'],
    external: ['10.0.0.2:80'],
    localReady: 1,
  },
  {
    name: 'no usable endpoint anywhere: hasAnyEndpoints false (REJECT)',
    policy: ETP,
    endpoints: [n('10.0.0.1'), ep('10.0.0.2', 80, { ready: false })],
    cluster: [],
    external: [],
    hasAny: false,
  },
  {
    name: 'publishNotReadyAddresses: ready and terminating endpoints are used as ready',
    endpoints: [ep('10.0.0.1', 80, { ready: true, serving: true, terminating: true }), t('10.0.0.2')],
    cluster: ['10.0.0.1:80'],
    external: ['10.0.0.1:80'],
  },
  {
    name: 'node hints: every ready endpoint hinted, one for this node: only those',
    endpoints: [r('10.0.0.1', { nodeHints: ['node-b'] }), r('10.0.0.2', { nodeHints: [NODE] })],
    cluster: ['10.0.0.2:80'],
    external: ['10.0.0.2:80'],
  },
  {
    name: 'node hints win over zone hints',
    zone: 'z1',
    endpoints: [
      r('10.0.0.1', { nodeHints: ['node-b'], zoneHints: ['z1'] }),
      r('10.0.0.2', { nodeHints: [NODE], zoneHints: ['z2'] }),
    ],
    cluster: ['10.0.0.2:80'],
    external: ['10.0.0.2:80'],
  },
  {
    name: 'node hints on some endpoints only: fall back to zone hints',
    zone: 'z1',
    endpoints: [
      r('10.0.0.1', { nodeHints: [NODE], zoneHints: ['z2'] }),
      r('10.0.0.2', { zoneHints: ['z1'] }),
    ],
    cluster: ['10.0.0.2:80'],
    external: ['10.0.0.2:80'],
  },
  {
    name: 'node hints naming other nodes only: ignored',
    endpoints: [r('10.0.0.1', { nodeHints: ['node-b'] }), r('10.0.0.2', { nodeHints: ['node-c'] })],
    cluster: ['10.0.0.1:80', '10.0.0.2:80'],
    external: ['10.0.0.1:80', '10.0.0.2:80'],
  },
  {
    name: 'node hints ignore not-ready endpoints; none ready: serving+terminating, hints ignored',
    endpoints: [t('10.0.0.1', { nodeHints: ['node-b'] }), t('10.0.0.2', { nodeHints: [NODE] })],
    cluster: ['10.0.0.1:80', '10.0.0.2:80'],
    external: ['10.0.0.1:80', '10.0.0.2:80'],
  },
];

for (const c of cases) {
  test(c.name, () => {
    const policy = c.policy ?? V4;
    const got = categorizeEndpoints(c.endpoints, policy, { nodeName: NODE, zone: c.zone });
    assert.deepEqual(
      {
        cluster: internalEndpoints(policy, got).map((e) => e.key),
        external: externalEndpoints(policy, got).map((e) => e.key),
        localReady: got.localReadyCount,
        all: got.all.map((e) => e.key),
        hasAny: got.hasAnyEndpoints,
      },
      {
        cluster: c.cluster,
        external: c.external,
        localReady: c.localReady ?? 0,
        all: c.all ?? c.endpoints.map((e) => e.key),
        hasAny: c.hasAny ?? c.endpoints.some((e) => e.ready || (e.serving && e.terminating)),
      },
    );
  });
}

const TOPO: NodeTopology = { nodeName: NODE, zone: undefined };

test('sameServicePortEndpoints notices a flag change, not a new but equal value', () => {
  const a = categorizeEndpoints([r('10.0.0.1'), r('10.0.0.2')], V4, TOPO);
  assert.ok(sameServicePortEndpoints(a, categorizeEndpoints([r('10.0.0.1'), r('10.0.0.2')], V4, TOPO)));
  assert.ok(!sameServicePortEndpoints(a, categorizeEndpoints([r('10.0.0.1'), t('10.0.0.2')], V4, TOPO)));
  assert.ok(
    !sameServicePortEndpoints(a, categorizeEndpoints([r('10.0.0.1'), r('10.0.0.2', local)], V4, TOPO)),
  );
  assert.ok(!sameServicePortEndpoints(a, categorizeEndpoints([r('10.0.0.1')], V4, TOPO)));
});

test('lists that keep every endpoint are the list they come from, not copies', () => {
  const ready = [r('10.0.0.1'), r('10.0.0.2', local)];
  const got = categorizeEndpoints(ready, ETP, { nodeName: NODE, zone: undefined });
  assert.equal(got.all, ready, 'all: every endpoint is of the family');
  assert.equal(got.cluster, ready, 'cluster: every endpoint is ready');
  assert.deepEqual(
    got.local.map((e) => e.key),
    ['10.0.0.2:80'],
  );
  assert.equal(got.local[0], ready[1], 'the same Endpoint object');
  const mixed = [r('10.0.0.1'), n('10.0.0.2')];
  const some = categorizeEndpoints(mixed, V4, { nodeName: NODE, zone: undefined });
  assert.equal(some.all, mixed);
  assert.deepEqual(some.cluster, [mixed[0]]);
  assert.equal(some.cluster[0], mixed[0]);
});
