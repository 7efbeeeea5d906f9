// /configz's body in kube-proxy's shape: {"kubeproxy.config.k8s.io": KubeProxyConfiguration}, the v1alpha1
// object --write-config-to writes (it reads back to the same settings), plus our own settings; paths,
// never contents or credentials.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { Config } from '../../../src/config/config.ts';
import { DEFAULT_CONFIG } from '../../../src/config/config.ts';
import { parseConfigFile } from '../../../src/config/file.ts';
import { SETTINGS } from '../../../src/config/settings.ts';
import { configz, KUBE_PROXY_CONFIGZ, OWN_CONFIGZ } from '../../../src/server/configz.ts';

const config: Config = {
  ...DEFAULT_CONFIG,
  kubeconfig: '/var/lib/kube-proxy/kubeconfig.conf',
  iptablesSyncPeriodMs: 45_000,
  clusterCIDRs: ['10.244.0.0/16'],
  tcpIdleTimeoutMs: 60_000,
};

test('keyed by the config API group, as kube-proxy registers it', () => {
  const body = configz(config);
  assert.deepEqual(Object.keys(body), [KUBE_PROXY_CONFIGZ, OWN_CONFIGZ]);
  assert.equal(KUBE_PROXY_CONFIGZ, 'kubeproxy.config.k8s.io');
  const kpc = body[KUBE_PROXY_CONFIGZ]!;
  assert.equal(kpc.apiVersion, 'kubeproxy.config.k8s.io/v1alpha1');
  assert.equal(kpc.kind, 'KubeProxyConfiguration');
  assert.equal(kpc.mode, 'userspace');
  assert.deepEqual(kpc.iptables, { syncPeriod: '45s', minSyncPeriod: '1s' });
  assert.equal(kpc.clusterCIDR, '10.244.0.0/16');
  assert.equal(
    (kpc.clientConnection as Record<string, unknown>).kubeconfig,
    '/var/lib/kube-proxy/kubeconfig.conf',
  );
  assert.equal(kpc.healthzBindAddress, '0.0.0.0:10256');
});

test('the KubeProxyConfiguration reads back as a config file to the same settings', () => {
  const kpc = configz(config)[KUBE_PROXY_CONFIGZ]!;
  const back = parseConfigFile(JSON.stringify(kpc), 'configz.json').config;
  for (const s of SETTINGS) {
    if (s.file === undefined || s.key === undefined) continue;
    // A zero value in a file means the default (see renderConfigFile's notes); the others come back.
    if (!(s.key in back)) continue;
    assert.deepEqual(back[s.key], config[s.key], s.key);
  }
  assert.equal(back.iptablesSyncPeriodMs, 45_000);
});

test('our own settings, which have no KubeProxyConfiguration field, under our own name', () => {
  const own = configz(config)[OWN_CONFIGZ]!;
  assert.equal(own.tcpIdleTimeoutMs, 60_000);
  assert.equal(own.iptables, true);
  assert.equal(own.trace, DEFAULT_CONFIG.trace);
  assert.ok(
    !('iptablesSyncPeriodMs' in own),
    'a setting with a file field is in the KubeProxyConfiguration only',
  );
});

test('credentials in --master are not shown', () => {
  for (const master of ['https://admin:s3cret@api.example:6443', 'admin:s3cret@api.example:6443']) {
    const text = JSON.stringify(configz({ ...config, master }));
    assert.ok(!text.includes('s3cret') && !text.includes('admin'), master);
    assert.match(text, /REDACTED@api\.example:6443/);
  }
  assert.equal(
    configz({ ...config, master: 'https://api.example:6443' })[OWN_CONFIGZ]!.master,
    'https://api.example:6443',
  );
});
