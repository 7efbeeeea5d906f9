// This Node as the proxy uses it, against the stand-in API server: /healthz turns 503 with
// nodeEligible: false while the Node has the Cluster Autoscaler's taint or a deletionTimestamp (/livez
// does not), the node IP and `--nodeport-addresses primary` come from the Node's InternalIP, conntrack
// settings go through the injected sysctl only; and health check node ports judge the proxy's health
// at each request.
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import http from 'node:http';
import net, { type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import type { Config } from '../../src/config/config.ts';
import { DEFAULT_CONFIG } from '../../src/config/config.ts';
import { silentLogger } from '../../src/lib/log.ts';
import type { Sysctl } from '../../src/netfilter/conntrack-settings.ts';
import type { Iptables } from '../../src/netfilter/iptables.ts';
import { ProxyServer } from '../../src/proxy-server.ts';
import { ProxyHealth } from '../../src/server/proxy-health.ts';
import { ServiceHealthServer } from '../../src/server/service-health.ts';
import { makeNode, startFakeApiServer } from '../helpers/fake-apiserver.ts';
import { fakeHostInfo } from '../helpers/host-info.ts';
import { waitFor } from '../helpers/servers.ts';

const TAINT = { key: 'ToBeDeletedByClusterAutoscaler', value: '1700000000', effect: 'NoSchedule' };

async function setup(
  t: { after(fn: () => unknown): void },
  node: ReturnType<typeof makeNode>,
  overrides: Partial<Config> = {},
  deps: { iptables?: Iptables; sysctl?: Sysctl; hostInfo?: typeof fakeHostInfo } = {},
) {
  const api = await startFakeApiServer();
  t.after(() => api.close());
  const dir = await mkdtemp(join(tmpdir(), 'kup-node-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  api.create(node);
  const config: Config = {
    ...DEFAULT_CONFIG,
    // In this process: one relaying process (the worker mode has tests of its own).
    workers: 1,
    kubeconfig: await api.writeKubeconfig(dir),
    iptables: deps.iptables !== undefined,
    hostnameOverride: 'node-1',
    bindAddress: '0.0.0.0',
    healthzBindAddress: '127.0.0.1:0',
    metricsBindAddress: '',
    iptablesMinSyncPeriodMs: 0,
    stateFile: '',
    ...overrides,
  };
  const server = new ProxyServer(config, { log: silentLogger(), hostInfo: fakeHostInfo, ...deps });
  await server.start();
  t.after(() => server.close());
  const get = async (path: string) => {
    const res = await fetch(`http://127.0.0.1:${server.healthServer!.port}${path}`);
    return { status: res.status, body: (await res.json()) as Record<string, unknown> };
  };
  return { api, server, get };
}

const noIptables: Partial<Config> = { bindAddress: '127.0.0.1' };

test('the autoscaler taint turns /healthz 503 with nodeEligible false, removing it 200; /livez stays 200', async (t) => {
  const tainted = makeNode('node-1');
  (tainted.spec as Record<string, unknown>).taints = [TAINT];
  const { api, get } = await setup(t, tainted, noIptables);
  await waitFor(async () => (await get('/livez')).status === 200, 5000, 'the first sync');
  await waitFor(async () => (await get('/healthz')).body.reason === 'node-ineligible', 5000, 'the Node');
  const sick = await get('/healthz');
  assert.equal(sick.status, 503);
  assert.equal(sick.body.nodeEligible, false);
  assert.equal(sick.body.healthy, false);
  assert.equal((await get('/livez')).status, 200);

  const clean = api.get<ReturnType<typeof makeNode>>('Node', '', 'node-1')!;
  (clean.spec as Record<string, unknown>).taints = [];
  api.update(clean);
  await waitFor(async () => (await get('/healthz')).status === 200, 5000, '/healthz 200');
  assert.equal((await get('/healthz')).body.nodeEligible, true);
});

test('a deletionTimestamp turns /healthz 503 with nodeEligible false; /livez stays 200', async (t) => {
  const { api, get } = await setup(t, makeNode('node-1'), noIptables);
  await waitFor(async () => (await get('/healthz')).status === 200, 5000, '/healthz 200');
  assert.equal((await get('/healthz')).body.nodeEligible, true);
  const node = api.get<ReturnType<typeof makeNode>>('Node', '', 'node-1')!;
  node.metadata = { ...node.metadata, deletionTimestamp: new Date().toISOString() };
  api.update(node);
  await waitFor(async () => (await get('/healthz')).status === 503, 5000, '/healthz 503');
  assert.equal((await get('/healthz')).body.nodeEligible, false);
  assert.equal((await get('/livez')).status, 200);
});

const recordingIptables = (restores: string[]): Iptables => ({
  restore: async (_family, text) => {
    restores.push(text);
  },
  save: async () => '',
  missingJumps: async () => [],
  cleanup: async () => {},
  flushConntrackUDP: async () => {},
});

test("the node IP and --nodeport-addresses primary come from the Node's InternalIP; conntrack goes through the injected sysctl", async (t) => {
  const node = makeNode('node-1');
  const internalIP = node.status.addresses!.find((a) => a.type === 'InternalIP')!.address!;
  // The host has the Node's InternalIP on a second interface; the default route goes through eth0.
  const hostInfo = () => {
    const info = fakeHostInfo();
    info.interfaces.eth1 = [
      {
        address: internalIP,
        netmask: '255.255.255.0',
        family: 'IPv4',
        mac: '00:00:00:00:00:02',
        internal: false,
        cidr: `${internalIP}/24`,
      },
    ];
    return info;
  };
  const writes: [string, number][] = [];
  const sysctl: Sysctl = {
    read: async () => 0,
    write: async (path, value) => void writes.push([path, value]),
  };
  const restores: string[] = [];
  const { server } = await setup(
    t,
    node,
    { nodePortAddresses: ['primary'], detectLocalMode: 'NodeCIDR' },
    { iptables: recordingIptables(restores), sysctl, hostInfo },
  );
  await waitFor(() => server.proxier.lastSyncMs !== 0, 8000, 'the first sync');
  const v4 = server.network!.families.find((f) => f.family === 'IPv4')!;
  assert.equal(v4.hostIP, internalIP);
  assert.deepEqual(v4.nodePortAddresses, [`${internalIP}/32`]);
  assert.deepEqual(server.network!.localDetectorFor('IPv4'), {
    ifLocal: `-s ${node.spec.podCIDRs[0]}`,
    ifNotLocal: `! -s ${node.spec.podCIDRs[0]}`,
  });
  assert.equal(server.network!.localDetectorFor('IPv6'), undefined);
  assert.deepEqual(
    writes.map(([path]) => path.split('/').pop()),
    [
      'nf_conntrack_max',
      'hashsize',
      'nf_conntrack_tcp_timeout_established',
      'nf_conntrack_tcp_timeout_close_wait',
    ],
  );
});

function get(port: number): Promise<{ status: number; body: Record<string, unknown> }> {
  return new Promise((resolve, reject) => {
    const req = http.get({ host: '127.0.0.1', port, path: '/', agent: false }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => {
        text += c;
      });
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(text) }));
    });
    req.on('error', reject);
  });
}

