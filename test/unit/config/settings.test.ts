// The settings table: exactly one row per Config key, and a non-default value of every row survives
// flags → Config → written KubeProxyConfiguration → read back.
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import type { Config } from '../../../src/config/config.ts';
import { DEFAULT_CONFIG } from '../../../src/config/config.ts';
import { parseConfigFile, renderConfigFile, writeConfigFile } from '../../../src/config/file.ts';
import { parseArgs } from '../../../src/config/flags.ts';
import { SETTINGS } from '../../../src/config/settings.ts';

// One entry per Config key (the type checker holds this list to Config): a flag giving a value that is
// not the default, and the value it must give. Zeros where kube-proxy's file would read them as unset.
const SAMPLES: { readonly [K in keyof Config]: { readonly arg: string; readonly want: Config[K] } } = {
  manifest: { arg: '--manifest=m.yaml', want: 'm.yaml' },
  kubeconfig: { arg: '--kubeconfig=/etc/k.conf', want: '/etc/k.conf' },
  master: { arg: '--master=https://10.0.0.1:6443', want: 'https://10.0.0.1:6443' },
  hostnameOverride: { arg: '--hostname-override= Node-A ', want: 'node-a' },
  bindAddress: { arg: '--bind-address=10.0.0.5', want: '10.0.0.5' },
  proxyPortRange: { arg: '--proxy-port-range=30000+99', want: '30000+99' },
  udpTimeoutMs: { arg: '--udp-timeout=2s', want: 2000 },
  udpMaxSessions: { arg: '--udp-max-sessions=100', want: 100 },
  udpMaxSessionsTotal: { arg: '--udp-max-sessions-total=5000', want: 5000 },
  maxConnectionsPerService: { arg: '--max-connections-per-service=50', want: 50 },
  stateFile: { arg: '--state-file=', want: '' },
  iptablesSyncPeriodMs: { arg: '--iptables-sync-period=2m', want: 120_000 },
  iptablesMinSyncPeriodMs: { arg: '--iptables-min-sync-period=2500ms', want: 2500 },
  configSyncPeriodMs: { arg: '--config-sync-period=1h', want: 3_600_000 },
  healthzBindAddress: { arg: '--healthz-bind-address=10.0.0.5', want: '10.0.0.5:10256' },
  metricsBindAddress: { arg: '--metrics-bind-address=[::1]:9999', want: '[::1]:9999' },
  bindAddressHardFail: { arg: '--bind-address-hard-fail', want: true },
  nodePortAddresses: { arg: '--nodeport-addresses=10.0.0.0/8,fd00::/64', want: ['10.0.0.0/8', 'fd00::/64'] },
  clusterCIDRs: { arg: '--cluster-cidr=10.244.0.0/16,fd00::/56', want: ['10.244.0.0/16', 'fd00::/56'] },
  detectLocalMode: { arg: '--detect-local-mode=BridgeInterface', want: 'BridgeInterface' },
  podBridgeInterface: { arg: '--pod-bridge-interface=cbr0', want: 'cbr0' },
  podInterfaceNamePrefix: { arg: '--pod-interface-name-prefix=veth', want: 'veth' },
  cleanup: { arg: '--cleanup', want: true },
  oomScoreAdj: { arg: '--oom-score-adj=0', want: 0 },
  conntrackMaxPerCore: { arg: '--conntrack-max-per-core=0', want: 0 },
  conntrackMin: { arg: '--conntrack-min=65536', want: 65536 },
  conntrackTcpEstablishedTimeoutMs: { arg: '--conntrack-tcp-timeout-established=12h', want: 43_200_000 },
  conntrackTcpCloseWaitTimeoutMs: { arg: '--conntrack-tcp-timeout-close-wait=0', want: 0 },
  kubeApiQps: { arg: '--kube-api-qps=7.5', want: 7.5 },
  kubeApiBurst: { arg: '--kube-api-burst=20', want: 20 },
  kubeApiContentType: { arg: '--kube-api-content-type=application/json', want: 'application/json' },
  profiling: { arg: '--profiling', want: true },
  iptables: { arg: '--no-iptables', want: false },
  verbosity: { arg: '--v=4', want: 4 },
  tcpIdleTimeoutMs: { arg: '--tcp-idle-timeout=5m', want: 300_000 },
  tcpHalfCloseTimeoutMs: { arg: '--tcp-half-close-timeout=30s', want: 30_000 },
  tcpStallTimeoutMs: { arg: '--tcp-stall-timeout=2m', want: 120_000 },
  outlierConsecutiveFailures: { arg: '--outlier-consecutive-failures=0', want: 0 },
  outlierBaseEjectionMs: { arg: '--outlier-base-ejection-time=1s', want: 1000 },
  shutdownGracePeriodMs: { arg: '--shutdown-grace-period=30s', want: 30_000 },
  workers: { arg: '--workers=3', want: 3 },
  trace: { arg: '--trace=none', want: 'none' },
  proxyProtocol: { arg: '--proxy-protocol=v2', want: 'v2' },
  accessLog: { arg: '--access-log', want: true },
  traceRecentConnections: { arg: '--trace-recent-connections=10', want: 10 },
  logFormat: { arg: '--log-format=text', want: 'text' },
};
const KEYS = Object.keys(SAMPLES) as (keyof Config)[];

