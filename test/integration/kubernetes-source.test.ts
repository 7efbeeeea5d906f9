// KubernetesSource against the stand-in API server: initial list and synced hooks, selectors, the event
// flow, this Node only, and self-healing (410 both forms, cut watches, HTTP 500, silence → watchdog,
// server down at start, periodic relist), plus a real ProxyState fed end to end and a clean stop.
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import type { ProxyHandlers } from '../../src/source/handlers.ts';
import { kubeConfigCredentials, loadKubeConfig } from '../../src/source/kubeconfig-credentials.ts';
import { KubernetesSource } from '../../src/source/kubernetes.ts';
import {
  type EndpointSlice,
  LABEL_HEADLESS,
  LABEL_SERVICE_PROXY_NAME,
  type Node,
  PROXY_LABEL_SELECTOR,
  type Service,
} from '../../src/source/objects.ts';
import { ProxyState } from '../../src/state/proxy-state.ts';
import type { ServicePortKey } from '../../src/state/service-port.ts';
import { makeEndpointSlice, makeNode, makeService, startFakeApiServer } from '../helpers/fake-apiserver.ts';
import { collectGarbage } from '../helpers/heap.ts';
import {
  converged,
  DEADLINE_MS,
  listsOf,
  NODE,
  RecordingHandlers,
  recordingLogger,
  seedBasic,
  setup,
  synced,
  Waiters,
  watchesOf,
} from '../helpers/source-harness.ts';

test('initial list: adds then synced once per kind, from a kubeconfig file with a bearer token', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'kube-source-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const server = await startFakeApiServer({ token: 's3cret' });
  t.after(() => server.close());
  seedBasic(server);
  const h = new RecordingHandlers();
  const source = new KubernetesSource({
    credentials: kubeConfigCredentials(loadKubeConfig({ kubeconfig: await server.writeKubeconfig(dir) })),
    handlers: h,
    nodeName: NODE,
    log: recordingLogger().logger,
    configSyncPeriodMs: 0,
    backoff: { initialMs: 20, maxMs: 200 },
  });
  t.after(() => source.stop());
  assert.equal(source.synced, false);
  await source.start();
  await synced(h);
  await h.waitFor((s) => s.kind === 'Node');
  assert.equal(source.synced, true);

  const services = h.events.filter((s) => s.kind === 'Service').map((s) => `${s.op} ${s.key}`);
  assert.deepEqual(services, ['add default/web', 'add kube-system/kube-dns', 'synced ']);
  const slices = h.events.filter((s) => s.kind === 'EndpointSlice').map((s) => `${s.op} ${s.key}`);
  assert.deepEqual(slices, ['add default/web-abc', 'add kube-system/kube-dns-xyz', 'synced ']);
  // List items come without kind/apiVersion; the source fills them in, as a manifest has them.
  const web = h.objects.Service.get('default/web') as Service;
  assert.equal(web.kind, 'Service');
  assert.equal(web.apiVersion, 'v1');
  assert.equal(web.spec?.clusterIP, server.get<Service>('Service', 'default', 'web')?.spec?.clusterIP);
  assert.equal(h.objects.EndpointSlice.get('default/web-abc')?.apiVersion, 'discovery.k8s.io/v1');
  await converged(h, server);

  // Every request carried the token; the requests look like client-go's.
  await server.waitForRequest((r) => r.verb === 'watch' && r.path === '/api/v1/nodes');
  for (const r of server.requests) assert.equal(r.headers.authorization, 'Bearer s3cret', r.path);
  for (const path of ['/api/v1/services', '/apis/discovery.k8s.io/v1/endpointslices']) {
    const list = listsOf(server, path)[0];
    assert.equal(list?.query['labelSelector'], PROXY_LABEL_SELECTOR);
    assert.equal(list?.query['limit'], '500');
    const watch = await server.waitForRequest((r) => r.verb === 'watch' && r.path === path);
    assert.equal(watch.query['labelSelector'], PROXY_LABEL_SELECTOR);
    assert.equal(watch.query['resourceVersion'], server.resourceVersion);
    assert.equal(watch.query['allowWatchBookmarks'], 'true');
    const timeout = Number(watch.query['timeoutSeconds']);
    assert.ok(timeout >= 150 && timeout < 300, `timeoutSeconds ${timeout}`);
  }
  assert.match(String(server.requests[0]?.headers['user-agent']), /^kube-userspace-proxy\//);
});

