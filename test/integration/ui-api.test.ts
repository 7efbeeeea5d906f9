// The console's JSON endpoints on the real proxy process (the bin on the demo manifest, --no-iptables):
// service ports paged, searched and sorted by the proxy; one port's endpoints with their state, picks and
// ejection; rates, also of a connection still open; the connection table's filters and pages; sync health;
// bad queries refused with a reason; and nothing a client sent in headers, query strings or bodies.
import assert from 'node:assert/strict';
import dgram from 'node:dgram';
import http from 'node:http';
import net from 'node:net';
import { after, before, test } from 'node:test';
import type { UiConnectionsBody } from '../../src/server/ui-connections.ts';
import type { UiOverview } from '../../src/server/ui-overview.ts';
import type { UiServicesBody } from '../../src/server/ui-services.ts';
import { type DemoProxy, POD_IPS, startDemoProxy } from '../helpers/demo-proxy.ts';
import { waitFor } from '../helpers/servers.ts';

const EXTRA = 120;
const SECRETS = ['s3cr3t-auth-9f1', 's3cr3t-cookie-9f1', 's3cr3t-query-9f1', 's3cr3t-body-9f1'];
/** Nothing listens on this pod IP: connects to it are refused. */
const DEAD_POD = '127.0.0.21';

let proxy: DemoProxy;
before(async () => {
  proxy = await startDemoProxy({
    extraServicePorts: EXTRA,
    // Ejections that last the whole test.
    extraArgs: ['--outlier-base-ejection-time=120s'],
    extraObjects: (port) => [
      {
        apiVersion: 'v1',
        kind: 'Service',
        metadata: { name: 'flaky', namespace: 'lab' },
        spec: {
          clusterIP: '10.96.5.5',
          ports: [{ name: 'http', protocol: 'TCP', port: 80, targetPort: port }],
        },
      },
      {
        apiVersion: 'discovery.k8s.io/v1',
        kind: 'EndpointSlice',
        metadata: { name: 'flaky-1', namespace: 'lab', labels: { 'kubernetes.io/service-name': 'flaky' } },
        addressType: 'IPv4',
        ports: [{ name: 'http', protocol: 'TCP', port }],
        endpoints: [
          { addresses: [POD_IPS[0]], conditions: { ready: true } },
          { addresses: [DEAD_POD], conditions: { ready: true } },
        ],
      },
    ],
  });
});
after(() => proxy?.stop());

async function api<T>(path: string): Promise<T> {
  const res = await fetch(`${proxy.metrics}${path}`);
  assert.equal(res.status, 200, `${path}: ${res.status}`);
  assert.equal(res.headers.get('cache-control'), 'no-store');
  assert.equal(res.headers.get('x-content-type-options'), 'nosniff');
  return (await res.json()) as T;
}

function port(key: string): number {
  const p = proxy.proxyPorts.get(key);
  assert.ok(p, key);
  return p;
}

/** One request on its own connection (closed after), from `localAddress`. */
function httpGet(
  to: number,
  path: string,
  options: { localAddress?: string; headers?: http.OutgoingHttpHeaders; body?: string } = {},
): Promise<string> {
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        host: '127.0.0.1',
        port: to,
        path,
        method: options.body ? 'POST' : 'GET',
        localAddress: options.localAddress,
        agent: false,
        headers: { connection: 'close', ...options.headers },
      },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (d) => {
          text += d;
        });
        res.on('end', () => resolve(text));
      },
    );
    req.on('error', reject);
    req.end(options.body);
  });
}

