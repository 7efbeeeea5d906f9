import assert from 'node:assert/strict';
import { test } from 'node:test';
import { nodePortHostsFor } from '../../../src/proxier/node-port-claims.ts';

const cases: { name: string; clusterIPs: string[]; hosts: string[]; want: string[] }[] = [
  {
    name: 'an IPv4-only service is not held on ::, which would answer it over IPv6',
    clusterIPs: ['10.96.0.1'],
    hosts: ['::'],
    want: ['0.0.0.0'],
  },
  { name: 'an IPv6-only service keeps ::', clusterIPs: ['fd00::1'], hosts: ['::'], want: ['::'] },
  {
    name: 'a dual-stack service keeps ::',
    clusterIPs: ['10.96.0.1', 'fd00::1'],
    hosts: ['::'],
    want: ['::'],
  },
  {
    name: 'node addresses (--nodeport-addresses): only those of the service family',
    clusterIPs: ['10.96.0.1'],
    hosts: ['192.168.1.5', 'fd00:50::2'],
    want: ['192.168.1.5'],
  },
  {
    name: 'node addresses, IPv6-only service',
    clusterIPs: ['fd00::1'],
    hosts: ['192.168.1.5', 'fd00:50::2'],
    want: ['fd00:50::2'],
  },
  {
    name: 'node addresses, dual-stack service: all',
    clusterIPs: ['fd00::1', '10.96.0.1'],
    hosts: ['192.168.1.5', 'fd00:50::2'],
    want: ['192.168.1.5', 'fd00:50::2'],
  },
];

for (const c of cases)
  test(c.name, () =>
    assert.deepEqual(nodePortHostsFor({ clusterIPs: c.clusterIPs } as never, c.hosts), c.want),
  );