test('selector: headless and service-proxy-name objects never arrive; one that gains the label is deleted', async (t) => {
  const { server, h } = await setup(t, {
    seed: (s) => {
      s.create(makeService('default', 'web'));
      s.create(
        makeService('default', 'other', {}, { labels: { [LABEL_SERVICE_PROXY_NAME]: 'other-proxy' } }),
      );
      s.create(
        makeEndpointSlice('default', 'hl-1', 'hl', ['10.244.1.7'], undefined, {
          labels: { [LABEL_HEADLESS]: '' },
        }),
      );
      s.create(makeEndpointSlice('default', 'web-1', 'web', ['10.244.1.8']));
    },
  });
  await synced(h);
  server.create(makeService('default', 'other-2', {}, { labels: { [LABEL_SERVICE_PROXY_NAME]: 'x' } }));
  server.create(
    makeEndpointSlice('default', 'hl-2', 'hl', ['10.244.1.9'], undefined, {
      labels: { [LABEL_HEADLESS]: '' },
    }),
  );
  server.create(makeService('default', 'after'));
  await h.waitFor((s) => s.key === 'default/after');
  const web = server.get<Service>('Service', 'default', 'web')!;
  web.metadata!.labels = { [LABEL_SERVICE_PROXY_NAME]: 'moved' };
  server.update(web);
  await h.waitFor((s) => s.op === 'delete' && s.key === 'default/web');

  const keys = new Set(h.events.map((s) => s.key));
  for (const hidden of ['default/other', 'default/other-2', 'default/hl-1', 'default/hl-2']) {
    assert.ok(!keys.has(hidden), `${hidden} must not arrive`);
  }
  await converged(h, server);
});

test('add, update, delete: updates carry the previous object; slices too', async (t) => {
  const { server, h } = await setup(t, { seed: seedBasic });
  await synced(h);
  const created = server.create(makeService('default', 'api', { ports: [{ name: 'grpc', port: 9000 }] }));
  await h.waitFor((s) => s.op === 'add' && s.key === 'default/api');
  const changed = server.update({ ...created, spec: { ...created.spec, sessionAffinity: 'ClientIP' } });
  const update = await h.waitFor((s) => s.op === 'update' && s.key === 'default/api');
  assert.equal(update.oldRv, created.metadata?.resourceVersion);
  assert.equal(update.rv, changed.metadata?.resourceVersion);
  assert.equal((update.object as Service).spec?.sessionAffinity, 'ClientIP');
  server.remove('Service', 'default', 'api');
  await h.waitFor((s) => s.op === 'delete' && s.key === 'default/api');

  const slice = server.get<EndpointSlice>('EndpointSlice', 'default', 'web-abc')!;
  server.update({ ...slice, endpoints: [{ addresses: ['10.244.3.3'], conditions: { ready: true } }] });
  const sliceUpdate = await h.waitFor((s) => s.op === 'update' && s.key === 'default/web-abc');
  assert.equal(sliceUpdate.oldRv, slice.metadata?.resourceVersion);
  server.remove('EndpointSlice', 'default', 'web-abc');
  await h.waitFor((s) => s.op === 'delete' && s.key === 'default/web-abc');
  await converged(h, server);
  assert.equal(h.events.filter((s) => s.op === 'synced').length, 2);
});