test('service ports: paged, sorted by name, searched by name, IP and port', async () => {
  const all = await api<UiServicesBody>('/ui/api/services?limit=500');
  assert.equal(all.total, 3 + EXTRA + 1);
  assert.equal(all.matched, all.total);
  const names = all.items.map((s) => s.key);
  assert.deepEqual(names, [...names].sort());
  assert.deepEqual(names.slice(0, 3), ['demo/echo:http/TCP', 'demo/echo:udp/UDP', 'demo/sticky:http/TCP']);
  // Pages: 50 by default, disjoint, in order.
  const first = await api<UiServicesBody>('/ui/api/services');
  const second = await api<UiServicesBody>('/ui/api/services?offset=50');
  assert.equal(first.items.length, 50);
  assert.deepEqual(
    [...first.items, ...second.items].map((s) => s.key),
    names.slice(0, 100),
  );
  const last = await api<UiServicesBody>(`/ui/api/services?offset=${all.total - 2}&limit=10`);
  assert.equal(last.items.length, 2);
  const past = await api<UiServicesBody>('/ui/api/services?offset=100000');
  assert.deepEqual([past.items.length, past.matched], [0, all.total]);

  const search = async (q: string) =>
    (await api<UiServicesBody>(`/ui/api/services?limit=500&q=${encodeURIComponent(q)}`)).items.map(
      (s) => s.key,
    );
  assert.deepEqual(await search('STICKY'), ['demo/sticky:http/TCP']);
  assert.deepEqual(await search('10.96.0.1'), [
    'demo/echo:http/TCP',
    'demo/echo:udp/UDP',
    'demo/sticky:http/TCP',
  ]);
  assert.equal((await search('svc-0001')).length, 10);
  assert.deepEqual(await search(String(port('demo/sticky:http/TCP'))), ['demo/sticky:http/TCP']);
  // A number is a port (the UDP one's 53) or part of a name.
  assert.deepEqual(await search('53'), ['demo/echo:udp/UDP', 'gen/svc-00053:http/TCP']);
  assert.deepEqual(await search(DEAD_POD), ['lab/flaky:http/TCP']);
  assert.deepEqual(await search('no-such-thing'), []);

  const echo = all.items[0]!;
  assert.deepEqual(
    [echo.clusterIPs, echo.port, echo.nodePort, echo.proxyPort, echo.sessionAffinity],
    [['10.96.0.10'], 80, 0, port('demo/echo:http/TCP'), 'None'],
  );
  assert.deepEqual(echo.endpointCounts, { total: 2, ready: 2, terminating: 0, ejected: 0, loop: 0 });
});

test('one port in full: endpoints with state, picks, connect failures by reason, and an ejection with its end', async () => {
  const flaky = port('lab/flaky:http/TCP');
  // Round robin: every other connection tries the dead pod first, fails, and is retried on the live one.
  for (let i = 0; i < 8; i++) assert.match(await httpGet(flaky, `/try/${i}`), /hello from 127\.0\.0\.11/);
  const body = await api<UiServicesBody>('/ui/api/services?q=flaky&expand=lab/flaky:http/TCP');
  const d = body.detail!;
  assert.equal(d.key, 'lab/flaky:http/TCP');
  assert.equal(d.connections.connectFailures.refused, 3, JSON.stringify(d.connections));
  const byIp = new Map(d.endpoints.map((e) => [e.endpoint.split(':')[0], e]));
  assert.equal(byIp.get(POD_IPS[0])!.state, 'ready');
  assert.equal(byIp.get(DEAD_POD)!.state, 'ejected');
  const until = Date.parse(byIp.get(DEAD_POD)!.ejectedUntil!);
  assert.ok(until > Date.now() + 60_000 && until < Date.now() + 130_000, byIp.get(DEAD_POD)!.ejectedUntil);
  assert.equal(byIp.get(POD_IPS[0])!.picks + byIp.get(DEAD_POD)!.picks, d.connections.accepted + 3);
  assert.equal(d.endpointCounts.ejected, 1);
  assert.equal(body.items[0]!.endpointCounts.ejected, 1);
  // A key that is not there: no detail, no error.
  assert.equal((await api<UiServicesBody>('/ui/api/services?expand=nope/nope:x/TCP')).detail, undefined);
});

