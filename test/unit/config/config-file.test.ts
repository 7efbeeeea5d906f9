// The --config file: KubeProxyConfiguration fields → Config, unknown fields, zero values, rendering, and
// the precedence defaults < file < flags.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { closeSync, constants, openSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import type { Config } from '../../../src/config/config.ts';
import { DEFAULT_CONFIG } from '../../../src/config/config.ts';
import {
  loadConfigFile,
  parseConfigFile,
  renderConfigFile,
  writeConfigFile,
} from '../../../src/config/file.ts';
import { parseArgs } from '../../../src/config/flags.ts';
import { isProxyError } from '../../../src/lib/errors.ts';

const HEAD = 'apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n';

// What `kubeadm init` writes into the kube-proxy ConfigMap: every field, "unset" spelled as "", 0s, null.
const KUBEADM = `${HEAD}bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 10.244.0.0/16
configSyncPeriod: 0s
conntrack:
  maxPerCore: null
  min: null
  tcpBeLiberal: false
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: ""
mode: ""
nftables:
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
nodePortAddresses: null
oomScoreAdj: null
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
`;

test("a kubeadm-written file means kube-proxy's defaults; only what is set and applies counts", () => {
  const { config, ignored } = parseConfigFile(KUBEADM, 'config.conf');
  assert.deepEqual(config, {
    bindAddress: '0.0.0.0',
    bindAddressHardFail: false,
    kubeconfig: '/var/lib/kube-proxy/kubeconfig.conf',
    clusterCIDRs: ['10.244.0.0/16'],
    profiling: false,
    verbosity: 0,
    proxyPortRange: '',
  });
  assert.deepEqual(ignored, []);
});

const fields: { name: string; yaml: string; want: Partial<Config> }[] = [
  { name: 'bindAddress', yaml: 'bindAddress: 10.0.0.5', want: { bindAddress: '10.0.0.5' } },
  { name: 'portRange', yaml: 'portRange: 30000-30999', want: { proxyPortRange: '30000-30999' } },
  { name: 'udpIdleTimeout', yaml: 'udpIdleTimeout: 2s', want: { udpTimeoutMs: 2000 } },
  {
    name: 'iptables periods',
    yaml: 'iptables:\n  syncPeriod: 1m0s\n  minSyncPeriod: 500ms',
    want: { iptablesSyncPeriodMs: 60_000, iptablesMinSyncPeriodMs: 500 },
  },
  { name: 'configSyncPeriod', yaml: 'configSyncPeriod: 1h', want: { configSyncPeriodMs: 3_600_000 } },
  {
    name: 'server addresses (bare IPs get the port)',
    yaml: 'healthzBindAddress: 0.0.0.0\nmetricsBindAddress: "[::]:9999"',
    want: { healthzBindAddress: '0.0.0.0:10256', metricsBindAddress: '[::]:9999' },
  },
  { name: 'bindAddressHardFail', yaml: 'bindAddressHardFail: true', want: { bindAddressHardFail: true } },
  {
    name: 'clientConnection',
    yaml: 'clientConnection:\n  kubeconfig: /k.conf\n  qps: 50\n  burst: 100\n  contentType: application/json',
    want: {
      kubeconfig: '/k.conf',
      kubeApiQps: 50,
      kubeApiBurst: 100,
      kubeApiContentType: 'application/json',
    },
  },
  { name: 'hostnameOverride', yaml: 'hostnameOverride: " Node-A "', want: { hostnameOverride: 'node-a' } },
  {
    name: 'nodePortAddresses',
    yaml: 'nodePortAddresses: [10.0.0.0/8, "fd00::/64"]',
    want: { nodePortAddresses: ['10.0.0.0/8', 'fd00::/64'] },
  },
  { name: 'oomScoreAdj 0 is a value', yaml: 'oomScoreAdj: 0', want: { oomScoreAdj: 0 } },
  {
    name: 'conntrack',
    yaml: 'conntrack:\n  maxPerCore: 0\n  min: 131072\n  tcpEstablishedTimeout: 24h0m0s\n  tcpCloseWaitTimeout: 1h',
    want: {
      conntrackMaxPerCore: 0,
      conntrackMin: 131072,
      conntrackTcpEstablishedTimeoutMs: 86_400_000,
      conntrackTcpCloseWaitTimeoutMs: 3_600_000,
    },
  },
  { name: 'mode userspace', yaml: 'mode: userspace', want: {} },
  { name: 'enableProfiling', yaml: 'enableProfiling: true', want: { profiling: true } },
  {
    name: 'logging',
    yaml: 'logging:\n  format: text\n  verbosity: 4',
    want: { logFormat: 'text', verbosity: 4 },
  },
  {
    name: 'clusterCIDR (dual-stack)',
    yaml: 'clusterCIDR: 10.244.0.0/16,fd00:10:244::/56',
    want: { clusterCIDRs: ['10.244.0.0/16', 'fd00:10:244::/56'] },
  },
  {
    name: 'detectLocalMode NodeCIDR',
    yaml: 'detectLocalMode: NodeCIDR',
    want: { detectLocalMode: 'NodeCIDR' },
  },
  {
    name: 'detectLocal',
    yaml: 'detectLocalMode: BridgeInterface\ndetectLocal:\n  bridgeInterface: cbr0\n  interfaceNamePrefix: veth',
    want: { detectLocalMode: 'BridgeInterface', podBridgeInterface: 'cbr0', podInterfaceNamePrefix: 'veth' },
  },
  {
    name: 'nodePortAddresses primary',
    yaml: 'nodePortAddresses: [primary]',
    want: { nodePortAddresses: ['primary'] },
  },
];
for (const c of fields)
  test(`field ${c.name}`, () => {
    const { config, ignored } = parseConfigFile(HEAD + c.yaml, 'c.yaml');
    assert.deepEqual(config, c.want);
    assert.deepEqual(ignored, []);
  });

