import assert from 'node:assert/strict';
import { test } from 'node:test';
import { DEFAULT_CONFIG } from '../../src/config/config.ts';
import { parseArgs } from '../../src/config/flags.ts';
import { formatDuration, parseDuration, parseHostPort } from '../../src/config/validate.ts';
import { isProxyError } from '../../src/errors.ts';

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
  { name: 'unknown flag', args: ['--proxy-mode=iptables'], want: /Unknown argument/ },
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

test('--help and --version', async () => {
  const help = await parseArgs(['--help']);
  assert.match(help.help!, /--proxy-port-range/);
  assert.match(help.help!, /--no-iptables/);
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