test('Node: only this node, watched by field selector; delete reported', async (t) => {
  const { server, h } = await setup(t, { seed: seedBasic });
  await h.waitFor((s) => s.kind === 'Node' && s.key === `/${NODE}`);
  const watch = await server.waitForRequest((r) => r.verb === 'watch' && r.path === '/api/v1/nodes');
  assert.equal(watch.query['fieldSelector'], `metadata.name=${NODE}`);
  assert.equal(listsOf(server, '/api/v1/nodes')[0]?.query['fieldSelector'], `metadata.name=${NODE}`);

  server.update(makeNode('node-2', { 'topology.kubernetes.io/zone': 'zone-b' }));
  server.update(makeNode(NODE, { 'topology.kubernetes.io/zone': 'zone-c' }));
  const update = await h.waitFor(
    (s) =>
      s.kind === 'Node' && (s.object as Node).metadata?.labels?.['topology.kubernetes.io/zone'] === 'zone-c',
  );
  assert.equal(update.op, 'update');
  server.remove('Node', '', NODE);
  await h.waitFor((s) => s.kind === 'Node' && s.op === 'delete');
  assert.ok(h.events.every((s) => s.kind !== 'Node' || s.key === `/${NODE}`));
});

for (const as of ['event', 'http'] as const) {
  test(`410 on watch (${as}): relist, missed changes reconciled`, async (t) => {
    const { server, h, log } = await setup(t, { seed: seedBasic });
    await synced(h);
    await server.waitForRequest((r) => r.verb === 'watch' && r.path === '/api/v1/services');
    // Changes the open watches hold back and then drop: only a relist can find them.
    server.silence(true);
    const web = server.get<Service>('Service', 'default', 'web')!;
    server.update({ ...web, spec: { ...web.spec, sessionAffinity: 'ClientIP' } });
    server.remove('Service', 'kube-system', 'kube-dns');
    server.create(makeService('default', 'new'));
    const slice = server.get<EndpointSlice>('EndpointSlice', 'default', 'web-abc')!;
    server.update({ ...slice, endpoints: [{ addresses: ['10.244.9.9'] }] });
    const mark = server.requests.length;
    server.expireHistory(as);
    server.closeWatches();
    await converged(h, server);
    server.silence(false);

    const relist = listsOf(server, '/api/v1/services', mark);
    assert.equal(relist.length, 1);
    await log.waitFor((l) => l.msg === 'Watch expired, relisting');
    await log.waitFor((l) => l.msg === 'Relisted' && l.kind === 'Service' && l.deleted === 1);
    const tail = h.events.slice(-8).map((s) => `${s.op} ${s.key}`);
    for (const e of [
      'update default/web',
      'delete kube-system/kube-dns',
      'add default/new',
      'update default/web-abc',
    ]) {
      assert.ok(tail.includes(e), `${e} in ${tail}`);
    }
    // The relist did not replay unchanged objects, and synced came only once.
    assert.equal(h.events.filter((s) => s.key === 'default/web-abc' && s.op === 'add').length, 1);
    assert.equal(h.events.filter((s) => s.op === 'synced').length, 2);
  });
}

test('cut watch: reconnects from the last resourceVersion (no relist), no stale objects', async (t) => {
  const { server, h, log } = await setup(t, { seed: seedBasic });
  await synced(h);
  await server.waitForRequest((r) => r.verb === 'watch' && r.path === '/api/v1/services');
  const mark = server.requests.length;
  const lastRv = server.resourceVersion;
  server.cutWatches();
  server.remove('Service', 'default', 'web');
  server.create(makeService('default', 'fresh'));
  server.remove('EndpointSlice', 'default', 'web-abc');
  await converged(h, server);
  const rewatch = watchesOf(server, '/api/v1/services', mark)[0];
  assert.equal(rewatch?.query['resourceVersion'], lastRv);
  assert.equal(listsOf(server, '/api/v1/services', mark).length, 0);
  const failed = await log.waitFor((l) => l.msg === 'Watch failed, retrying');
  assert.equal(failed.attempt, 1);
  assert.ok(!h.objects.Service.has('default/web'));
});

