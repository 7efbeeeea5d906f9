// Proves the stand-in API server against @kubernetes/client-node, unmodified: kubeconfig + token,
// typed list calls, informers (list, watch, selectors, reconnects, 410 relists, the error traps),
// bookmarks, pagination and the fault injection API that later source tests rely on.
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type TestContext, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  CoreV1Api,
  DiscoveryV1Api,
  type Informer,
  KubeConfig,
  type KubernetesObject,
  ListWatch,
  makeInformer,
  type ObjectCache,
  type V1Node,
  type V1Service,
  Watch,
} from '@kubernetes/client-node';
import {
  LABEL_HEADLESS,
  LABEL_SERVICE_PROXY_NAME,
  type Node,
  PROXY_LABEL_SELECTOR,
  type Service,
} from '../../src/source/objects.ts';
import {
  type ExpiredAs,
  type FakeApiServerOptions,
  makeEndpointSlice,
  makeNode,
  makeService,
  type RecordedRequest,
  startFakeApiServer,
} from '../helpers/fake-apiserver.ts';

/** Things that happened, in order; waitFor resolves on the first (past or future) match. */
class Recorder<T> {
  readonly items: T[] = [];
  #waiters: { test: (item: T) => boolean; resolve: (item: T) => void }[] = [];

  push(item: T): void {
    this.items.push(item);
    for (const w of this.#waiters.filter((w) => w.test(item))) {
      this.#waiters = this.#waiters.filter((x) => x !== w);
      w.resolve(item);
    }
  }

  waitFor(test: (item: T) => boolean, timeoutMs = 3000): Promise<T> {
    const seen = this.items.find(test);
    if (seen !== undefined) return Promise.resolve(seen);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`timed out; saw ${JSON.stringify(this.items)}`)),
        timeoutMs,
      );
      const resolveOnce = (item: T) => {
        clearTimeout(timer);
        resolve(item);
      };
      this.#waiters.push({ test, resolve: resolveOnce });
    });
  }
}

type Seen = { verb: string; name: string; rv: string; error?: unknown };
const named = (verb: string, name: string) => (s: Seen) => s.verb === verb && s.name === name;

async function setup(t: TestContext, options: FakeApiServerOptions = {}) {
  const server = await startFakeApiServer(options);
  t.after(() => server.close());
  const kc = new KubeConfig();
  kc.loadFromString(server.kubeconfigYaml());
  return { server, kc, core: kc.makeApiClient(CoreV1Api) };
}

/** Start an informer, recording add/update/delete/error; stopped (its AbortError absorbed) in t.after. */
async function run<T extends KubernetesObject>(
  t: TestContext,
  informer: Informer<T> & ObjectCache<T>,
): Promise<Recorder<Seen>> {
  const seen = new Recorder<Seen>();
  for (const verb of ['add', 'update', 'delete'] as const) {
    informer.on(verb, (o) =>
      seen.push({ verb, name: o.metadata?.name ?? '', rv: o.metadata?.resourceVersion ?? '' }),
    );
  }
  informer.on('error', (error) => seen.push({ verb: 'error', name: '', rv: '', error }));
  t.after(() => informer.stop());
  await informer.start();
  return seen;
}

/** A Service informer as makeInformer builds it, but typed as the ListWatch it is. */
function serviceInformer(kc: KubeConfig, core: CoreV1Api, labelSelector?: string): ListWatch<V1Service> {
  const list = () => core.listServiceForAllNamespaces({ labelSelector });
  return new ListWatch('/api/v1/services', new Watch(kc), list, false, labelSelector);
}

const isWatch = (rv: string) => (r: RecordedRequest) =>
  r.verb === 'watch' && r.query['resourceVersion'] === rv;
const names = (items: readonly KubernetesObject[]) => items.map((o) => o.metadata?.name).sort();

