// Regressions found in a review of the data path and the proxier: each test failed before its fix.
// Real loopback sockets; 127.255.255.255 is lo's broadcast address, which a UDP connect() refuses (EACCES).
import assert from 'node:assert/strict';
import dgram from 'node:dgram';
import { mkdtemp, rename, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { test } from 'node:test';
import { createLogger } from '../../src/lib/log.ts';
import type { ConnectionInfo } from '../../src/relay/observer.ts';
import { DEFAULT_TCP_OPTIONS, TcpListener } from '../../src/relay/tcp.ts';
import { DEFAULT_UDP_OPTIONS, UdpListener } from '../../src/relay/udp.ts';
import type { ProxyHandlers } from '../../src/source/handlers.ts';
import { ManifestSource } from '../../src/source/manifest.ts';
import { ep } from '../helpers/endpoints.ts';
import { service, slice, startManifestProxy, toYaml } from '../helpers/manifests.ts';
import { log, makeContext } from '../helpers/relay.ts';
import { tcpServer, udpServer, waitFor } from '../helpers/servers.ts';

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

test('UDP: an upstream connect() that fails drops the session instead of crashing the process', async (t) => {
  const good = await udpServer('127.0.0.12', () => Buffer.from('good'));
  t.after(() => good.close());
  const context = makeContext([ep('127.255.255.255', 9)], 'UDP', 'default/dns:dns');
  const listener = new UdpListener(context, { ...DEFAULT_UDP_OPTIONS, idleTimeoutMs: 5000 }, { log }, 'udp4');
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.close());
  const socket = dgram.createSocket('udp4');
  t.after(() => socket.close());
  let got = '';
  socket.on('message', (m) => {
    got = m.toString();
  });
  await new Promise<void>((r) => socket.bind(0, '127.0.0.21', r));
  socket.send('q', listener.port, '127.0.0.1');
  await waitFor(() => context.stats.connectFailures['error'] === 1, 2000, 'the failed connect');
  await waitFor(() => listener.sessions.size === 0, 2000, 'the session to be dropped');
  assert.equal(context.stats.active, 0);
  // The process is still here and the listener still serves.
  context.balancer.setEndpoints([ep(good.host, good.port)]);
  socket.send('q', listener.port, '127.0.0.1');
  await waitFor(() => got === 'good', 2000, 'a reply through a working endpoint');
});

test('TCP: a half-close timeout is reported as such when an idle timeout is also set', async (t) => {
  // The endpoint reads but never answers nor closes: the client's FIN leaves the connection half-closed.
  const server = await tcpServer('127.0.0.11', (s) => s.resume(), { allowHalfOpen: true });
  t.after(() => server.close());
  const context = makeContext([ep(server.host, server.port)]);
  const closed: ConnectionInfo[] = [];
  context.observer = { opened() {}, closed: (c) => closed.push(c), wantsData: false };
  const listener = new TcpListener(
    context,
    { ...DEFAULT_TCP_OPTIONS, idleTimeoutMs: 10_000, halfCloseTimeoutMs: 200 },
    { log },
  );
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.destroy());
  const client = net.connect({ host: '127.0.0.1', port: listener.port, allowHalfOpen: true });
  client.on('error', () => {});
  t.after(() => client.destroy());
  await waitFor(() => context.stats.active === 1 && context.stats.picks.size === 1, 2000, 'the connection');
  await waitFor(() => [...listener.connections][0]?.state === 1, 2000, 'the upstream connect');
  client.end('request');
  await waitFor(() => closed.length === 1, 3000, 'the half-close timeout');
  assert.equal(closed[0]!.closeReason, 'half-close-timeout');
  assert.equal(context.stats.active, 0);
});

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

test('healthz: a change queued while a sync runs is not marked applied by that sync', async (t) => {
  // Health timeout = 2 x sync period = 400 ms.
  const proxy = await startManifestProxy(
    [service('a', '10.96.0.1', [{ name: 'http', port: 80, targetPort: 9 }])],
    { iptablesSyncPeriodMs: 200 },
  );
  t.after(() => proxy.close());
  const server = proxy.server;
  await waitFor(() => server.health.lastUpdatedMs > 0, 3000, 'the first sync');
  // The next sync is held after its checkout; every sync after it fails (say iptables-restore breaks).
  const proxier = server.proxier;
  const original = proxier.sync.bind(proxier);
  let calls = 0;
  let holding = false;
  let release: () => void = () => {};
  const held = new Promise<void>((r) => {
    release = r;
  });
  proxier.sync = async () => {
    if (++calls > 1) throw new Error('sync keeps failing');
    const result = original();
    holding = true;
    await held;
    return result;
  };
  await waitFor(() => holding, 3000, 'a sync to start');
  const loads = server.manifest!.loads;
  await proxy.write([
    service('a', '10.96.0.1', [{ name: 'http', port: 80, targetPort: 9 }]),
    service('b', '10.96.0.2', [{ name: 'http', port: 80, targetPort: 9 }]),
  ]);
  await waitFor(() => server.manifest!.loads > loads, 3000, 'the change to be queued');
  release();
  await waitFor(() => calls >= 2, 3000, 'the failing sync');
  // Service b was never applied: /healthz must turn stale within the timeout.
  await waitFor(() => server.health.status(Date.now()).reason === 'stale', 3000, 'healthz to turn stale');
  assert.equal(proxier.get('default/b:http/TCP' as never), undefined);
});
