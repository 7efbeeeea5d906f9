// Times the Kubernetes source against the stand-in API server (same process, loopback) at 10,000
// Services and 50,000 endpoints (one EndpointSlice of 5 per Service) feeding a real ProxyState: start →
// both synced + first checkout, memory, and one EndpointSlice update → visible in a checkout. Prints.
// Run: node bench/kubernetes-source.bench.ts
import { performance } from 'node:perf_hooks';
import { KubeConfig } from '@kubernetes/client-node';
import { silentLogger } from '../src/lib/log.ts';
import { kubeConfigCredentials } from '../src/source/kubeconfig-credentials.ts';
import { KubernetesSource } from '../src/source/kubernetes.ts';
import type { EndpointSlice } from '../src/source/objects.ts';
import { ProxyState } from '../src/state/proxy-state.ts';
import type { ServicePortKey } from '../src/state/service-port.ts';
import { makeEndpointSlice, makeService, startFakeApiServer } from '../test/helpers/fake-apiserver.ts';

const SERVICES = 10_000;
const ENDPOINTS_PER_SLICE = 5;
const ROUNDS = 20;

const octets = (i: number) => `${(i >> 8) & 255}.${i & 255}`;
const mib = (bytes: number) => `${(bytes / 1024 / 1024).toFixed(0)} MiB`;
const fmt = (ms: number) => `${ms.toFixed(ms < 10 ? 2 : 0)} ms`;

const server = await startFakeApiServer({ historySize: 100 });
for (let i = 0; i < SERVICES; i++) {
  server.create(
    makeService('bench', `svc-${i}`, {
      clusterIP: `10.96.${octets(i)}`,
      ports: [{ name: 'http', protocol: 'TCP', port: 80, targetPort: 8080 }],
    }),
  );
  const ips = Array.from({ length: ENDPOINTS_PER_SLICE }, (_, h) => `10.${octets(i)}.${h + 1}`);
  server.create(
    makeEndpointSlice('bench', `svc-${i}-abcde`, `svc-${i}`, ips, [
      { name: 'http', protocol: 'TCP', port: 8080 },
    ]),
  );
}

globalThis.gc?.();
const before = process.memoryUsage();
let notify = () => {};
const state = new ProxyState({ nodeName: 'node-1', warn: () => {}, onChange: () => notify() });
const changed = (check: () => boolean) =>
  new Promise<void>((resolve) => {
    if (check()) return resolve();
    notify = () => {
      if (!check()) return;
      notify = () => {};
      resolve();
    };
  });

const kc = new KubeConfig();
kc.loadFromString(server.kubeconfigYaml());
const source = new KubernetesSource({
  credentials: kubeConfigCredentials(kc),
  handlers: state,
  nodeName: 'node-1',
  log: silentLogger(),
  configSyncPeriodMs: 0,
});

const t0 = performance.now();
await source.start();
await changed(() => state.isInitialized);
const tSynced = performance.now();
const first = state.checkout();
const tFirst = performance.now();
const peak = process.memoryUsage();
globalThis.gc?.();
const settled = process.memoryUsage();
const endpointCount = [...first.endpoints.values()].reduce((n, e) => n + e.all.length, 0);
const pages = server.requests.filter((r) => r.verb === 'list').length;

// One slice update on the stand-in → watch event → ProxyState → checkout shows it.
const latency: number[] = [];
for (let r = 0; r < ROUNDS; r++) {
  const i = (r * 7919) % SERVICES;
  const key = `bench/svc-${i}:http/TCP` as ServicePortKey;
  const slice = server.get<EndpointSlice>('EndpointSlice', 'bench', `svc-${i}-abcde`)!;
  const ip = `10.200.${octets(r)}`;
  const start = performance.now();
  server.update({ ...slice, endpoints: [...(slice.endpoints ?? []), { addresses: [ip] }] });
  await changed(() => state.pendingEndpointChanges > 0);
  const snap = state.checkout();
  if (!snap.endpoints.get(key)?.cluster.some((e) => e.ip === ip))
    throw new Error(`round ${r}: ${ip} missing`);
  latency.push(performance.now() - start);
}
latency.sort((a, b) => a - b);

await source.stop();
await server.close();

const row = (label: string, value: string) => console.log(`  ${label.padEnd(32)} ${value}`);
const gcNote = globalThis.gc ? 'after gc' : 'no gc (run with --expose-gc)';
console.log(`kubernetes source: ${SERVICES} services, ${endpointCount} endpoints in ${SERVICES} slices`);
row('start → both synced', `${fmt(tSynced - t0)} (${pages} list pages of ≤500)`);
row('start → first checkout', fmt(tFirst - t0));
// The stand-in runs in this process: RSS includes its list encoding, so it is an upper bound.
row('RSS growth at first checkout', mib(peak.rss - before.rss));
row('heap held (source + state)', `${mib(settled.heapUsed - before.heapUsed)}, ${gcNote}`);
const median = latency[latency.length >> 1] ?? Number.NaN;
const max = latency[latency.length - 1] ?? Number.NaN;
row('slice update → in checkout', `${fmt(median)} median, ${fmt(max)} max of ${ROUNDS}`);