test('HTTP 500 (then 403) for a while: retries with growing backoff, then recovers', async (t) => {
  const { server, h, log } = await setup(t, { seed: seedBasic });
  await synced(h);
  await server.waitForRequest((r) => r.verb === 'watch' && r.path === '/api/v1/services');
  server.setFailing(500);
  server.cutWatches();
  server.create(makeService('default', 'during-outage'));
  await log.waitFor((l) => l.msg === 'Watch failed, retrying' && Number(l.attempt) >= 3);
  server.setFailing(403);
  const mark = log.lines.length;
  await log.waitFor(
    (l) => l.msg === 'Watch failed, retrying' && Number(l.attempt) >= 4 && /403/.test(JSON.stringify(l.err)),
  );
  server.setFailing(null);
  await converged(h, server);
  await log.waitFor((l) => l.msg === 'Watch started' && log.lines.indexOf(l) > mark);
  const retries = log.lines.filter((l) => l.msg === 'Watch failed, retrying');
  for (const l of retries) {
    // Doubling from 20 ms, capped at 200 ms, jittered down by up to half.
    const base = Math.min(200, 20 * 2 ** (Number(l.attempt) - 1));
    assert.ok(Number(l.delayMs) >= base / 2 && Number(l.delayMs) <= base, JSON.stringify(l));
  }
  assert.ok(retries.some((l) => Number(l.attempt) >= 4));
  assert.ok(retries.some((l) => /500/.test(JSON.stringify(l.err))));
  // One "Watch started" per recovery, not per reconnect.
  const started = log.lines.filter((l) => l.msg === 'Watch started' && l.kind === 'Service');
  assert.equal(started.length, 2);
});

test('silent watch: bookmarks keep it alive; silence trips the watchdog, which restarts it', async (t) => {
  const watchdogMs = 600;
  const { server, h, log } = await setup(t, {
    seed: seedBasic,
    server: { bookmarkIntervalMs: 50 },
    source: { watchdogMs },
  });
  await synced(h);
  await server.waitForRequest((r) => r.verb === 'watch' && r.path === '/api/v1/services');
  // A healthy watch shows life (bookmarks, server timeouts) and is never killed by the watchdog.
  await sleep(watchdogMs * 2.5);
  assert.ok(!log.lines.some((l) => l.msg === 'Watch failed, retrying'));

  const mark = server.requests.length;
  server.silence(true);
  server.create(makeService('default', 'held'));
  const tripped = await log.waitFor((l) => l.msg === 'Watch failed, retrying' && l.kind === 'Service');
  assert.match(JSON.stringify(tripped.err), new RegExp(`no data from the API server for ${watchdogMs} ms`));
  await server.waitForRequest((r) => r.verb === 'watch' && r.path === '/api/v1/services', DEADLINE_MS, mark);
  assert.equal(
    h.find((s) => s.key === 'default/held'),
    undefined,
  );
  server.silence(false);
  await h.waitFor((s) => s.op === 'add' && s.key === 'default/held');
  await converged(h, server);
});

test('API server down at start: the source keeps trying and syncs when it comes up', async (t) => {
  const { server, source, h, log } = await setup(t, { seed: seedBasic, serverDown: true });
  const failed = await log.waitFor((l) => l.msg === 'Watch failed, retrying' && Number(l.attempt) >= 3);
  assert.match(JSON.stringify(failed.err), /fetch failed|ECONNREFUSED/);
  assert.equal(source.synced, false);
  assert.equal(h.events.length, 0);
  await server.restart();
  await synced(h);
  assert.equal(source.synced, true);
  await converged(h, server);
});

