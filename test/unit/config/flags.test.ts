import assert from 'node:assert/strict';
import { test } from 'node:test';
import { DEFAULT_CONFIG } from '../../../src/config/config.ts';
import { parseArgs } from '../../../src/config/flags.ts';
import { formatDuration, parseDuration } from '../../../src/config/validate.ts';
import { isProxyError } from '../../../src/lib/errors.ts';
import { parseHostPort } from '../../../src/lib/host-port.ts';

test("defaults are kube-proxy's", async () => {
  const { config } = await parseArgs(['--manifest', 'x.yaml']);
  assert.deepEqual(config, { ...DEFAULT_CONFIG, manifest: 'x.yaml' });
  assert.equal(config.udpTimeoutMs, 250);
  assert.equal(config.iptablesSyncPeriodMs, 30_000);
  assert.equal(config.iptablesMinSyncPeriodMs, 1_000);
  assert.equal(config.healthzBindAddress, '0.0.0.0:10256');
  assert.equal(config.metricsBindAddress, '127.0.0.1:10249');
});

test('flags set the config', async () => {
  const { config } = await parseArgs([
    '--manifest=m.yaml',
    '--bind-address=10.0.0.5',
    '--proxy-port-range=30000-30999',
    '--udp-timeout=2s',
    '--iptables-sync-period=1m',
    '--iptables-min-sync-period=0',
    '--nodeport-addresses=10.0.0.0/8,fd00::/64',
    '--hostname-override=Node-A',
    '--no-iptables',
    '--v=2',
    '--metrics-bind-address=',
  ]);
  assert.equal(config.bindAddress, '10.0.0.5');
  assert.equal(config.proxyPortRange, '30000-30999');
  assert.equal(config.udpTimeoutMs, 2000);
  assert.equal(config.iptablesSyncPeriodMs, 60_000);
  assert.equal(config.iptablesMinSyncPeriodMs, 0);
  assert.deepEqual(config.nodePortAddresses, ['10.0.0.0/8', 'fd00::/64']);
  assert.equal(config.hostnameOverride, 'node-a');
  assert.equal(config.iptables, false);
  assert.equal(config.verbosity, 2);
  assert.equal(config.metricsBindAddress, '');
});

const bad = [
  { name: 'bad IP', args: ['--bind-address=10.0.0.300'], want: /--bind-address/ },
  { name: 'localhost bind', args: ['--bind-address=127.0.0.1'], want: /localhost/ },
  { name: 'bad duration', args: ['--udp-timeout=fast'], want: /--udp-timeout/ },
  { name: 'zero udp timeout', args: ['--udp-timeout=0'], want: /greater than 0/ },
  { name: 'reversed port range', args: ['--proxy-port-range=200-100'], want: /proxy-port-range/ },
  { name: 'unknown flag', args: ['--healthz-port=10256'], want: /Unknown argument: healthz-port/ },
  { name: 'another proxy mode', args: ['--proxy-mode=iptables'], want: /only implements the userspace mode/ },
  { name: 'bad content type', args: ['--kube-api-content-type=text/plain'], want: /--kube-api-content-type/ },
  { name: 'negative qps', args: ['--kube-api-qps=-1'], want: /--kube-api-qps -1: must be a number >= 0/ },
  { name: 'negative burst', args: ['--kube-api-burst=-1'], want: /--kube-api-burst/ },
  { name: 'negative conntrack min', args: ['--conntrack-min=-1'], want: /--conntrack-min/ },
  {
    name: 'bad conntrack timeout',
    args: ['--conntrack-tcp-timeout-established=forever'],
    want: /--conntrack-tcp-timeout-established "forever"/,
  },
  { name: 'unknown trace mode', args: ['--trace=all'], want: /Invalid values/ },
  {
    name: 'nodeport keyword other than primary',
    args: ['--nodeport-addresses=all'],
    want: /"all": not a CIDR/,
  },
  {
    name: 'primary beside CIDRs',
    args: ['--nodeport-addresses=primary,10.0.0.0/8'],
    want: /can't use both 'primary' and CIDRs/,
  },
  {
    name: 'bad cluster CIDR',
    args: ['--cluster-cidr=10.244.0.0'],
    want: /--cluster-cidr "10\.244\.0\.0": not a CIDR/,
  },
  {
    name: 'two cluster CIDRs of one family',
    args: ['--cluster-cidr=10.244.0.0/16,10.245.0.0/16'],
    want: /at most one CIDR per IP family/,
  },
  {
    name: 'three cluster CIDRs',
    args: ['--cluster-cidr=10.244.0.0/16,fd00::/48,10.245.0.0/16'],
    want: /at most one CIDR per IP family/,
  },
  {
    name: 'unknown local mode',
    args: ['--detect-local-mode=PodCIDR'],
    want: /--detect-local-mode "PodCIDR": expected one of ClusterCIDR, NodeCIDR/,
  },
  {
    name: 'bridge mode without a bridge',
    args: ['--detect-local-mode=BridgeInterface'],
    want: /--detect-local-mode=BridgeInterface needs a non-empty --pod-bridge-interface/,
  },
  {
    name: 'prefix mode without a prefix',
    args: ['--detect-local-mode=InterfaceNamePrefix', '--pod-interface-name-prefix= '],
    want: /needs a non-empty --pod-interface-name-prefix/,
  },
  { name: 'zero udp sessions', args: ['--udp-max-sessions=0'], want: /--udp-max-sessions/ },
  {
    name: 'min above max',
    args: ['--iptables-min-sync-period=1m', '--iptables-sync-period=30s'],
    want: /must not exceed/,
  },
  { name: 'bad CIDR', args: ['--nodeport-addresses=10.0.0.0'], want: /not a CIDR/ },
  {
    name: 'bad healthz address',
    args: ['--healthz-bind-address=localhost:10256'],
    want: /healthz-bind-address/,
  },
  { name: 'oom out of range', args: ['--oom-score-adj=5000'], want: /oom-score-adj/ },
  { name: 'two sources', args: ['--manifest=a', '--kubeconfig=b'], want: /pick one source/ },
  { name: 'stray argument', args: ['serve'], want: /Unknown argument: serve/ },
];
for (const c of bad) {
  test(`rejects ${c.name}`, async () => {
    await assert.rejects(parseArgs(c.args), (err: Error) => {
      assert.match(err.message, c.want);
      return isProxyError(err, 'KUP_ERR_INVALID_FLAG');
    });
  });
}