test('rates: connections/s and bytes/s each way, also of a connection that is still open', async () => {
  // A port nothing else touches, and one kept-alive connection to it that sends a request every 100 ms:
  // the relays count its bytes only at close, the console's rates count them as they go.
  const key = 'gen/svc-00007:http/TCP';
  const socket = net.connect({ host: '127.0.0.1', port: port(key) });
  const sent = setInterval(() => socket.write('GET /stream HTTP/1.1\r\nHost: rates.example\r\n\r\n'), 100);
  socket.on('data', () => {});
  socket.on('error', () => {});
  try {
    let detail: UiServicesBody['detail'];
    const positive = (series: (number | null)[] | undefined) => series?.some((v) => (v ?? 0) > 0) === true;
    await waitFor(
      async () => {
        detail = (await api<UiServicesBody>(`/ui/api/services?q=svc-00007&expand=${key}`)).detail;
        const s = detail?.series ?? undefined;
        return positive(s?.[0]) && positive(s?.[1]) && positive(s?.[2]);
      },
      15_000,
      'connections/s and bytes/s each way above 0',
    );
    assert.equal(detail!.connections.active, 1, 'the connection is still open');
    assert.equal(detail!.connections.accepted, 1);
    const overview = await api<UiOverview>('/ui/api/overview');
    assert.equal(overview.times.length, overview.rates[0]!.length);
    assert.ok(positive(overview.rates[1]), 'total bytes/s from clients');
    // Sorted by connections/s, an idle port never comes before a busy one.
    const items = (await api<UiServicesBody>('/ui/api/services?sort=rate&limit=500')).items;
    const rates = items.map((s) => s.rates[0]!);
    assert.deepEqual(
      rates,
      [...rates].sort((a, b) => b - a),
    );
    const row = items.find((s) => s.key === key)!;
    assert.ok(row.spark !== null && row.spark.length === overview.times.length);
  } finally {
    clearInterval(sent);
    socket.destroy();
  }
});

test('the connection table: every filter and pages', async () => {
  const echo = port('demo/echo:http/TCP');
  const sticky = port('demo/sticky:http/TCP');
  await httpGet(echo, '/from-a', { localAddress: '127.0.0.2' });
  await httpGet(echo, '/from-a-again', { localAddress: '127.0.0.2' });
  await httpGet(sticky, '/from-b', { localAddress: '127.0.0.3' });
  const udp = dgram.createSocket('udp4');
  await new Promise<void>((resolve) => udp.bind(0, '127.0.0.4', resolve));
  const answered = new Promise((r) => udp.once('message', r));
  udp.send('ping', port('demo/echo:udp/UDP'), '127.0.0.1');
  await answered;
  udp.close();
  // One connection held open.
  const held = net.connect({ host: '127.0.0.1', port: sticky, localAddress: '127.0.0.5' });
  held.write('GET /held HTTP/1.1\r\nHost: held.example\r\n\r\n');
  await new Promise((r) => held.once('data', r));
  try {
    const rows = async (q: string) =>
      (await api<UiConnectionsBody>(`/ui/api/connections?limit=500&${q}`)).rows;
    await waitFor(
      async () => (await rows('client=127.0.0.3')).length === 1,
      3000,
      'the closed sticky connection',
    );
    const byClient = await rows('client=127.0.0.2');
    assert.equal(byClient.length, 2);
    assert.ok(byClient.every((r) => r.service === 'demo/echo:http' && r.client.startsWith('127.0.0.2:')));
    assert.ok((await rows('service=demo/sticky')).every((r) => r.service === 'demo/sticky:http'));
    assert.ok((await rows('service=demo')).some((r) => r.service === 'demo/echo:udp'));
    const udpRows = await rows('protocol=UDP');
    assert.ok(udpRows.length >= 1 && udpRows.every((r) => r.protocol === 'UDP'));
    assert.ok((await rows('protocol=dns')).every((r) => r.app?.protocol === 'dns'));
    const http1 = await rows('protocol=http1&client=127.0.0.2');
    assert.deepEqual(http1.map((r) => (r.app?.protocol === 'http1' ? r.app.exchanges[0]!.path : '')).sort(), [
      '/from-a',
      '/from-a-again',
    ]);
    const toA = await rows(`endpoint=${POD_IPS[0]}`);
    assert.ok(toA.length > 0);
    assert.ok(
      toA.every(
        (r) =>
          r.endpoint?.startsWith(`${POD_IPS[0]}:`) ||
          r.attempts.some((a) => a.endpoint.startsWith(POD_IPS[0])),
      ),
    );
    // The flaky service's failed attempts count as tries of the dead endpoint.
    assert.ok((await rows(`endpoint=${DEAD_POD}`)).every((r) => r.service === 'lab/flaky:http'));
    const active = await rows('state=active&client=127.0.0.5');
    assert.equal(active.length, 1);
    assert.equal(active[0]!.state, 'active');
    assert.equal((await rows('state=closed&client=127.0.0.5')).length, 0);
    // Pages: active first, then closed, newest first; disjoint.
    const all = await api<UiConnectionsBody>('/ui/api/connections?limit=500');
    const total = all.matched.active + all.matched.recent;
    assert.equal(all.rows.length, total);
    assert.ok(all.rows.slice(0, all.matched.active).every((r) => r.state === 'active'));
    const p1 = await api<UiConnectionsBody>('/ui/api/connections?limit=3');
    const p2 = await api<UiConnectionsBody>('/ui/api/connections?limit=3&offset=3');
    assert.equal(new Set([...p1.rows, ...p2.rows].map((r) => r.id)).size, Math.min(6, total));
    // The very records /debug/connections serves.
    const debug = (await (await fetch(`${proxy.metrics}/debug/connections?client=127.0.0.2`)).json()) as {
      recent: unknown[];
    };
    assert.deepEqual(
      Object.keys(byClient[0]!).sort(),
      Object.keys(debug.recent[0] as Record<string, unknown>).sort(),
    );
  } finally {
    held.destroy();
  }
});