test('periodic relist repairs events the watch never delivered', async (t) => {
  const { server, h, log } = await setup(t, { seed: seedBasic, source: { configSyncPeriodMs: 250 } });
  await synced(h);
  // While silent, watches deliver nothing; only the periodic relist can bring the changes.
  server.silence(true);
  const mark = server.requests.length;
  const web = server.get<Service>('Service', 'default', 'web')!;
  server.update({ ...web, spec: { ...web.spec, sessionAffinity: 'ClientIP' } });
  server.remove('Service', 'kube-system', 'kube-dns');
  server.create(makeService('default', 'late'));
  await converged(h, server);
  assert.ok(listsOf(server, '/api/v1/services', mark).length >= 1);
  const repaired = await log.waitFor(
    (l) =>
      l.msg === 'Relisted' && l.kind === 'Service' && l.added === 1 && l.updated === 1 && l.deleted === 1,
  );
  assert.equal(repaired.count, 2);
  server.silence(false);
  // Nothing was missed twice and nothing failed: the relist interrupts the watch on purpose.
  assert.equal(h.events.filter((s) => s.op === 'add' && s.key === 'default/late').length, 1);
  assert.ok(!log.lines.some((l) => l.msg === 'Watch failed, retrying'));
});

test('malformed watch lines and objects, and a throwing handler, are logged and skipped', async (t) => {
  const { server, h, log } = await setup(t, { seed: seedBasic });
  await synced(h);
  await server.waitForRequest((r) => r.verb === 'watch' && r.path === '/api/v1/services');
  server.injectLine('{not json');
  server.injectLine('{"type":"ADDED","object":42}');
  server.injectLine('{"type":"ADDED","object":{"metadata":{}}}');
  server.injectLine('"just a string"');
  server.injectLine('{"type":"WHATEVER","object":{"metadata":{"name":"x"}}}');
  h.throwOnAdd = true;
  server.create(makeService('default', 'boom'));
  server.create(makeService('default', 'after-boom'));
  await h.waitFor((s) => s.key === 'default/after-boom');
  for (const msg of [
    'Skipping malformed watch line',
    'Skipping malformed object',
    'Skipping malformed watch event',
    'Skipping watch event of unknown type',
    'Handler failed',
  ]) {
    await log.waitFor((l) => l.msg === msg);
  }
  assert.ok(!log.lines.some((l) => l.msg === 'Watch failed, retrying'));
  h.throwOnAdd = false;
  await converged(h, server);
});

test('pagination: follows continue tokens; one synced after the last page', async (t) => {
  const { server, h } = await setup(t, {
    source: { pageSize: 2 },
    seed: (s) => {
      for (let i = 0; i < 5; i++) s.create(makeService('default', `svc-${i}`));
    },
  });
  await synced(h);
  const lists = listsOf(server, '/api/v1/services');
  assert.equal(lists.length, 3);
  assert.deepEqual(
    lists.map((r) => [r.query['limit'], r.query['continue'] !== undefined]),
    [
      ['2', false],
      ['2', true],
      ['2', true],
    ],
  );
  assert.equal(h.objects.Service.size, 5);
  const syncedAt = h.events.findIndex((s) => s.op === 'synced' && s.kind === 'Service');
  assert.equal(h.events.slice(0, syncedAt).filter((s) => s.kind === 'Service').length, 5);
});