test('kube-proxy flags that mean something here set the config', async () => {
  const { config, warnings } = await parseArgs([
    '--manifest=m.yaml',
    '--proxy-mode=userspace',
    '--conntrack-max-per-core=0',
    '--conntrack-min=0',
    '--conntrack-tcp-timeout-established=0',
    '--conntrack-tcp-timeout-close-wait=0s',
    '--kube-api-qps=20.5',
    '--kube-api-burst=40',
    '--kube-api-content-type=application/json',
    '--trace=none',
  ]);
  assert.equal(config.kubeApiQps, 20.5);
  assert.equal(config.kubeApiBurst, 40);
  assert.equal(config.kubeApiContentType, 'application/json');
  assert.equal(config.trace, 'none');
  assert.equal(config.conntrackMaxPerCore, 0);
  // Zero conntrack settings mean "leave as is", which is all this proxy does: nothing to warn about.
  assert.deepEqual(warnings, []);
});

test('settings accepted but not applied are warned about once', async () => {
  const { config, warnings } = await parseArgs([
    '--conntrack-max-per-core=65536',
    '--conntrack-tcp-timeout-established=12h',
    '--profiling',
    '--masquerade-all',
    '--ipvs-scheduler=rr',
  ]);
  assert.equal(config.conntrackMaxPerCore, 65536);
  assert.equal(config.conntrackTcpEstablishedTimeoutMs, 12 * 3_600_000);
  assert.equal(config.profiling, true);
  // Conntrack settings are applied now (netfilter/conntrack-settings.ts): no warning for them.
  assert.equal(warnings.length, 2);
  assert.match(warnings[0]!, /Ignored flags .*: --masquerade-all, --ipvs-scheduler$/);
  assert.match(warnings[1]!, /Profiling/);
});

test("conntrack defaults are kube-proxy's", async () => {
  const { config } = await parseArgs([]);
  assert.equal(config.conntrackMaxPerCore, 32768);
  assert.equal(config.conntrackMin, 131072);
  assert.equal(config.conntrackTcpEstablishedTimeoutMs, 24 * 3_600_000);
  assert.equal(config.conntrackTcpCloseWaitTimeoutMs, 3_600_000);
});