test('sync health and totals', async () => {
  const o = await api<UiOverview>('/ui/api/overview');
  assert.equal(o.node, 'demo-node');
  assert.deepEqual(o.mode, { iptables: false, trace: 'protocols' });
  assert.equal(o.sync.healthy, true);
  assert.equal(o.sync.reason, 'ok');
  assert.ok(Date.parse(o.sync.lastSync!) <= Date.now());
  assert.ok(typeof o.sync.lastSyncDurationMs === 'number' && o.sync.lastSyncDurationMs >= 0);
  assert.equal(o.sync.pendingServiceChanges, 0);
  assert.equal(o.sync.pendingEndpointChanges, 0);
  assert.equal(o.sync.iptablesRestoreFailures, null, 'nothing is restored with --no-iptables');
  assert.equal(o.sync.failedServicePorts, 0);
  assert.equal(o.totals.servicePorts, 3 + EXTRA + 1);
  assert.ok(o.totals.accepted > 0);
  assert.equal(o.tracer.maxFollowers, 32);
});

test('bad queries are refused with the reason, and the proxy keeps serving', async () => {
  for (const [path, reason] of [
    ['/ui/api/services?sort=fastest', /invalid sort "fastest"/],
    ['/ui/api/services?limit=0', /invalid limit "0"/],
    ['/ui/api/services?limit=501', /invalid limit "501"/],
    ['/ui/api/services?offset=-1', /invalid offset "-1"/],
    [`/ui/api/services?q=${'x'.repeat(300)}`, /q is longer than 256/],
    ['/ui/api/connections?state=zombie', /invalid state "zombie"/],
    ['/ui/api/connections?protocol=gopher', /invalid protocol "gopher"/],
    ['/ui/api/connections?limit=1e3', /invalid limit "1e3"/],
  ] as const) {
    const res = await fetch(`${proxy.metrics}${path}`);
    assert.equal(res.status, 400, path);
    assert.match(await res.text(), reason);
  }
  assert.equal((await fetch(`${proxy.metrics}/ui/api/overview`)).status, 200);
  assert.equal((await fetch(`${proxy.metrics}/ui/api/nope`)).status, 404);
  const post = await fetch(`${proxy.metrics}/ui/api/services`, { method: 'POST' });
  assert.equal(post.status, 405);
});

test('nothing a client sent beyond what /debug/connections shows: no header values, query strings or bodies', async () => {
  const echo = port('demo/echo:http/TCP');
  await httpGet(echo, `/login?token=${SECRETS[2]}`, {
    localAddress: '127.0.0.6',
    headers: { authorization: `Bearer ${SECRETS[0]}`, cookie: `session=${SECRETS[1]}` },
    body: `password=${SECRETS[3]}`,
  });
  await waitFor(
    async () => (await api<UiConnectionsBody>('/ui/api/connections?client=127.0.0.6')).rows.length === 1,
    3000,
    'the connection in the table',
  );
  const texts = await Promise.all(
    [
      '/ui/api/connections?limit=500',
      '/ui/api/connections?client=127.0.0.6',
      '/ui/api/services?limit=500&expand=demo/echo:http/TCP',
      '/ui/api/overview',
      '/ui/',
    ].map(async (p) => (await fetch(`${proxy.metrics}${p}`)).text()),
  );
  for (const text of texts) for (const s of SECRETS) assert.ok(!text.includes(s), `${s} leaked`);
  assert.match(texts[1]!, /"path":"\/login"/);
});