test('a real ProxyState: synced, checkout has the service ports and endpoints; a slice update follows', async (t) => {
  const waiters = new Waiters();
  const warnings: string[] = [];
  const state = new ProxyState({
    nodeName: NODE,
    warn: (msg) => warnings.push(msg),
    onChange: () => waiters.notify(),
  });
  const { server } = await setup(t, { seed: seedBasic, handlers: state });
  await waiters.until(
    () => state.isInitialized && state.nodeZone !== undefined,
    () => `initialized ${state.isInitialized}, zone ${state.nodeZone}`,
  );
  const web = 'default/web:http/TCP' as ServicePortKey;
  let snap = state.checkout();
  assert.deepEqual([...snap.servicePorts.keys()].sort(), [
    'default/web:http/TCP',
    'kube-system/kube-dns:http/TCP',
  ]);
  assert.deepEqual(
    snap.endpoints.get(web)?.cluster.map((e) => e.key),
    ['10.244.1.5:80', '10.244.2.6:80'],
  );
  assert.equal(state.nodeZone, 'zone-a');

  const slice = server.get<EndpointSlice>('EndpointSlice', 'default', 'web-abc')!;
  server.update({ ...slice, endpoints: [...(slice.endpoints ?? []), { addresses: ['10.244.3.7'] }] });
  await waiters.until(
    () => state.pendingEndpointChanges > 0,
    () => 'no endpoint change',
  );
  snap = state.checkout();
  assert.deepEqual([...snap.changedEndpoints], [web]);
  assert.deepEqual(
    snap.endpoints.get(web)?.cluster.map((e) => e.key),
    ['10.244.1.5:80', '10.244.2.6:80', '10.244.3.7:80'],
  );
  assert.deepEqual(warnings, []);
});

test('keeps no API object: what it handed a real ProxyState is collected; updates and relist deletes still apply', async (t) => {
  const waiters = new Waiters();
  const state = new ProxyState({ nodeName: NODE, warn: () => {}, onChange: () => waiters.notify() });
  // Every Service and EndpointSlice handed over, weakly; what an update's `old` and a delete carried.
  const handed: WeakRef<object>[] = [];
  const olds: string[][] = [];
  const deleted: string[][] = [];
  const keys = (o: object) => Object.keys(o).sort();
  const handlers: ProxyHandlers = {
    onServiceAdd(s) {
      handed.push(new WeakRef(s));
      state.onServiceAdd(s);
    },
    onServiceUpdate(old, s) {
      handed.push(new WeakRef(s));
      olds.push(keys(old));
      state.onServiceUpdate(old, s);
    },
    onServiceDelete(s) {
      deleted.push(keys(s));
      state.onServiceDelete(s);
    },
    onServicesSynced: () => state.onServicesSynced(),
    onEndpointSliceAdd(s) {
      handed.push(new WeakRef(s));
      state.onEndpointSliceAdd(s);
    },
    onEndpointSliceUpdate(old, s) {
      handed.push(new WeakRef(s));
      olds.push(keys(old));
      state.onEndpointSliceUpdate(old, s);
    },
    onEndpointSliceDelete(s) {
      deleted.push(keys(s));
      state.onEndpointSliceDelete(s);
    },
    onEndpointSlicesSynced: () => state.onEndpointSlicesSynced(),
    onNodeUpdate: (n) => state.onNodeUpdate(n),
    onNodeDelete: (n) => state.onNodeDelete(n),
  };
  const { server } = await setup(t, { seed: seedBasic, handlers });
  await waiters.until(
    () => state.isInitialized,
    () => 'not initialized',
  );
  const web = server.get<Service>('Service', 'default', 'web')!;
  server.update({ ...web, spec: { ...web.spec, sessionAffinity: 'ClientIP' } });
  const slice = server.get<EndpointSlice>('EndpointSlice', 'kube-system', 'kube-dns-xyz')!;
  server.update({ ...slice, endpoints: [{ addresses: ['10.244.4.4'] }] });
  await waiters.until(
    () => olds.length === 2,
    () => `${olds.length} updates`,
  );
  // Deletes only a relist finds: the objects handed over come from what the reflectors kept.
  await server.waitForRequest((r) => r.verb === 'watch' && r.path === '/api/v1/services');
  server.silence(true);
  server.remove('Service', 'kube-system', 'kube-dns');
  server.remove('EndpointSlice', 'kube-system', 'kube-dns-xyz');
  server.expireHistory('event');
  server.closeWatches();
  await waiters.until(
    () => deleted.length === 2,
    () => `${deleted.length} deletes`,
  );
  server.silence(false);

  const snap = state.checkout();
  assert.deepEqual([...snap.servicePorts.keys()], ['default/web:http/TCP']);
  assert.equal(snap.servicePorts.get('default/web:http/TCP' as ServicePortKey)?.sessionAffinity, 'ClientIP');
  assert.equal(snap.endpoints.get('kube-system/kube-dns:http/TCP' as ServicePortKey), undefined);
  assert.equal(state.endpointChangesTotal, 4, 'two adds, an update and the relist delete of a slice');
  // What the reflectors keep: kind, name and version; no spec, no endpoints.
  for (const kept of [...olds, ...deleted]) assert.deepEqual(kept, ['apiVersion', 'kind', 'metadata']);
  assert.ok(handed.length >= 6, `${handed.length} objects handed over`);
  await collectGarbage();
  const alive = handed.filter((r) => r.deref() !== undefined).length;
  assert.equal(alive, 0, `${alive} of ${handed.length} Services and EndpointSlices are still kept`);
});

