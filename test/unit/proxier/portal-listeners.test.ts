import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  portalListenerKey,
  portalListenerSpecs,
  proxyProtocolOf,
  proxyProtocolSettings,
} from '../../../src/proxier/portal-listeners.ts';
import { originalDestination } from '../../../src/relay/original-destination.ts';
import { portal } from '../../helpers/portals.ts';

const lb = portal('default', 'web', 'http', {
  clusterIPs: ['10.0.0.20', 'fd00::20'],
  nodePort: 30080,
  externalIPs: ['203.0.113.7', '198.51.100.10'],
  loadBalancerIPs: ['198.51.100.10'],
}).servicePort;

test('proxyProtocolOf: the annotation, else the flag; off is none; TCP only', () => {
  assert.equal(proxyProtocolOf(lb, 'off'), undefined);
  assert.equal(proxyProtocolOf(lb, 'v1'), 'v1');
  assert.equal(proxyProtocolOf({ ...lb, proxyProtocol: 'v2' }, 'off'), 'v2');
  assert.equal(proxyProtocolOf({ ...lb, proxyProtocol: 'off' }, 'v2'), undefined);
  assert.equal(proxyProtocolOf({ ...lb, protocol: 'UDP', proxyProtocol: 'v2' }, 'v2'), undefined);
});

test('portalListenerSpecs: one listener per external destination (an IP listed twice once), none without rules', () => {
  assert.deepEqual(portalListenerSpecs(lb, undefined, true), []);
  assert.deepEqual(
    portalListenerSpecs(lb, 'v1', false),
    [],
    '--no-iptables: the listener is the destination',
  );
  const specs = portalListenerSpecs(lb, 'v2', true);
  assert.deepEqual(
    specs.map((s) => [s.key, s.list, s.destination]),
    [
      ['default/web:http/TCP/to/203.0.113.7', 'cluster', { kind: 'external-ip', ip: '203.0.113.7' }],
      ['default/web:http/TCP/to/198.51.100.10', 'cluster', { kind: 'external-ip', ip: '198.51.100.10' }],
      ['default/web:http/TCP/to/node', 'cluster', { kind: 'node-port' }],
    ],
  );
  // externalTrafficPolicy Local: a local-list listener beside each (the node and its pods keep the
  // cluster-wide list).
  const local = portalListenerSpecs({ ...lb, externalPolicyLocal: true }, 'v2', true);
  assert.equal(local.length, 6);
  assert.deepEqual(
    local.filter((s) => s.list === 'local').map((s) => s.key),
    [
      portalListenerKey(lb.key, '203.0.113.7', 'local'),
      portalListenerKey(lb.key, '198.51.100.10', 'local'),
      'default/web:http/TCP/to/node/local',
    ],
  );
});

test('originalDestination: what each kind of listener names as the destination', () => {
  const pp = proxyProtocolSettings(lb, 'v1')!;
  assert.deepEqual(pp.clusterIPs, { IPv4: '10.0.0.20', IPv6: 'fd00::20' });
  const at = (d: Parameters<typeof originalDestination>[0], family: 'IPv4' | 'IPv6' = 'IPv4') =>
    originalDestination(d, pp, family, '192.168.1.5', 41000);
  assert.deepEqual(at({ kind: 'cluster-ip' }), { address: '10.0.0.20', port: 80 });
  assert.deepEqual(at({ kind: 'cluster-ip' }, 'IPv6'), { address: 'fd00::20', port: 80 });
  assert.deepEqual(at({ kind: 'external-ip', ip: '203.0.113.7' }), { address: '203.0.113.7', port: 80 });
  assert.deepEqual(at({ kind: 'node-port' }), { address: '192.168.1.5', port: 30080 });
  assert.deepEqual(at({ kind: 'listener' }), { address: '192.168.1.5', port: 41000 });
});