test('JSON works too', () => {
  const text = JSON.stringify({
    apiVersion: 'kubeproxy.config.k8s.io/v1alpha1',
    kind: 'KubeProxyConfiguration',
    iptables: { syncPeriod: '10s' },
  });
  assert.deepEqual(parseConfigFile(text, 'c.json').config, { iptablesSyncPeriodMs: 10_000 });
});

test('fields that do not apply are accepted and listed once', () => {
  const { config, ignored } = parseConfigFile(
    `${HEAD}featureGates: { SomeGate: true }
iptables: { masqueradeBit: 14, masqueradeAll: true, syncPeriod: 30s }
ipvs: { scheduler: rr, strictARP: true }
nftables: { syncPeriod: 0s }
conntrack: { tcpBeLiberal: true, udpTimeout: 30s }
winkernel: { enableDSR: true }
logging: { flushFrequency: 5s, vmodule: [{ filePattern: x, verbosity: 4 }] }
`,
    'c.yaml',
  );
  assert.deepEqual(config, { iptablesSyncPeriodMs: 30_000 });
  assert.deepEqual(ignored, [
    'featureGates',
    'iptables.masqueradeBit',
    'iptables.masqueradeAll',
    'ipvs',
    'conntrack.tcpBeLiberal',
    'conntrack.udpTimeout',
    'winkernel',
    'logging.flushFrequency',
    'logging.vmodule',
  ]);
});