test('kubeconfig with a bearer token: typed calls work, carry the token; a wrong or missing token gets 401', async (t) => {
  const { server } = await setup(t, { token: 's3cret' });
  server.create(makeService('default', 'web'));
  server.create(makeService('kube-system', 'kube-dns', { clusterIP: '10.96.0.10' }));
  server.create(makeEndpointSlice('default', 'web-abc', 'web', ['10.244.1.5']));
  server.create(makeNode('node-1', { 'topology.kubernetes.io/zone': 'zone-a' }));
  const dir = await mkdtemp(join(tmpdir(), 'fake-apiserver-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const kc = new KubeConfig();
  kc.loadFromFile(await server.writeKubeconfig(dir));
  const core = kc.makeApiClient(CoreV1Api);

  const all = await core.listServiceForAllNamespaces();
  assert.deepEqual(names(all.items), ['kube-dns', 'web']);
  assert.equal(all.metadata?.resourceVersion, server.resourceVersion);
  const dns = await core.listNamespacedService({ namespace: 'kube-system' });
  assert.deepEqual(names(dns.items), ['kube-dns']);
  assert.equal(dns.items[0]?.spec?.clusterIP, '10.96.0.10');
  const node = await core.readNode({ name: 'node-1' });
  assert.equal(node.metadata?.labels?.['topology.kubernetes.io/zone'], 'zone-a');
  const slices = await kc.makeApiClient(DiscoveryV1Api).listNamespacedEndpointSlice({ namespace: 'default' });
  assert.deepEqual(slices.items[0]?.endpoints?.[0]?.addresses, ['10.244.1.5']);

  const first = server.requests[0];
  assert.equal(first?.path, '/api/v1/services');
  assert.equal(first?.headers.authorization, 'Bearer s3cret');
  assert.match(String(first?.headers.accept), /application\/json/);

  for (const yaml of [
    server.kubeconfigYaml().replace('s3cret', 'wrong'),
    server.kubeconfigYaml().replace(/token: .*/, '{}'),
  ]) {
    const other = new KubeConfig();
    other.loadFromString(yaml);
    await assert.rejects(
      other.makeApiClient(CoreV1Api).listServiceForAllNamespaces(),
      (err: { code?: number }) => err.code === 401,
    );
  }
  const raw = await fetch(`${server.url}/api/v1/services`);
  assert.equal(raw.status, 401);
  assert.deepEqual(await raw.json(), {
    kind: 'Status',
    apiVersion: 'v1',
    metadata: {},
    status: 'Failure',
    message: 'Unauthorized',
    reason: 'Unauthorized',
    code: 401,
  });
});

test('routes: get by name, namespaced paths, 404 with a Status for unknown objects and paths', async (t) => {
  const { server } = await setup(t);
  server.create(makeService('default', 'web'));
  server.create(makeEndpointSlice('default', 'web-abc', 'web', ['10.244.1.5']));
  type Body = { kind?: string; code?: number; items: { kind?: string }[] };
  const got = await fetch(`${server.url}/api/v1/namespaces/default/services/web`);
  assert.equal(got.status, 200);
  assert.equal(((await got.json()) as Body).kind, 'Service');
  const slicesPath = '/apis/discovery.k8s.io/v1/namespaces/default/endpointslices';
  const slices = (await (await fetch(`${server.url}${slicesPath}`)).json()) as Body;
  assert.equal(slices.kind, 'EndpointSliceList');
  assert.equal(slices.items[0]?.kind, undefined, 'list items carry no kind, as from the apiserver');
  for (const path of [
    '/api/v1/namespaces/default/services/nope',
    '/api/v1/pods',
    '/api/v1/namespaces/x/nodes',
  ]) {
    const res = await fetch(`${server.url}${path}`);
    assert.equal(res.status, 404, path);
    assert.deepEqual(((await res.json()) as Body).code, 404);
  }
});

test('informer receives add, update and delete; its resourceVersion follows the server', async (t) => {
  const { server, kc, core } = await setup(t);
  server.create(makeService('default', 'listed'));
  const informer = serviceInformer(kc, core);
  const seen = await run(t, informer);
  assert.deepEqual(seen.items, [{ verb: 'add', name: 'listed', rv: '1' }]);

  server.create(makeService('default', 'web'));
  const web = server.get<Service>('Service', 'default', 'web')!;
  web.spec!.ports = [{ name: 'https', protocol: 'TCP', port: 443, targetPort: 8443 }];
  server.update(web);
  server.remove('Service', 'default', 'listed');
  await seen.waitFor(named('delete', 'listed'));
  assert.deepEqual(seen.items.slice(1), [
    { verb: 'add', name: 'web', rv: '2' },
    { verb: 'update', name: 'web', rv: '3' },
    { verb: 'delete', name: 'listed', rv: '4' },
  ]);
  assert.equal(informer.get('web', 'default')?.spec?.ports?.[0]?.port, 443);
  assert.equal(informer.latestResourceVersion(), server.resourceVersion);
});

test("kube-proxy's label selector filters list and watch; leaving the selector is a delete", async (t) => {
  const { server, kc, core } = await setup(t);
  server.create(makeService('default', 'plain'));
  server.create(
    makeService('default', 'headless', { clusterIP: 'None' }, { labels: { [LABEL_HEADLESS]: '' } }),
  );
  server.create(makeService('default', 'other', {}, { labels: { [LABEL_SERVICE_PROXY_NAME]: 'foo' } }));
  // makeInformer adds the selector to the watch only; the list function must apply it itself.
  const listFn = () => core.listServiceForAllNamespaces({ labelSelector: PROXY_LABEL_SELECTOR });
  const informer = makeInformer(kc, '/api/v1/services', listFn, PROXY_LABEL_SELECTOR);
  const seen = await run(t, informer);
  assert.deepEqual(names(informer.list()), ['plain']);
  const [list, watch] = server.requests;
  assert.equal(list?.query['labelSelector'], PROXY_LABEL_SELECTOR);
  assert.equal(watch?.query['labelSelector'], PROXY_LABEL_SELECTOR);

  server.create(makeService('default', 'filtered', {}, { labels: { [LABEL_SERVICE_PROXY_NAME]: 'foo' } }));
  const plain = server.get<Service>('Service', 'default', 'plain')!;
  plain.metadata!.labels = { [LABEL_SERVICE_PROXY_NAME]: 'foo' };
  server.update(plain);
  const other = server.get<Service>('Service', 'default', 'other')!;
  delete other.metadata!.labels;
  server.update(other);
  await seen.waitFor(named('add', 'other'));
  assert.deepEqual(
    seen.items.map((s) => `${s.verb} ${s.name}`),
    ['add plain', 'delete plain', 'add other'],
  );
  assert.deepEqual(names(informer.list()), ['other']);
});

test('label and field selector forms on list (table)', async (t) => {
  const { server, core } = await setup(t);
  server.create(makeService('default', 'a', {}, { labels: { app: 'web', tier: 'front' } }));
  server.create(makeService('default', 'b', {}, { labels: { app: 'web', tier: 'back' } }));
  server.create(makeService('default', 'c', {}, { labels: { app: 'db' } }));
  server.create(makeService('other', 'd'));
  const cases = [
    { name: 'exists', labelSelector: 'app', want: ['a', 'b', 'c'] },
    { name: 'not exists', labelSelector: '!app', want: ['d'] },
    { name: 'equals', labelSelector: 'app=web', want: ['a', 'b'] },
    { name: 'double equals', labelSelector: 'app==web', want: ['a', 'b'] },
    { name: 'not equals matches absent', labelSelector: 'app!=web', want: ['c', 'd'] },
    { name: 'in', labelSelector: 'tier in (front, back)', want: ['a', 'b'] },
    { name: 'notin matches absent', labelSelector: 'tier notin (front)', want: ['b', 'c', 'd'] },
    { name: 'comma is AND', labelSelector: 'app=web,tier!=front', want: ['b'] },
    { name: 'empty', labelSelector: '', want: ['a', 'b', 'c', 'd'] },
    { name: 'field name', fieldSelector: 'metadata.name=a', want: ['a'] },
    { name: 'field name !=', fieldSelector: 'metadata.name!=a', want: ['b', 'c', 'd'] },
    { name: 'field namespace ==', fieldSelector: 'metadata.namespace==other', want: ['d'] },
    { name: 'both', labelSelector: 'app', fieldSelector: 'metadata.name!=c', want: ['a', 'b'] },
  ];
  for (const c of cases) {
    const list = await core.listServiceForAllNamespaces({
      labelSelector: c.labelSelector,
      fieldSelector: c.fieldSelector,
    });
    assert.deepEqual(names(list.items), c.want, c.name);
  }
  for (const bad of [{ labelSelector: 'tier in (a' }, { fieldSelector: 'spec.clusterIP=1.2.3.4' }]) {
    await assert.rejects(core.listServiceForAllNamespaces(bad), (err: { code?: number }) => err.code === 400);
  }
});

test('a Node ListWatch with a field selector sees only its node', async (t) => {
  const { server, kc, core } = await setup(t);
  server.create(makeNode('node-1'));
  server.create(makeNode('node-2'));
  const fieldSelector = 'metadata.name=node-1';
  const list = () => core.listNode({ fieldSelector });
  const informer = new ListWatch<V1Node>(
    '/api/v1/nodes',
    new Watch(kc),
    list,
    false,
    undefined,
    fieldSelector,
  );
  const seen = await run(t, informer);
  for (const name of ['node-2', 'node-1']) {
    const node = server.get<Node>('Node', '', name)!;
    node.metadata!.labels!['topology.kubernetes.io/zone'] = 'zone-b';
    server.update(node);
  }
  await seen.waitFor(named('update', 'node-1'));
  assert.deepEqual(
    seen.items.map((s) => `${s.verb} ${s.name}`),
    ['add node-1', 'update node-1'],
  );
  assert.equal(server.requests[1]?.query['fieldSelector'], fieldSelector);
});

test('clean close: the informer re-watches from its last RV without relisting', async (t) => {
  const { server, kc, core } = await setup(t);
  const seen = await run(t, serviceInformer(kc, core));
  server.create(makeService('default', 'web'));
  const { rv } = await seen.waitFor(named('add', 'web'));
  const from = server.requests.length;
  server.closeWatches();
  await server.waitForRequest(isWatch(rv), 3000, from);
  server.create(makeService('default', 'api'));
  await seen.waitFor(named('add', 'api'));
  assert.deepEqual(
    server.requests.slice(from).map((r) => r.verb),
    ['watch'],
  );
  assert.equal(seen.items.length, 2);
});

for (const expiredAs of ['event', 'http'] satisfies ExpiredAs[]) {
  test(`410 Expired as ${expiredAs === 'event' ? 'an ERROR event' : 'HTTP 410'}: the informer relists`, async (t) => {
    const { server, kc, core } = await setup(t);
    server.create(makeService('default', 'old'));
    const seen = await run(t, serviceInformer(kc, core));
    const from = server.requests.length;
    // All in one tick, before the client can reconnect: it comes back with an RV the server forgot.
    server.closeWatches();
    server.remove('Service', 'default', 'old');
    server.create(makeService('default', 'new'));
    server.expireHistory(expiredAs);
    await seen.waitFor(named('add', 'new'));
    await seen.waitFor(named('delete', 'old'));
    await server.waitForRequest(isWatch(server.resourceVersion), 3000, from);
    const after = server.requests.slice(from);
    assert.deepEqual(
      after.map((r) => r.verb),
      ['watch', 'list', 'watch'],
    );
    assert.equal(after[0]?.query['resourceVersion'], '1');
    assert.ok(!seen.items.some((s) => s.verb === 'error'), 'a 410 is not an error for the informer');
  });
}

test('cut socket: the informer emits an error and stops for good (the trap a wrapper must handle)', async (t) => {
  const { server, kc, core } = await setup(t);
  const seen = await run(t, serviceInformer(kc, core));
  server.cutWatches();
  const { error } = await seen.waitFor((s) => s.verb === 'error');
  assert.ok(error instanceof Error);
  const from = server.requests.length;
  server.create(makeService('default', 'web'));
  await sleep(300); // proving an absence: nothing may reconnect in this window
  assert.equal(server.requests.length, from);
  assert.equal(server.openWatches, 0);
  assert.ok(!seen.items.some((s) => s.verb === 'add'));
});

for (const status of [500, 403]) {
  test(`HTTP ${status} on the watch: the informer emits an error with that statusCode`, async (t) => {
    const { server, kc, core } = await setup(t);
    const seen = await run(t, serviceInformer(kc, core));
    server.failNext(1, status, 'watch');
    server.closeWatches();
    const { error } = await seen.waitFor((s) => s.verb === 'error');
    assert.equal((error as { statusCode?: number }).statusCode, status);
    // The fault was for one watch only: lists still work.
    assert.equal((await core.listServiceForAllNamespaces()).items.length, 0);
  });
}

test('failNext and setFailing on lists: Status bodies, then recovery', async (t) => {
  const { server, core } = await setup(t);
  server.failNext(1, 500, 'list');
  await assert.rejects(core.listServiceForAllNamespaces(), (err: { code?: number; body?: unknown }) => {
    assert.equal(err.code, 500);
    assert.match(String(err.body), /"reason":"InternalError"/);
    return true;
  });
  await core.listServiceForAllNamespaces();
  server.setFailing(403);
  await assert.rejects(core.listNode(), (err: { code?: number }) => err.code === 403);
  await assert.rejects(core.listNode(), (err: { code?: number }) => err.code === 403);
  server.setFailing(null);
  await core.listNode();
});

test('bookmarks: only when allowed, at the latest global RV (sendBookmark and periodic)', async (t) => {
  const { server, kc } = await setup(t, { bookmarkIntervalMs: 100 });
  server.create(makeService('default', 'web'));
  const watch = new Watch(kc);
  const withBookmarks = new Recorder<{ type: string; rv: string }>();
  const without = new Recorder<{ type: string; rv: string }>();
  for (const [rec, allowWatchBookmarks] of [
    [withBookmarks, true],
    [without, undefined],
  ] as const) {
    const req = await watch.watch(
      '/api/v1/services',
      { resourceVersion: '1', allowWatchBookmarks },
      (type, obj) => rec.push({ type, rv: obj.metadata?.resourceVersion }),
      () => {},
    );
    t.after(() => req.abort());
  }
  assert.equal(server.requests[0]?.query['allowWatchBookmarks'], 'true');
  // Another kind moves the global RV; a service watch learns it only through a bookmark.
  server.create(makeEndpointSlice('default', 'web-abc', 'web', ['10.244.1.5']));
  server.sendBookmark();
  const bookmark = await withBookmarks.waitFor((e) => e.type === 'BOOKMARK');
  assert.equal(bookmark.rv, '2');
  server.create(makeService('default', 'api'));
  await without.waitFor((e) => e.type === 'ADDED');
  assert.deepEqual(without.items, [{ type: 'ADDED', rv: '3' }]);
  await withBookmarks.waitFor((e) => e.type === 'BOOKMARK' && e.rv === '3'); // the periodic one
});

test('timeoutSeconds ends the watch cleanly; silence holds events back until it ends', async (t) => {
  const { server, kc } = await setup(t);
  const watch = new Watch(kc);
  const events = new Recorder<string>();
  const done = new Recorder<unknown>();
  const params = { resourceVersion: '0', timeoutSeconds: 1, allowWatchBookmarks: true };
  const req = await watch.watch(
    '/api/v1/services',
    params,
    (type, obj) => events.push(`${type} ${obj.metadata?.name}`),
    (err) => done.push(err ?? 'clean'),
  );
  t.after(() => req.abort());
  server.silence(true);
  server.create(makeService('default', 'web'));
  server.sendBookmark();
  await sleep(200); // proving an absence
  assert.deepEqual(events.items, []);
  server.silence(false);
  await events.waitFor((e) => e === 'ADDED web');
  assert.equal(await done.waitFor(() => true), 'clean');
  assert.deepEqual(events.items, ['ADDED web']);
});

test('watch from RV 0 replays current state; unparsable lines are ignored by the client', async (t) => {
  const { server, kc } = await setup(t);
  server.create(makeService('default', 'web'));
  const events = new Recorder<string>();
  const req = await new Watch(kc).watch(
    '/api/v1/services',
    { resourceVersion: '0' },
    (type, obj) => events.push(`${type} ${obj.metadata?.name} ${obj.kind}`),
    () => {},
  );
  t.after(() => req.abort());
  await events.waitFor((e) => e === 'ADDED web Service');
  server.injectLine('{not json');
  server.remove('Service', 'default', 'web');
  await events.waitFor((e) => e.startsWith('DELETED'));
  assert.deepEqual(events.items, ['ADDED web Service', 'DELETED web Service']);
});

test('pagination: limit/continue over a consistent snapshot; unknown or expired tokens get 410', async (t) => {
  const { server, core } = await setup(t);
  for (const name of ['s1', 's2', 's3', 's4', 's5']) server.create(makeService('default', name));
  const p1 = await core.listServiceForAllNamespaces({ limit: 2 });
  assert.deepEqual(names(p1.items), ['s1', 's2']);
  assert.equal(p1.metadata?.remainingItemCount, 3);
  server.create(makeService('default', 's0')); // not in the snapshot
  const p2 = await core.listServiceForAllNamespaces({ limit: 2, _continue: p1.metadata?._continue });
  const p3 = await core.listServiceForAllNamespaces({ limit: 2, _continue: p2.metadata?._continue });
  assert.deepEqual([...names(p2.items), ...names(p3.items)], ['s3', 's4', 's5']);
  assert.equal(p2.metadata?.resourceVersion, p1.metadata?.resourceVersion);
  assert.equal(p3.metadata?._continue, undefined);
  assert.equal(server.requests[1]?.query['limit'], '2');

  const expired = await core.listServiceForAllNamespaces({ limit: 2 });
  server.expireHistory();
  for (const token of [expired.metadata?._continue, 'bm9wZQ']) {
    await assert.rejects(
      core.listServiceForAllNamespaces({ limit: 2, _continue: token }),
      (err: { code?: number }) => err.code === 410,
    );
  }
});

test('stop refuses connections; restart serves the same store on the same port', async (t) => {
  const { server, core } = await setup(t);
  server.create(makeService('default', 'web'));
  const port = server.port;
  await server.stop();
  await assert.rejects(core.listServiceForAllNamespaces(), (err: Error & { cause?: { code?: string } }) => {
    assert.equal(err.cause?.code, 'ECONNREFUSED');
    return true;
  });
  await server.restart();
  assert.equal(server.port, port);
  const list = await core.listServiceForAllNamespaces();
  assert.deepEqual(names(list.items), ['web']);
  assert.equal(server.create(makeService('default', 'api')).metadata?.resourceVersion, '2');
});

test('hostile modes: what each answers on the wire, only on its path and verb; off ends open answers', async (t) => {
  const { server } = await setup(t);
  server.create(makeService('default', 'web'));
  const get = (path: string) => fetch(`${server.url}${path}`);
  /** Reads up to `max` bytes of a body, then drops the connection. */
  const head = async (res: Response, max: number) => {
    let text = '';
    for await (const chunk of res.body!) {
      text += Buffer.from(chunk).toString();
      if (text.length >= max) break;
    }
    return text;
  };

  server.hostile('html', { path: '/api/v1/services' });
  const html = await get('/api/v1/services');
  assert.equal(html.status, 200);
  assert.equal(html.headers.get('content-type'), 'text/html');
  assert.match(await html.text(), /<title>502 Bad Gateway<\/title>/);
  // Other paths answer as ever.
  assert.equal((await get('/api/v1/nodes')).headers.get('content-type'), 'application/json');
  server.hostile('html', { status: 502 });
  assert.equal((await get('/api/v1/nodes')).status, 502);

  server.hostile('endless-continue');
  const page1 = (await (await get('/api/v1/services?limit=3')).json()) as {
    metadata: { continue: string };
    items: unknown[];
  };
  assert.equal(page1.items.length, 3);
  const page2 = (await (
    await get(`/api/v1/services?limit=3&continue=${page1.metadata.continue}`)
  ).json()) as {
    metadata: { continue: string };
  };
  assert.notEqual(page2.metadata.continue, page1.metadata.continue);
  // A watch is not a list: answered normally.
  const watch = await get('/api/v1/services?watch=true&resourceVersion=0');
  assert.match(await head(watch, 10), /^{"type":"ADDED"/);

  server.hostile('endless-body');
  const body = await head(await get('/api/v1/services'), 3 * 1024 * 1024);
  assert.match(body, /^{"kind":"ServiceList",.*"items":\[{"metadata":{"name":"hostile-0"/);
  assert.ok(body.length >= 3 * 1024 * 1024);

  server.hostile('endless-line');
  const line = await head(await get('/api/v1/services?watch=true'), 2 * 1024 * 1024);
  assert.ok(!line.includes('\n') && line.length >= 2 * 1024 * 1024);

  server.hostile('gone-storm');
  const gone = await (await get('/api/v1/services?watch=true&resourceVersion=1')).text();
  assert.match(gone, /^{"type":"ERROR","object":{.*"code":410}}\n$/);
  // Lists succeed during a storm.
  assert.equal(((await (await get('/api/v1/services')).json()) as { items: unknown[] }).items.length, 1);

  server.hostile('unknown-types');
  const flood = await get('/api/v1/services?watch=true');
  assert.match(await head(flood, 100), /^{"type":"SURPRISE"/);
  // Backpressure: a client that stops reading stops the flood (socket buffers aside).
  const sent = server.hostileBytes;
  await sleep(200);
  assert.ok(server.hostileBytes - sent < 16 * 1024 * 1024, `${server.hostileBytes - sent} bytes`);
  const open = await get('/api/v1/services?watch=true');
  const ended = open.text();
  server.hostile(null);
  assert.match(await ended, /SURPRISE/);
  assert.equal((await get('/api/v1/services')).headers.get('content-type'), 'application/json');
});
