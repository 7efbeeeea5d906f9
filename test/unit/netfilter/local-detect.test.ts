import assert from 'node:assert/strict';
import { test } from 'node:test';
import { DEFAULT_CONFIG } from '../../../src/config/config.ts';
import { maskCIDR } from '../../../src/lib/ip.ts';
import {
  type LocalDetectOptions,
  localDetectOptions,
  localTrafficDetector,
} from '../../../src/netfilter/local-detect.ts';

const base: LocalDetectOptions = {
  mode: 'ClusterCIDR',
  clusterCIDRs: [],
  nodePodCIDRs: [],
  bridgeInterface: '',
  interfaceNamePrefix: '',
};

// As kube-proxy's pkg/proxy/util/localdetector.go and getLocalDetectors.
const cases: {
  name: string;
  options: Partial<LocalDetectOptions>;
  v4: string[] | undefined;
  v6: string[] | undefined;
}[] = [
  { name: 'ClusterCIDR without CIDRs: not implemented', options: {}, v4: undefined, v6: undefined },
  {
    name: 'ClusterCIDR IPv4 only',
    options: { clusterCIDRs: ['10.244.0.0/16'] },
    v4: ['-s 10.244.0.0/16', '! -s 10.244.0.0/16'],
    v6: undefined,
  },
  {
    name: 'ClusterCIDR dual-stack, IPv6 first',
    options: { clusterCIDRs: ['fd00:10:244::/56', '10.244.0.0/16'] },
    v4: ['-s 10.244.0.0/16', '! -s 10.244.0.0/16'],
    v6: ['-s fd00:10:244::/56', '! -s fd00:10:244::/56'],
  },
  {
    name: 'ClusterCIDR host bits are masked as Go prints an IPNet',
    options: { clusterCIDRs: ['10.244.7.9/16', 'fd00:10:244:0:0:0:0:1/56'] },
    v4: ['-s 10.244.0.0/16', '! -s 10.244.0.0/16'],
    v6: ['-s fd00:10:244::/56', '! -s fd00:10:244::/56'],
  },
  {
    name: 'NodeCIDR uses the Node podCIDRs, not the cluster CIDR',
    options: {
      mode: 'NodeCIDR',
      clusterCIDRs: ['10.244.0.0/16'],
      nodePodCIDRs: ['10.244.3.0/24', 'fd00:1::/64'],
    },
    v4: ['-s 10.244.3.0/24', '! -s 10.244.3.0/24'],
    v6: ['-s fd00:1::/64', '! -s fd00:1::/64'],
  },
  {
    name: 'NodeCIDR before the podCIDR is allocated',
    options: { mode: 'NodeCIDR' },
    v4: undefined,
    v6: undefined,
  },
  {
    name: 'BridgeInterface, both families',
    options: { mode: 'BridgeInterface', bridgeInterface: 'cbr0', clusterCIDRs: ['10.244.0.0/16'] },
    v4: ['-i cbr0', '! -i cbr0'],
    v6: ['-i cbr0', '! -i cbr0'],
  },
  {
    name: 'InterfaceNamePrefix is a wildcard',
    options: { mode: 'InterfaceNamePrefix', interfaceNamePrefix: 'veth' },
    v4: ['-i veth+', '! -i veth+'],
    v6: ['-i veth+', '! -i veth+'],
  },
  {
    name: 'InterfaceNamePrefix without a prefix',
    options: { mode: 'InterfaceNamePrefix' },
    v4: undefined,
    v6: undefined,
  },
];
for (const c of cases)
  test(`localTrafficDetector: ${c.name}`, () => {
    const options = { ...base, ...c.options };
    const pair = (d: ReturnType<typeof localTrafficDetector>) =>
      d === undefined ? undefined : [d.ifLocal, d.ifNotLocal];
    assert.deepEqual(pair(localTrafficDetector(options, 'IPv4')), c.v4);
    assert.deepEqual(pair(localTrafficDetector(options, 'IPv6')), c.v6);
  });

test('localDetectOptions reads the config', () => {
  const options = localDetectOptions(
    {
      ...DEFAULT_CONFIG,
      detectLocalMode: 'NodeCIDR',
      clusterCIDRs: ['10.0.0.0/8'],
      podBridgeInterface: 'br0',
    },
    ['10.0.1.0/24'],
  );
  assert.deepEqual(options, {
    mode: 'NodeCIDR',
    clusterCIDRs: ['10.0.0.0/8'],
    nodePodCIDRs: ['10.0.1.0/24'],
    bridgeInterface: 'br0',
    interfaceNamePrefix: '',
  });
});

const masks = [
  { input: '10.244.0.0/16', want: '10.244.0.0/16' },
  { input: '192.168.1.77/0', want: '0.0.0.0/0' },
  { input: '255.255.255.255/31', want: '255.255.255.254/31' },
  { input: 'FD00::1/64', want: 'fd00::/64' },
  { input: '2001:db8:0:0:1::1/80', want: '2001:db8:0:0:1::/80' },
  { input: '::ffff:0:0/96', want: '::ffff:0.0.0.0/96' },
  { input: '::1/128', want: '::1/128' },
];
for (const c of masks) test(`maskCIDR(${c.input})`, () => assert.equal(maskCIDR(c.input), c.want));