const bad: { name: string; text: string; want: RegExp }[] = [
  {
    name: 'unknown top-level field',
    text: `${HEAD}bindAdress: 1.2.3.4`,
    want: /c\.yaml:3:13: unknown field "bindAdress"/,
  },
  {
    name: 'unknown nested field',
    text: `${HEAD}iptables:\n  syncPerod: 30s`,
    want: /c\.yaml:4:14: unknown field "iptables\.syncPerod"/,
  },
  {
    name: 'unknown field in an ignored struct',
    text: `${HEAD}ipvs:\n  foo: 1`,
    want: /unknown field "ipvs\.foo"/,
  },
  {
    name: 'field names are case-sensitive',
    text: `${HEAD}BindAddress: 1.2.3.4`,
    want: /unknown field "BindAddress"/,
  },
  {
    name: 'wrong apiVersion',
    text: 'apiVersion: kubeproxy.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration',
    want: /apiVersion is "kubeproxy\.config\.k8s\.io\/v1beta1", expected "kubeproxy\.config\.k8s\.io\/v1alpha1"/,
  },
  { name: 'missing apiVersion', text: 'kind: KubeProxyConfiguration', want: /apiVersion is undefined/ },
  {
    name: 'wrong kind',
    text: 'apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration',
    want: /kind is "KubeletConfiguration"/,
  },
  { name: 'not an object', text: '- a\n- b', want: /expected a KubeProxyConfiguration object/ },
  { name: 'empty file', text: '', want: /the file is empty/ },
  {
    name: 'two documents',
    text: `${HEAD}---\n${HEAD}`,
    want: /c\.yaml:3:1: holds more than one YAML document/,
  },
  {
    name: 'duplicate key',
    text: `${HEAD}mode: ""\nmode: userspace`,
    want: /c\.yaml:4:1: Map keys must be unique/,
  },
  { name: 'syntax error', text: `${HEAD}iptables: [`, want: /c\.yaml:\d+:\d+: / },
  {
    name: 'bad duration',
    text: `${HEAD}udpIdleTimeout: fast`,
    want: /c\.yaml:3:17: invalid udpIdleTimeout "fast"/,
  },
  {
    name: 'duration as a number',
    text: `${HEAD}configSyncPeriod: 30`,
    want: /configSyncPeriod 30: expected a string/,
  },
  { name: 'other proxy mode', text: `${HEAD}mode: iptables`, want: /only implements the userspace mode/ },
  {
    name: 'oom out of range',
    text: `${HEAD}oomScoreAdj: 5000`,
    want: /oomScoreAdj 5000: must be an integer in/,
  },
  {
    name: 'localhost bind',
    text: `${HEAD}bindAddress: 127.0.0.1`,
    want: /bindAddress "127\.0\.0\.1": cannot proxy/,
  },
  {
    name: 'reversed port range',
    text: `${HEAD}portRange: 200-100`,
    want: /portRange "200-100": the end is below/,
  },
  {
    name: 'CIDRs as a string',
    text: `${HEAD}nodePortAddresses: 10.0.0.0/8`,
    want: /expected a list of strings/,
  },
  {
    name: 'not a CIDR',
    text: `${HEAD}nodePortAddresses: [10.0.0.1]`,
    want: /nodePortAddresses "10\.0\.0\.1": not a CIDR/,
  },
  {
    name: 'primary beside a CIDR',
    text: `${HEAD}nodePortAddresses: [primary, 10.0.0.0/8]`,
    want: /nodePortAddresses "primary,10\.0\.0\.0\/8": can't use both 'primary' and CIDRs/,
  },
  {
    name: 'bad clusterCIDR',
    text: `${HEAD}clusterCIDR: 10.244.0.0/33`,
    want: /clusterCIDR "10\.244\.0\.0\/33": not a CIDR/,
  },
  {
    name: 'two clusterCIDRs of one family',
    text: `${HEAD}clusterCIDR: fd00::/48,fd01::/48`,
    want: /clusterCIDR "fd00::\/48,fd01::\/48": may only contain at most one CIDR per IP family/,
  },
  {
    name: 'unknown detectLocalMode',
    text: `${HEAD}detectLocalMode: Foo`,
    want: /detectLocalMode "Foo": expected one of/,
  },
  {
    name: 'unknown detectLocal field',
    text: `${HEAD}detectLocal: { clusterCIDRs: [] }`,
    want: /unknown field "detectLocal\.clusterCIDRs"/,
  },
  { name: 'struct as a string', text: `${HEAD}iptables: fast`, want: /iptables "fast": expected an object/ },
  { name: 'bad log format', text: `${HEAD}logging: { format: xml }`, want: /logging\.format "xml"/ },
  {
    name: 'bad content type',
    text: `${HEAD}clientConnection: { contentType: text/plain }`,
    want: /clientConnection\.contentType "text\/plain"/,
  },
];
for (const c of bad)
  test(`rejects ${c.name}`, () => {
    assert.throws(
      () => parseConfigFile(c.text, 'c.yaml'),
      (err: Error) => {
        assert.match(err.message, c.want);
        assert.match(err.message, /^config file c\.yaml/);
        return isProxyError(err, 'KUP_ERR_CONFIG_FILE');
      },
    );
  });