const localDetect = [
  { name: 'default', args: [], want: { clusterCIDRs: [], detectLocalMode: 'ClusterCIDR' } },
  {
    name: 'dual-stack cluster CIDR',
    args: ['--cluster-cidr=10.244.0.0/16, fd00:10:244::/56'],
    want: { clusterCIDRs: ['10.244.0.0/16', 'fd00:10:244::/56'], detectLocalMode: 'ClusterCIDR' },
  },
  {
    name: 'empty mode means ClusterCIDR',
    args: ['--detect-local-mode=', '--cluster-cidr=10.244.0.0/16'],
    want: { clusterCIDRs: ['10.244.0.0/16'], detectLocalMode: 'ClusterCIDR' },
  },
  {
    name: 'NodeCIDR',
    args: ['--detect-local-mode=NodeCIDR'],
    want: { clusterCIDRs: [], detectLocalMode: 'NodeCIDR' },
  },
  {
    name: 'BridgeInterface',
    args: ['--detect-local-mode=BridgeInterface', '--pod-bridge-interface=cbr0'],
    want: { clusterCIDRs: [], detectLocalMode: 'BridgeInterface', podBridgeInterface: 'cbr0' },
  },
  {
    name: 'InterfaceNamePrefix',
    args: ['--detect-local-mode=InterfaceNamePrefix', '--pod-interface-name-prefix=veth'],
    want: { clusterCIDRs: [], detectLocalMode: 'InterfaceNamePrefix', podInterfaceNamePrefix: 'veth' },
  },
  {
    name: 'nodeport primary',
    args: ['--nodeport-addresses=primary'],
    want: { nodePortAddresses: ['primary'] },
  },
];
for (const c of localDetect) {
  test(`local detection and NodePort flags: ${c.name}`, async () => {
    const { config, warnings } = await parseArgs(c.args);
    const got = Object.fromEntries(Object.keys(c.want).map((k) => [k, config[k as keyof typeof config]]));
    assert.deepEqual(got, c.want);
    assert.deepEqual(warnings, []);
  });
}

test('server addresses: a bare IP gets the port, IPv6 binds move the defaults', async () => {
  const bare = await parseArgs(['--healthz-bind-address=10.0.0.5', '--metrics-bind-address=::1']);
  assert.equal(bare.config.healthzBindAddress, '10.0.0.5:10256');
  assert.equal(bare.config.metricsBindAddress, '[::1]:10249');
  const v6 = await parseArgs(['--bind-address=fd00::5']);
  assert.equal(v6.config.healthzBindAddress, '[::]:10256');
  assert.equal(v6.config.metricsBindAddress, '[::1]:10249');
  const given = await parseArgs(['--bind-address=fd00::5', '--metrics-bind-address=']);
  assert.equal(given.config.metricsBindAddress, '');
});

test('a flag given twice: the last one wins', async () => {
  const { config } = await parseArgs(['--udp-timeout=1s', '--udp-timeout=3s']);
  assert.equal(config.udpTimeoutMs, 3000);
});

test('--write-config-to and --config are returned', async () => {
  const parsed = await parseArgs(['--write-config-to=/tmp/out.yaml']);
  assert.equal(parsed.writeConfigTo, '/tmp/out.yaml');
  assert.equal(parsed.configFile, undefined);
  assert.deepEqual(parsed.config, DEFAULT_CONFIG);
});

test('--help and --version', async () => {
  const help = await parseArgs(['--help']);
  assert.match(help.help!, /--proxy-port-range/);
  assert.match(help.help!, /--no-iptables/);
  assert.match(help.help!, /--config /);
  assert.match(help.help!, /--trace/);
  assert.match(help.help!, /ignored .*--masquerade-all/s);
  assert.match(help.help!, /--detect-local-mode/);
  assert.equal((await parseArgs(['--version'])).version, true);
});

const durations = [
  { input: '250ms', ms: 250 },
  { input: '30s', ms: 30_000 },
  { input: '1h30m', ms: 5_400_000 },
  { input: '1.5s', ms: 1500 },
  { input: '0', ms: 0 },
  { input: '15', ms: undefined },
  { input: '-1s', ms: undefined },
];
for (const d of durations)
  test(`parseDuration(${d.input})`, () => assert.equal(parseDuration(d.input), d.ms));

test('formatDuration prints Go style', () => {
  assert.equal(formatDuration(250), '250ms');
  assert.equal(formatDuration(30_000), '30s');
  assert.equal(formatDuration(900_000), '15m0s');
});

test('parseHostPort', () => {
  assert.deepEqual(parseHostPort('0.0.0.0:10256'), { host: '0.0.0.0', port: 10256 });
  assert.deepEqual(parseHostPort('[::1]:10249'), { host: '::1', port: 10249 });
  assert.deepEqual(parseHostPort(':8080'), { host: '0.0.0.0', port: 8080 });
  assert.equal(parseHostPort('127.0.0.1'), undefined);
  assert.equal(parseHostPort('127.0.0.1:99999'), undefined);
});