test('a health check node port answers 503 as soon as the proxy is stale, between syncs', async (t) => {
  let now = 1_000_000;
  const health = new ProxyHealth(1000);
  health.syncStarted();
  health.updated(now);
  const hcs = new ServiceHealthServer({
    log: silentLogger(),
    bindAddresses: ['127.0.0.1'],
    proxyHealthy: () => health.isLive(now),
  });
  t.after(() => hcs.close());
  const probe = net.createServer();
  await new Promise<void>((r) => probe.listen(0, '127.0.0.1', r));
  const port = (probe.address() as AddressInfo).port;
  await new Promise<void>((r) => probe.close(() => r()));
  await hcs.syncServices(new Map([[port, { namespace: 'default', name: 'web' }]]));
  hcs.syncEndpoints(new Map([['default/web', 1]]));
  assert.equal((await get(port)).status, 200);
  // A change is queued and no sync applies it: no syncEndpoints/syncServices call happens in between.
  health.queuedUpdate(now);
  now += 999;
  assert.equal((await get(port)).status, 200);
  now += 1;
  const stale = await get(port);
  assert.equal(stale.status, 503);
  assert.equal(stale.body.serviceProxyHealthy, false);
  health.syncStarted();
  health.updated(now);
  assert.equal((await get(port)).status, 200);
});