test('stop(): every watch closed, no timers or sockets left, nothing emitted after', async (t) => {
  const before = new Set(process.getActiveResourcesInfo());
  const { server, source, h } = await setup(t, { seed: seedBasic, source: { configSyncPeriodMs: 100 } });
  await synced(h);
  await h.waitFor((s) => s.kind === 'Node');
  await server.waitForRequest((r) => r.verb === 'watch' && r.path === '/api/v1/nodes');
  await source.stop();
  await source.stop();
  const count = h.events.length;
  server.create(makeService('default', 'too-late'));
  server.remove('Service', 'default', 'web');
  const deadline = Date.now() + DEADLINE_MS;
  while (server.openWatches > 0 && Date.now() < deadline) await sleep(10);
  assert.equal(server.openWatches, 0);
  const requests = server.requests.length;
  await sleep(300);
  assert.equal(h.events.length, count);
  assert.equal(server.requests.length, requests, 'no request after stop');
  // Our timers are not unref'd, so a leaked one would show here; the stand-in's listener is expected.
  const left = process.getActiveResourcesInfo().filter((r) => r !== 'TTYWrap' && !before.has(r));
  assert.ok(
    left.every((r) => r === 'TCPServerWrap' || r === 'TCPSocketWrap'),
    `left: ${left}`,
  );
  await server.close();
  // Closed handles leave the list a tick or two after their close callbacks.
  const tcp = () => process.getActiveResourcesInfo().filter((r) => r.startsWith('TCP'));
  while (tcp().length > 0 && Date.now() < deadline) await sleep(10);
  assert.deepEqual(tcp(), [], 'no client sockets outlive the stand-in');
  // start() after stop() stays stopped.
  await source.start();
  assert.equal(server.requests.length, requests);
});

test('loadKubeConfig: file, --master override, plain http allowed', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'kube-source-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const server = await startFakeApiServer({ token: 't' });
  t.after(() => server.close());
  const path = await server.writeKubeconfig(dir);
  const kc = loadKubeConfig({ kubeconfig: path });
  assert.equal(kc.getCurrentCluster()?.server, server.url);
  assert.equal(kc.getCurrentUser()?.token, 't');
  const over = loadKubeConfig({ kubeconfig: path, master: 'http://127.0.0.1:8080' });
  assert.equal(over.getCurrentCluster()?.server, 'http://127.0.0.1:8080');
  assert.equal(over.getCurrentUser()?.token, 't');
  const strict = server.kubeconfigYaml().replace(/\n\s*insecure-skip-tls-verify: true/, '');
  assert.doesNotMatch(strict, /insecure/);
  await writeFile(join(dir, 'strict'), strict);
  assert.equal(loadKubeConfig({ kubeconfig: join(dir, 'strict') }).getCurrentCluster()?.skipTLSVerify, true);
});
