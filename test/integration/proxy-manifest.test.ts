// The whole proxy on a manifest file (--no-iptables), with real loopback traffic: live reload of
// services and endpoints, broken files, port range exhaustion and ports taken by other processes.
import assert from 'node:assert/strict';
import dgram from 'node:dgram';
import { mkdtemp, rename, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { test } from 'node:test';
import { createLogger } from '../../src/lib/log.ts';
import { DEFAULT_TCP_OPTIONS, TcpListener } from '../../src/relay/tcp.ts';
import { DEFAULT_UDP_OPTIONS, UdpListener } from '../../src/relay/udp.ts';
import type { ProxyHandlers } from '../../src/source/handlers.ts';
import { ManifestSource } from '../../src/source/manifest.ts';
import { service, slice, startManifestProxy, toYaml } from '../helpers/manifests.ts';
import { log, makeContext } from '../helpers/relay.ts';
import { request, type TestServer, udpRequest, udpServer, waitFor } from '../helpers/servers.ts';

/** Three "pods" on 127.0.0.11-13 sharing one port (as pods of a Deployment share a targetPort). */
async function pods(t: { after(fn: () => unknown): void }): Promise<number> {
  const first = await listenOn('127.0.0.11', 0);
  const rest = await Promise.all(['127.0.0.12', '127.0.0.13'].map((h) => listenOn(h, first.port)));
  t.after(() => Promise.all([first, ...rest].map((s) => s.close())));
  return first.port;
}

test('services and endpoints from a manifest: round robin, then add, change and remove while traffic flows', async (t) => {
  const port = await pods(t);
  const proxy = await startManifestProxy([
    service('web', '10.96.0.1', [{ name: 'http', port: 80, targetPort: port }]),
    slice('web', 'web-1', [{ ip: '127.0.0.11' }, { ip: '127.0.0.12' }], [{ name: 'http', port }]),
  ]);
  t.after(() => proxy.close());
  const key = 'default/web:http/TCP';
  await waitFor(() => proxy.proxyPort(key) !== undefined, 3000, 'web to open');
  const webPort = proxy.proxyPort(key)!;

  // A client polls throughout; not one request may fail while endpoints change.
  let failures = 0;
  let total = 0;
  const seen = new Set<string>();
  let polling = true;
  const poller = (async () => {
    const deadline = Date.now() + 20_000;
    while (polling && Date.now() < deadline) {
      total++;
      try {
        seen.add(await request(webPort));
      } catch {
        failures++;
      }
    }
  })();

  await waitFor(() => seen.has('127.0.0.11') && seen.has('127.0.0.12'), 3000, 'both endpoints to answer');
  // Add an endpoint in a second slice.
  await proxy.write([
    service('web', '10.96.0.1', [{ name: 'http', port: 80, targetPort: port }]),
    slice('web', 'web-1', [{ ip: '127.0.0.11' }, { ip: '127.0.0.12' }], [{ name: 'http', port }]),
    slice('web', 'web-2', [{ ip: '127.0.0.13' }], [{ name: 'http', port }]),
  ]);
  await waitFor(() => seen.has('127.0.0.13'), 3000, 'the new endpoint to get traffic');
  // Remove one endpoint (not ready any more): it stops getting traffic; the listener stays on its port.
  await proxy.write([
    service('web', '10.96.0.1', [{ name: 'http', port: 80, targetPort: port }]),
    slice(
      'web',
      'web-1',
      [{ ip: '127.0.0.11', ready: false, serving: false }, { ip: '127.0.0.12' }],
      [{ name: 'http', port }],
    ),
    slice('web', 'web-2', [{ ip: '127.0.0.13' }], [{ name: 'http', port }]),
  ]);
  await waitFor(
    () => proxy.server.proxier.get(key as never)?.endpoints.length === 2,
    3000,
    'endpoint removal',
  );
  // The request in flight may have been dialled before the change: count from the next one.
  const inFlight = total;
  await waitFor(() => total > inFlight, 3000, 'the request in flight to finish');
  seen.clear();
  await waitFor(() => seen.size >= 2, 3000, 'traffic after the change');
  assert.ok(!seen.has('127.0.0.11'), 'the not-ready endpoint gets no traffic');
  assert.equal(proxy.proxyPort(key), webPort, 'an endpoint change does not move the listener');
  // Affinity change applies in place too.
  await proxy.write([
    service('web', '10.96.0.1', [{ name: 'http', port: 80, targetPort: port }], {
      sessionAffinity: 'ClientIP',
      timeoutSeconds: 30,
    }),
    slice(
      'web',
      'web-1',
      [{ ip: '127.0.0.11', ready: false, serving: false }, { ip: '127.0.0.12' }],
      [{ name: 'http', port }],
    ),
    slice('web', 'web-2', [{ ip: '127.0.0.13' }], [{ name: 'http', port }]),
  ]);
  await waitFor(
    () => proxy.server.proxier.get(key as never)?.context.balancer.sessionAffinity === 'ClientIP',
    3000,
    'affinity',
  );
  assert.equal(proxy.proxyPort(key), webPort);
  // Add a second service; then remove the first.
  await proxy.write([
    service('web', '10.96.0.1', [{ name: 'http', port: 80, targetPort: port }]),
    slice('web', 'web-1', [{ ip: '127.0.0.12' }], [{ name: 'http', port }]),
    service('api', '10.96.0.2', [{ name: '', port: 80, targetPort: port }]),
    slice('api', 'api-1', [{ ip: '127.0.0.13' }], [{ name: '', port }]),
  ]);
  await waitFor(() => proxy.proxyPort('default/api:/TCP') !== undefined, 3000, 'api to open');
  assert.equal(await request(proxy.proxyPort('default/api:/TCP')!), '127.0.0.13');
  polling = false;
  await poller;
  assert.equal(failures, 0, `${failures} of ${total} requests failed during endpoint changes`);
  await proxy.write([
    service('api', '10.96.0.2', [{ name: '', port: 80, targetPort: port }]),
    slice('api', 'api-1', [{ ip: '127.0.0.13' }], [{ name: '', port }]),
  ]);
  await waitFor(() => proxy.proxyPort(key) === undefined, 3000, 'web to close');
  await assert.rejects(request(webPort), /ECONNREFUSED/);
  assert.equal(await request(proxy.proxyPort('default/api:/TCP')!), '127.0.0.13');
});

test('a broken manifest is reported with its location and the last good state keeps serving', async (t) => {
  const pod = await listenOn('127.0.0.11', 0, 'pod');
  t.after(() => pod.close());
  const good = [
    service('web', '10.96.0.1', [{ name: 'http', port: 80, targetPort: pod.port }]),
    slice('web', 'web-1', [{ ip: '127.0.0.11' }], [{ name: 'http', port: pod.port }]),
  ];
  const proxy = await startManifestProxy(good);
  t.after(() => proxy.close());
  const key = 'default/web:http/TCP';
  await waitFor(() => proxy.proxyPort(key) !== undefined, 3000, 'open');
  const port = proxy.proxyPort(key)!;
  const cases = [
    {
      name: 'YAML syntax error',
      text: 'apiVersion: v1\nkind: Service\nmetadata: {name: x\n',
      want: /services\.yaml:\d+:\d+/,
    },
    {
      name: 'unknown kind',
      text: 'apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n',
      want: /unknown kind \\"Pod\\"/,
    },
    {
      name: 'wrong type',
      text: 'apiVersion: v1\nkind: Service\nmetadata: {name: x, namespace: d}\nspec:\n  clusterIP: 10.0.0.1\n  ports:\n    - port: "eighty"\n',
      want: /services\.yaml:7:\d+/,
    },
  ];
  for (const c of cases) {
    const failuresBefore = proxy.server.manifest!.failures;
    await proxy.write(c.text);
    await waitFor(() => proxy.server.manifest!.failures > failuresBefore, 3000, `${c.name} to be rejected`);
    const line = proxy.logs.filter((l) => l.includes('Manifest rejected')).at(-1)!;
    assert.match(line, c.want, c.name);
    assert.match(line, /KUP_ERR_MANIFEST_INVALID/);
    assert.equal(await request(port), 'pod', `still serving after ${c.name}`);
    assert.equal(proxy.proxyPort(key), port);
  }
  // A fixed file is picked up again.
  await proxy.write([
    ...good,
    service('api', '10.96.0.2', [{ name: 'http', port: 80, targetPort: pod.port }]),
  ]);
  await waitFor(() => proxy.proxyPort('default/api:http/TCP') !== undefined, 3000, 'the fixed file');
});

test('UDP service from a manifest', async (t) => {
  const dns = await udpServer('127.0.0.11', (msg) => Buffer.concat([Buffer.from('answer:'), msg]));
  t.after(() => dns.close());
  const proxy = await startManifestProxy([
    service('dns', '10.96.0.10', [{ name: 'dns', port: 53, targetPort: dns.port, protocol: 'UDP' }], {
      namespace: 'kube-system',
    }),
    slice(
      'dns',
      'dns-1',
      [{ ip: '127.0.0.11' }],
      [{ name: 'dns', port: dns.port, protocol: 'UDP' }],
      'kube-system',
    ),
  ]);
  t.after(() => proxy.close());
  const key = 'kube-system/dns:dns/UDP';
  await waitFor(() => proxy.proxyPort(key) !== undefined, 3000, 'open');
  assert.equal((await udpRequest(proxy.proxyPort(key)!, 'q')).toString(), 'answer:q');
});

test('port range exhaustion is a per-service error, retried until a port frees up', async (t) => {
  const pod = await listenOn('127.0.0.11', 0, 'pod');
  t.after(() => pod.close());
  const base = await freePortRange(2);
  const svc = (name: string, ip: string) => [
    service(name, ip, [{ name: 'http', port: 80, targetPort: pod.port }]),
    slice(name, `${name}-1`, [{ ip: '127.0.0.11' }], [{ name: 'http', port: pod.port }]),
  ];
  const proxy = await startManifestProxy(
    [...svc('a', '10.96.0.1'), ...svc('b', '10.96.0.2'), ...svc('c', '10.96.0.3')],
    {
      proxyPortRange: `${base}-${base + 1}`,
    },
  );
  t.after(() => proxy.close());
  const keys = ['default/a:http/TCP', 'default/b:http/TCP', 'default/c:http/TCP'];
  await waitFor(
    () => keys.filter((k) => proxy.proxyPort(k) !== undefined).length === 2,
    3000,
    'two services to open',
  );
  const failed = keys.find((k) => proxy.proxyPort(k) === undefined)!;
  const err = proxy.server.proxier.failures().get(failed as never);
  assert.equal(err?.code, 'KUP_ERR_PORT_RANGE_EXHAUSTED');
  // The running ones serve.
  for (const k of keys) if (k !== failed) assert.equal(await request(proxy.proxyPort(k)!), 'pod');
  // Remove one of the running services: its port goes to the one that failed.
  const survivor = keys.find((k) => k !== failed && proxy.proxyPort(k) !== undefined)!;
  const removed = keys.find((k) => k !== failed && k !== survivor)!;
  const name = (k: string) => k.split('/')[1]!.split(':')[0]!;
  const ips: Record<string, string> = { a: '10.96.0.1', b: '10.96.0.2', c: '10.96.0.3' };
  await proxy.write([...svc(name(survivor), ips[name(survivor)]!), ...svc(name(failed), ips[name(failed)]!)]);
  await waitFor(() => proxy.proxyPort(failed) !== undefined, 3000, 'the failed service to recover');
  assert.equal(await request(proxy.proxyPort(failed)!), 'pod');
  assert.equal(proxy.proxyPort(removed), undefined);
});

test('a proxy port held by another process is skipped; a fully taken range recovers when the port frees', async (t) => {
  const pod = await listenOn('127.0.0.11', 0, 'pod');
  t.after(() => pod.close());
  const base = await freePortRange(1);
  // Someone else holds the only port of the range.
  const squatter = await listenOn('127.0.0.1', base, 'squatter');
  t.after(() => squatter.close());
  const proxy = await startManifestProxy(
    [
      service('a', '10.96.0.1', [{ name: 'http', port: 80, targetPort: pod.port }]),
      slice('a', 'a-1', [{ ip: '127.0.0.11' }], [{ name: 'http', port: pod.port }]),
    ],
    { proxyPortRange: `${base}`, iptablesSyncPeriodMs: 300 },
  );
  t.after(() => proxy.close());
  const key = 'default/a:http/TCP';
  await waitFor(() => proxy.server.proxier.failures().has(key as never), 3000, 'the bind failure');
  assert.equal(proxy.server.proxier.failures().get(key as never)?.code, 'KUP_ERR_LISTEN');
  assert.ok(proxy.logs.some((l) => l.includes('Proxy port in use by another process')));
  await squatter.close();
  // The periodic sync retries the service port.
  await waitFor(() => proxy.proxyPort(key) === base, 3000, 'recovery after the port was freed');
  assert.equal(await request(base), 'pod');
});

/** A server answering `name` on host:port (port 0 = any). */
async function listenOn(host: string, port: number, name = host): Promise<TestServer & { port: number }> {
  const sockets = new Set<net.Socket>();
  const server = net.createServer((s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
    s.on('error', () => {});
    s.end(name);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen({ host, port }, () => resolve());
  });
  return {
    host,
    port: (server.address() as net.AddressInfo).port,
    connections: 0,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

/** A run of `n` consecutive ports that are free right now (outside the ephemeral range). */
async function freePortRange(n: number): Promise<number> {
  for (let i = 0; i < 50; i++) {
    const base = 20000 + Math.floor(Math.random() * 9000);
    let ok = true;
    for (let p = base; p < base + n && ok; p++) {
      ok = await new Promise<boolean>((resolve) => {
        const s = net.createServer();
        s.once('error', () => resolve(false));
        s.listen({ host: '127.0.0.1', port: p }, () => s.close(() => resolve(true)));
      });
    }
    if (ok) return base;
  }
  throw new Error('no free port range');
}

test('manifest: a file truncated by its writer (0 bytes for a moment) keeps the last good state', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'kup-review-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const file = join(dir, 'services.yaml');
  const good = toYaml([service('web', '10.96.0.1', [{ name: 'http', port: 80, targetPort: 8080 }])]);
  await writeFile(file, good);
  const events: string[] = [];
  const handlers: ProxyHandlers = {
    onServiceAdd: (s) => events.push(`add ${s.metadata?.name}`),
    onServiceUpdate: (_o, s) => events.push(`update ${s.metadata?.name}`),
    onServiceDelete: (s) => events.push(`delete ${s.metadata?.name}`),
    onServicesSynced: () => {},
    onEndpointSliceAdd: () => {},
    onEndpointSliceUpdate: () => {},
    onEndpointSliceDelete: () => {},
    onEndpointSlicesSynced: () => {},
    onNodeUpdate: () => {},
    onNodeDelete: () => {},
  };
  const source = new ManifestSource(file, handlers, log, { debounceMs: 20, pollMs: 50 });
  await source.start();
  t.after(() => source.stop());
  assert.deepEqual(events, ['add web']);
  // `cmd > services.yaml` (and editors that write in place) truncate first and write later.
  await writeFile(file, '');
  await waitFor(() => source.loads + source.failures > 0, 3000, 'the truncated file to be read');
  assert.deepEqual(events, ['add web'], 'an empty file in the middle of a write deletes nothing');
  // The writer finishes: the complete file applies.
  const before = source.loads + source.failures;
  const tmp = join(dir, '.next');
  await writeFile(tmp, good.replace('8080', '8081'));
  await rename(tmp, file);
  await waitFor(() => source.loads + source.failures > before, 3000, 'the complete file');
  assert.deepEqual(events, ['add web', 'update web']);
});

/** A logger whose JSON lines land in `lines`. */
function capturingLogger() {
  const lines: string[] = [];
  const destination = new Writable({
    write(chunk, _enc, cb) {
      lines.push(chunk.toString());
      cb();
    },
  });
  return { log: createLogger({ level: 'debug', destination }), lines };
}

test('a bind failure is logged by the proxier once, not by the listener on every retry', async (t) => {
  const { log: capture, lines } = capturingLogger();
  const held = net.createServer();
  await new Promise<void>((r) => held.listen({ host: '127.0.0.1', port: 0 }, () => r()));
  t.after(() => new Promise((r) => held.close(r)));
  const port = (held.address() as net.AddressInfo).port;
  const heldUdp = dgram.createSocket('udp4');
  await new Promise<void>((r) => heldUdp.bind(0, '127.0.0.1', r));
  t.after(() => heldUdp.close());
  const tcp = new TcpListener(makeContext([]), DEFAULT_TCP_OPTIONS, { log: capture });
  await assert.rejects(tcp.listen('127.0.0.1', port), /EADDRINUSE/);
  tcp.destroy();
  const udp = new UdpListener(makeContext([], 'UDP'), DEFAULT_UDP_OPTIONS, { log: capture }, 'udp4');
  await assert.rejects(udp.listen('127.0.0.1', heldUdp.address().port), /EADDRINUSE/);
  udp.destroy();
  assert.deepEqual(lines, [], 'the caller reports a failed listen(), the listener does not');

  // Through the proxier: the only port of the range is held; syncs retry it without repeating themselves.
  const proxy = await startManifestProxy(
    [
      service('a', '10.96.0.1', [{ name: 'http', port: 80, targetPort: 9 }]),
      slice('a', 'a-1', [{ ip: '127.0.0.11' }], [{ name: 'http', port: 9 }]),
    ],
    { proxyPortRange: `${port}`, iptablesSyncPeriodMs: 50 },
  );
  t.after(() => proxy.close());
  const count = (what: string) => proxy.logs.filter((l) => l.includes(what)).length;
  await waitFor(() => count('"msg":"Synced"') >= 5, 3000, 'five syncs');
  assert.equal(count('Failed to open service port'), 1);
  assert.equal(count('Proxy port in use by another process'), 1);
  assert.equal(count('Listener error'), 0);
});
