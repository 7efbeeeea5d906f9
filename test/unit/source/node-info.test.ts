import assert from 'node:assert/strict';
import { test } from 'node:test';
import { chooseNodeIP, resolveNodePortAddresses } from '../../../src/netfilter/node-ip.ts';
import { ProxyHealth } from '../../../src/server/proxy-health.ts';
import { isNodeEligible, nodeInternalIP, nodePodCIDRs } from '../../../src/source/node-info.ts';
import type { Node } from '../../../src/source/objects.ts';
import { fakeHostInfo } from '../../helpers/host-info.ts';

const node = (extra: Record<string, unknown> = {}): Node =>
  ({
    metadata: { name: 'node-1' },
    spec: { podCIDR: '10.244.1.0/24', podCIDRs: ['10.244.1.0/24', 'fd00:244:1::/64'] },
    status: {
      addresses: [
        { type: 'Hostname', address: 'node-1' },
        { type: 'ExternalIP', address: '203.0.113.5' },
        { type: 'InternalIP', address: '192.168.1.5' },
        { type: 'InternalIP', address: 'fd00::5' },
      ],
    },
    ...extra,
  }) as Node;

test('nodeInternalIP: the first InternalIP of the family, never an ExternalIP', () => {
  assert.equal(nodeInternalIP(node(), 'IPv4'), '192.168.1.5');
  assert.equal(nodeInternalIP(node(), 'IPv6'), 'fd00::5');
  assert.equal(
    nodeInternalIP(node({ status: { addresses: [{ type: 'ExternalIP', address: '203.0.113.5' }] } }), 'IPv4'),
    undefined,
  );
  assert.equal(nodeInternalIP(undefined, 'IPv4'), undefined);
  assert.equal(nodeInternalIP(node({ status: { addresses: 'x' } }), 'IPv4'), undefined);
});

test('nodePodCIDRs: spec.podCIDRs, else spec.podCIDR, valid ones only', () => {
  assert.deepEqual(nodePodCIDRs(node()), ['10.244.1.0/24', 'fd00:244:1::/64']);
  assert.deepEqual(nodePodCIDRs(node({ spec: { podCIDR: '10.244.2.0/24' } })), ['10.244.2.0/24']);
  assert.deepEqual(nodePodCIDRs(node({ spec: { podCIDRs: ['bad', 5] } })), []);
  assert.deepEqual(nodePodCIDRs(node({ spec: {} })), []);
  assert.deepEqual(nodePodCIDRs(undefined), []);
});

const eligibility = [
  { name: 'a plain node', extra: {}, want: true },
  {
    name: 'a NoSchedule taint of another key',
    extra: { spec: { taints: [{ key: 'node.kubernetes.io/unschedulable', effect: 'NoSchedule' }] } },
    want: true,
  },
  {
    name: 'the autoscaler taint',
    extra: {
      spec: {
        taints: [{ key: 'ToBeDeletedByClusterAutoscaler', value: '1700000000', effect: 'NoSchedule' }],
      },
    },
    want: false,
  },
  {
    name: 'a deletionTimestamp',
    extra: { metadata: { name: 'node-1', deletionTimestamp: '2026-01-01T00:00:00Z' } },
    want: false,
  },
];
for (const c of eligibility)
  test(`isNodeEligible: ${c.name}`, () => assert.equal(isNodeEligible(node(c.extra)), c.want));

test("chooseNodeIP: the Node's InternalIP when the host has it, else the default-route guess", () => {
  const info = fakeHostInfo();
  assert.deepEqual(chooseNodeIP(info, 'IPv4', '192.168.1.5'), { ip: '192.168.1.5' });
  assert.deepEqual(chooseNodeIP(info, 'IPv4', undefined), { ip: '192.168.1.5' });
  assert.deepEqual(chooseNodeIP(info, 'IPv4', '10.9.9.9'), { ip: '192.168.1.5', ignoredNodeIP: '10.9.9.9' });
  const two = fakeHostInfo();
  two.interfaces.eth1 = [
    {
      address: '10.0.0.7',
      netmask: '255.0.0.0',
      family: 'IPv4',
      mac: '00:00:00:00:00:02',
      internal: false,
      cidr: '10.0.0.7/8',
    },
  ];
  assert.deepEqual(chooseNodeIP(two, 'IPv4', '10.0.0.7'), { ip: '10.0.0.7' });
  assert.deepEqual(chooseNodeIP(two, 'IPv6', undefined), { ip: undefined });
});

const primary = [
  {
    name: 'CIDRs stay as they are',
    configured: ['10.0.0.0/8'],
    ips: { IPv4: '10.0.0.7' },
    want: ['10.0.0.0/8'],
  },
  { name: 'none stays none', configured: [], ips: { IPv4: '10.0.0.7' }, want: [] },
  { name: 'primary, IPv4 only', configured: ['primary'], ips: { IPv4: '10.0.0.7' }, want: ['10.0.0.7/32'] },
  {
    name: 'primary, dual-stack',
    configured: ['primary'],
    ips: { IPv4: '10.0.0.7', IPv6: 'fd00::7' },
    want: ['10.0.0.7/32', 'fd00::7/128'],
  },
  { name: 'primary without a node IP', configured: ['primary'], ips: {}, want: [] },
];
for (const c of primary)
  test(`resolveNodePortAddresses: ${c.name}`, () =>
    assert.deepEqual(resolveNodePortAddresses(c.configured, c.ips), c.want));

test('ProxyHealth: an ineligible node fails /healthz (nodeEligible false) but not /livez', () => {
  const h = new ProxyHealth(60_000);
  h.queuedUpdate(1000);
  h.syncStarted();
  h.updated(2000);
  assert.deepEqual(h.status(3000), {
    healthy: true,
    reason: 'ok',
    nodeEligible: true,
    lastUpdated: new Date(3000).toISOString(),
    currentTime: new Date(3000).toISOString(),
  });
  h.setNodeEligible(false);
  assert.deepEqual(h.status(3000), {
    healthy: false,
    reason: 'node-ineligible',
    nodeEligible: false,
    lastUpdated: new Date(2000).toISOString(),
    currentTime: new Date(3000).toISOString(),
  });
  assert.equal(h.status(3000, { requireSynced: false }).healthy, true);
  assert.equal(h.isLive(3000), true);
  h.setNodeEligible(true);
  assert.equal(h.status(3000).healthy, true);
});

test('ProxyHealth: staleness is reported before node eligibility', () => {
  const h = new ProxyHealth(1000);
  h.syncStarted();
  h.updated(0.5);
  h.setNodeEligible(false);
  h.queuedUpdate(10);
  assert.equal(h.status(2000).reason, 'stale');
  assert.equal(h.status(2000).nodeEligible, false);
  assert.equal(h.status(2000, { requireSynced: false }).healthy, false);
});