test('a missing file is KUP_ERR_CONFIG_FILE', async () => {
  await assert.rejects(loadConfigFile('/nonexistent/kup.conf'), (err: Error) => {
    assert.match(err.message, /\/nonexistent\/kup\.conf.*ENOENT/);
    return isProxyError(err, 'KUP_ERR_CONFIG_FILE');
  });
});

// Hostile files: each is refused with its place, never a raw ReferenceError/RangeError (before: an
// "Excessive alias count" ReferenceError, a stack overflow on the recursive alias, "Maximum call stack size
// exceeded" as the message for the deep one), and quickly.
const hostile = [
  {
    name: 'an alias bomb (9 levels of 9)',
    text: `${HEAD}featureGates:
  a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
  b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
  c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
  d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
  e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
  f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
  g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
  h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
  i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
`,
    want: /^config file c\.yaml:(?:[5-9]|1[0-2]):\d+: aliases expand the document by more than 1000000/,
  },
  {
    name: 'a recursive alias',
    text: `${HEAD}featureGates: &g\n  again: *g\n`,
    want: /^config file c\.yaml:4:10: alias \*g is inside the node it names \(a recursive alias\)/,
  },
  {
    name: 'nesting 10,000 deep',
    text: `${HEAD}featureGates:\n  x: ${'['.repeat(10_000)}${']'.repeat(10_000)}\n`,
    want: /^config file c\.yaml:4:\d+: nested deeper than 100 levels/,
  },
];
for (const c of hostile)
  test(`refuses ${c.name} with its line, at once`, () => {
    const started = performance.now();
    assert.throws(
      () => parseConfigFile(c.text, 'c.yaml'),
      (err: Error) => {
        assert.match(err.message, c.want);
        return isProxyError(err, 'KUP_ERR_CONFIG_FILE');
      },
    );
    assert.ok(performance.now() - started < 1000, `${Math.round(performance.now() - started)} ms`);
  });

test('a FIFO (or any non-regular file) is refused at once, not waited on', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'kup-config-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const fifo = join(dir, 'kup.conf');
  // No writer ever opens it: a blocking open(2) for reading would wait for ever.
  execFileSync('mkfifo', [fifo]);
  let timer: NodeJS.Timeout | undefined;
  const outcome = await Promise.race([
    loadConfigFile(fifo).then(
      () => new Error('read'),
      (err: Error) => err,
    ),
    new Promise<'waiting'>((resolve) => {
      timer = setTimeout(() => resolve('waiting'), 5000);
    }),
  ]);
  clearTimeout(timer);
  if (outcome === 'waiting') {
    // Let the parked read go (a writer that closes at once), so that this process can end.
    closeSync(openSync(fifo, constants.O_WRONLY | constants.O_NONBLOCK));
    assert.fail('loadConfigFile waited on the FIFO');
  }
  assert.match(outcome.message, /kup\.conf: not a regular file \(a FIFO\)/);
  assert.ok(isProxyError(outcome, 'KUP_ERR_CONFIG_FILE'));
  await assert.rejects(loadConfigFile(dir), /not a regular file \(a directory\)/);
});