const keyed = SETTINGS.flatMap((s) => (s.key === undefined ? [] : [s.key]));

test('every Config key has exactly one row, and every row a Config key', () => {
  assert.deepEqual([...keyed].sort(), [...KEYS].sort());
  assert.equal(new Set(keyed).size, keyed.length);
  assert.deepEqual(Object.keys(DEFAULT_CONFIG).sort(), [...KEYS].sort());
});

test('flag names and file fields are each used once', () => {
  const flags = SETTINGS.map((s) => s.flag);
  assert.equal(new Set(flags).size, flags.length);
  const files = SETTINGS.flatMap((s) => (s.file === undefined ? [] : [s.file]));
  assert.equal(new Set(files).size, files.length);
});

test('--help lists every row', async () => {
  const { help } = await parseArgs(['--help']);
  for (const s of SETTINGS) assert.match(help!, new RegExp(`^\\s+(--|-)${s.flag}\\s`, 'm'), s.flag);
});

test('each sample is not the default and parses to what it says', async () => {
  for (const key of KEYS) {
    const { arg, want } = SAMPLES[key];
    assert.notDeepEqual(want, DEFAULT_CONFIG[key], key);
    // The interface modes need their interface; the sample values differ from the default anyway.
    const needs = key === 'detectLocalMode' ? [SAMPLES.podBridgeInterface.arg] : [];
    const { config } = await parseArgs([arg, ...needs]);
    assert.deepEqual(config[key], want, arg);
  }
});

// --manifest cannot be combined with --kubeconfig or --master, so it goes round on its own.
const rounds = [KEYS.filter((k) => k !== 'manifest'), ['manifest' as const]];
for (const keys of rounds)
  test(`flags → Config → written file → read back: ${keys.length} settings`, async (t) => {
    const dir = await mkdtemp(join(tmpdir(), 'kup-settings-'));
    t.after(() => rm(dir, { recursive: true, force: true }));
    const { config } = await parseArgs(keys.map((k) => SAMPLES[k].arg));
    for (const key of keys) assert.deepEqual(config[key], SAMPLES[key].want, key);

    const file = join(dir, 'written.conf');
    await writeConfigFile(file, config);
    // The file alone gives back every row it has a field for.
    const inFile = keyed.filter((k) => SETTINGS.find((s) => s.key === k)!.file !== undefined);
    const { config: read, ignored } = parseConfigFile(renderConfigFile(config), file);
    assert.deepEqual(ignored, []);
    for (const key of inFile) assert.deepEqual({ ...DEFAULT_CONFIG, ...read }[key], config[key], key);
    // With the flags that have no field, --config reads back the whole Config.
    const own = keys.filter((k) => !inFile.includes(k)).map((k) => SAMPLES[k].arg);
    const again = await parseArgs(['--config', file, ...own]);
    assert.deepEqual(again.config, config);
  });