// The fields a KubeProxyConfiguration holds (the rest are our own flags).
function fileFields(c: Config): Partial<Config> {
  const {
    manifest,
    master,
    cleanup,
    iptables,
    udpMaxSessions,
    tcpIdleTimeoutMs,
    tcpHalfCloseTimeoutMs,
    ...rest
  } = c;
  const { shutdownGracePeriodMs, trace, ...fileOnes } = rest;
  return fileOnes;
}

test('render then parse gives the same config', () => {
  const custom: Config = {
    ...DEFAULT_CONFIG,
    kubeconfig: '/k.conf',
    hostnameOverride: 'node-a',
    bindAddress: 'fd00::5',
    proxyPortRange: '30000+99',
    udpTimeoutMs: 1500,
    iptablesSyncPeriodMs: 90_000,
    iptablesMinSyncPeriodMs: 2000,
    configSyncPeriodMs: 5_400_000,
    healthzBindAddress: '[::]:10256',
    metricsBindAddress: '[::1]:10249',
    bindAddressHardFail: true,
    nodePortAddresses: ['fd00::/64'],
    clusterCIDRs: ['10.244.0.0/16', 'fd00:10:244::/56'],
    detectLocalMode: 'InterfaceNamePrefix',
    podBridgeInterface: 'cbr0',
    podInterfaceNamePrefix: 'veth',
    oomScoreAdj: 0,
    conntrackMaxPerCore: 32768,
    conntrackMin: 131072,
    conntrackTcpEstablishedTimeoutMs: 86_400_000,
    conntrackTcpCloseWaitTimeoutMs: 3_600_000,
    kubeApiQps: 7.5,
    kubeApiBurst: 20,
    kubeApiContentType: 'application/json',
    profiling: true,
    verbosity: 2,
    logFormat: 'text',
  };
  for (const config of [DEFAULT_CONFIG, custom]) {
    const text = renderConfigFile(config);
    assert.equal(renderConfigFile(config), text, 'deterministic');
    const back = parseConfigFile(text, 'out.yaml');
    assert.deepEqual(back.ignored, []);
    assert.deepEqual({ ...fileFields(DEFAULT_CONFIG), ...back.config }, fileFields(config));
  }
  const text = renderConfigFile(DEFAULT_CONFIG);
  assert.match(text, /^# Written by kube-userspace-proxy/);
  assert.match(text, /^mode: userspace$/m);
  assert.match(text, /^udpIdleTimeout: 250ms$/m);
  assert.match(text, /^ {2}syncPeriod: 30s$/m);
});

test('values a file cannot express carry a comment naming the flag', () => {
  const text = renderConfigFile({
    ...DEFAULT_CONFIG,
    metricsBindAddress: '',
    healthzBindAddress: '',
    iptablesMinSyncPeriodMs: 0,
  });
  assert.match(text, /^metricsBindAddress: "" # .*--metrics-bind-address=""$/m);
  assert.match(text, /^healthzBindAddress: "" # .*--healthz-bind-address=""$/m);
  assert.match(text, /^ {2}minSyncPeriod: 0s # .*--iptables-min-sync-period=0$/m);
});

async function tempDir(t: { after: (fn: () => Promise<void>) => void }) {
  const dir = await mkdtemp(join(tmpdir(), 'kup-config-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  return dir;
}

test('precedence: defaults < file < flags given on the command line', async (t) => {
  const dir = await tempDir(t);
  const file = join(dir, 'config.conf');
  await writeFile(
    file,
    `${HEAD}udpIdleTimeout: 1s\nhostnameOverride: from-file\nmetricsBindAddress: 0.0.0.0:10249\nipvs: { scheduler: rr }\n`,
  );
  const fromFile = await parseArgs(['--config', file]);
  assert.equal(fromFile.configFile, file);
  assert.equal(fromFile.config.udpTimeoutMs, 1000);
  assert.equal(fromFile.config.hostnameOverride, 'from-file');
  assert.equal(fromFile.config.metricsBindAddress, '0.0.0.0:10249');
  assert.equal(fromFile.config.iptablesSyncPeriodMs, DEFAULT_CONFIG.iptablesSyncPeriodMs);
  assert.deepEqual(fromFile.warnings, [
    `Ignored fields of ${file} that do not apply to the userspace proxy: ipvs`,
  ]);

  const withFlags = await parseArgs([
    `--config=${file}`,
    '--udp-timeout=2s',
    '--hostname-override=Node-B',
    '--metrics-bind-address=',
  ]);
  assert.equal(withFlags.config.udpTimeoutMs, 2000);
  assert.equal(withFlags.config.hostnameOverride, 'node-b');
  assert.equal(withFlags.config.metricsBindAddress, '', 'an explicit empty flag still wins');
});

test('a conflict names where each value came from', async (t) => {
  const dir = await tempDir(t);
  const file = join(dir, 'config.conf');
  await writeFile(file, `${HEAD}iptables:\n  syncPeriod: 30s\n  minSyncPeriod: 1m\n`);
  await assert.rejects(parseArgs(['--config', file]), (err: Error) => {
    assert.equal(
      err.message,
      `iptables.minSyncPeriod in ${file} (1m0s) must not exceed iptables.syncPeriod in ${file} (30s)`,
    );
    return isProxyError(err, 'KUP_ERR_CONFIG_FILE');
  });
  await assert.rejects(parseArgs(['--config', file, '--iptables-min-sync-period=45s']), (err: Error) => {
    assert.match(err.message, /^--iptables-min-sync-period \(45s\) must not exceed iptables\.syncPeriod in /);
    return isProxyError(err, 'KUP_ERR_INVALID_FLAG');
  });
  // A flag can also resolve it.
  const fixed = await parseArgs(['--config', file, '--iptables-sync-period=2m']);
  assert.equal(fixed.config.iptablesMinSyncPeriodMs, 60_000);

  await writeFile(file, `${HEAD}clientConnection:\n  kubeconfig: /k.conf\n`);
  await assert.rejects(parseArgs(['--config', file, '--manifest=m.yaml']), (err: Error) => {
    assert.match(
      err.message,
      /--manifest cannot be combined with clientConnection\.kubeconfig in .*: pick one source/,
    );
    return isProxyError(err, 'KUP_ERR_INVALID_FLAG');
  });
});

test('a bad file is one KUP_ERR_CONFIG_FILE naming the field', async (t) => {
  const dir = await tempDir(t);
  const file = join(dir, 'config.conf');
  await writeFile(file, `${HEAD}iptables:\n  syncPerod: 30s\n`);
  await assert.rejects(parseArgs(['--config', file]), (err: Error) => {
    assert.equal(err.message, `config file ${file}:4:14: unknown field "iptables.syncPerod"`);
    return isProxyError(err, 'KUP_ERR_CONFIG_FILE');
  });
});

test('--write-config-to writes what --config reads back', async (t) => {
  const dir = await tempDir(t);
  const out = join(dir, 'written.conf');
  const first = await parseArgs([
    '--udp-timeout=3s',
    '--nodeport-addresses=10.0.0.0/8',
    `--write-config-to=${out}`,
  ]);
  assert.equal(first.writeConfigTo, out);
  await writeConfigFile(out, first.config);
  const again = await parseArgs(['--config', out]);
  assert.deepEqual(again.config, first.config);
  assert.deepEqual(again.warnings, []);
  assert.match(await readFile(out, 'utf8'), /^udpIdleTimeout: 3s$/m);
  await assert.rejects(writeConfigFile(join(dir, 'no', 'such', 'dir'), first.config), (err: Error) =>
    isProxyError(err, 'KUP_ERR_CONFIG_FILE'),
  );
});
