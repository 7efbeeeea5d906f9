// Forwarding loops: a Service whose endpoint is the proxy itself. Without a guard one TCP connection
// became ~10,000 in 2 s (descriptors gone for every service) and one UDP datagram circulated forever.
// The whole proxy leaves such endpoints out (one warning, a metric); and where a loop is not visible in
// the endpoints (someone else's NAT rule), the relays let traffic pass through them MAX_PASSES times.
import assert from 'node:assert/strict';
import dgram from 'node:dgram';
import net from 'node:net';
import { test } from 'node:test';
import { setTimeout as delay } from 'node:timers/promises';
import { MAX_PASSES } from '../../src/relay/own-traffic.ts';
import { DEFAULT_TCP_OPTIONS, TcpListener } from '../../src/relay/tcp.ts';
import { DEFAULT_UDP_OPTIONS, UdpListener } from '../../src/relay/udp.ts';
import { ep } from '../helpers/endpoints.ts';
import { service, slice, startManifestProxy } from '../helpers/manifests.ts';
import { log, makeContext } from '../helpers/relay.ts';
import { identityServer, request, udpRequest, udpServer, waitFor } from '../helpers/servers.ts';

type After = { after(fn: () => unknown): void };

/** A service port that keeps working beside the loop: its listener answers with the endpoint's name. */
async function bystander(t: After): Promise<number> {
  const pod = await identityServer('127.0.0.21');
  t.after(() => pod.close());
  const listener = new TcpListener(makeContext([ep(pod.host, pod.port)]), DEFAULT_TCP_OPTIONS, { log });
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.destroy());
  return listener.port;
}

test('TCP loop the endpoints do not show: one connection passes at most MAX_PASSES times, then it all closes', async (t) => {
  const context = makeContext([]);
  // The cap only bounds the test when the pass bound is missing (the loop then fills it).
  const listener = new TcpListener(context, { ...DEFAULT_TCP_OPTIONS, maxConnections: 1000 }, { log });
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.destroy());
  const other = await bystander(t);
  // Hostile: the service port's endpoint is its own listener (as a NAT rule of someone else's would do).
  context.balancer.setEndpoints([ep('127.0.0.1', listener.port)]);

  const client = net.connect({ host: '127.0.0.1', port: listener.port });
  t.after(() => client.destroy());
  const closed = new Promise<void>((resolve) => {
    client.on('error', () => {});
    client.on('close', () => resolve());
  });
  client.write('GET / HTTP/1.1\r\n\r\n');
  await Promise.race([closed, delay(3000).then(() => assert.fail('the client was never closed'))]);
  await waitFor(() => context.stats.active === 0, 3000, 'every pass to close');
  // A literal bound, not MAX_PASSES: without the pass count the loop filled the cap (1000) in ~1 s.
  assert.ok(context.stats.accepted <= 4, `${context.stats.accepted} connections from one`);
  assert.ok(context.stats.accepted <= MAX_PASSES);
  // The last pass sees a reset while connecting, and retries: one refusal per connect attempt at most.
  const refused = context.stats.rejected.loop ?? 0;
  assert.ok(refused >= 1 && refused <= DEFAULT_TCP_OPTIONS.connectTimeoutsMs.length, `${refused} refused`);
  assert.equal(listener.ownTraffic.tcpSize, 0, 'no registration left behind');
  assert.equal(await request(other), '127.0.0.21', 'the other service keeps serving');
});

test('UDP loop the endpoints do not show: one datagram passes at most MAX_PASSES times, then it is dropped', async (t) => {
  const context = makeContext([], 'UDP');
  const listener = new UdpListener(context, DEFAULT_UDP_OPTIONS, { log }, 'udp4');
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.close());
  context.balancer.setEndpoints([ep('127.0.0.1', listener.port)]);
  const dns = await udpServer('127.0.0.22');
  t.after(() => dns.close());
  const otherContext = makeContext([ep(dns.host, dns.port)], 'UDP', 'default/dns:dns');
  const other = new UdpListener(otherContext, DEFAULT_UDP_OPTIONS, { log }, 'udp4');
  await other.listen('127.0.0.1', 0);
  t.after(() => other.close());

  const client = dgram.createSocket('udp4');
  t.after(() => client.close());
  await new Promise<void>((r) => client.bind(0, '127.0.0.1', r));
  client.send('one datagram', listener.port, '127.0.0.1');
  await waitFor(() => context.stats.rejected.loop === 1, 2000, 'the datagram to be dropped');
  const sessions = context.stats.accepted;
  assert.ok(sessions <= 5 && sessions <= MAX_PASSES + 1, `${sessions} sessions from one datagram`);
  // It circulates no more: no new session for a while.
  await delay(300);
  assert.equal(context.stats.accepted, sessions);
  assert.equal(context.stats.rejected.loop, 1);
  await waitFor(() => listener.sessions.size === 0, 3000, 'the sessions to expire');
  assert.equal(listener.ownTraffic.udpSize, 0, 'no registration left behind');
  assert.equal(String(await udpRequest(other.port, 'q')), 'q', 'the other service keeps serving');
});

test('the whole proxy: endpoints at its own proxy ports are left out with one warning and a metric', async (t) => {
  const pod = await identityServer('127.0.0.11');
  t.after(() => pod.close());
  const ports = [
    { name: 'http', port: 80, targetPort: 8080 },
    { name: 'dns', port: 53, targetPort: 5353, protocol: 'UDP' as const },
  ];
  const web = [
    service('web', '10.96.0.2', [{ name: 'http', port: 80, targetPort: pod.port }]),
    slice('web', 'web-1', [{ ip: pod.host }], [{ name: 'http', port: pod.port }]),
  ];
  const proxy = await startManifestProxy([service('loop', '10.96.0.1', ports), ...web]);
  t.after(() => proxy.close());
  const tcpKey = 'default/loop:http/TCP';
  const udpKey = 'default/loop:dns/UDP';
  await waitFor(() => proxy.proxyPort(tcpKey) !== undefined && proxy.proxyPort(udpKey) !== undefined);
  const tcpPort = proxy.proxyPort(tcpKey)!;
  const udpPort = proxy.proxyPort(udpKey)!;
  const webPort = proxy.proxyPort('default/web:http/TCP')!;

  // Hostile: the Service's endpoints are the proxy's own ports, and it keeps being applied (three writes).
  for (const i of [1, 2, 3]) {
    await proxy.write([
      service('loop', '10.96.0.1', ports),
      slice(
        'loop',
        'loop-1',
        [{ ip: '127.0.0.1' }],
        [
          { name: 'http', port: tcpPort },
          { name: 'dns', port: udpPort, protocol: 'UDP' },
        ],
      ),
      slice('loop', `loop-${i + 1}`, [{ ip: '127.0.0.1' }], [{ name: 'http', port: tcpPort }]),
      ...web,
    ]);
  }
  const server = proxy.server;
  await waitFor(
    () =>
      server.proxier.get(tcpKey as never)?.loopEndpoints.length === 1 &&
      server.proxier.get(udpKey as never)?.loopEndpoints.length === 1,
    5000,
    'the loop endpoints to be seen',
  );
  const tcp = server.proxier.get(tcpKey as never)!;
  assert.deepEqual(tcp.loopEndpoints, [`127.0.0.1:${tcpPort}`]);
  assert.deepEqual(tcp.endpoints, [], 'nothing left to pick');

  // One connection is one connection: reset at once for lack of endpoints.
  await assert.rejects(request(tcpPort, { send: 'GET / HTTP/1.1\r\n\r\n' }), { code: 'ECONNRESET' });
  await assert.rejects(udpRequest(udpPort, 'q', { timeoutMs: 300 }), /timed out/);
  await delay(200);
  assert.equal(tcp.context.stats.accepted, 1);
  assert.equal(server.proxier.get(udpKey as never)!.context.stats.accepted, 0, 'no UDP session');

  const warnings = proxy.logs
    .map((l) => JSON.parse(l) as Record<string, unknown>)
    .filter((l) => l.msg === 'Endpoint leads back to this proxy (a forwarding loop), left out');
  assert.deepEqual(
    warnings.map((w) => `${w.service} ${w.endpoint} ${w.reason}`).sort(),
    [`${tcpKey} 127.0.0.1:${tcpPort} proxy-port`, `${udpKey} 127.0.0.1:${udpPort} proxy-port`].sort(),
    'one warning per endpoint',
  );
  const metrics = await server.metrics.text();
  assert.match(metrics, /kup_forwarding_loop_endpoints\{service="default\/loop:http",protocol="TCP"\} 1/);
  assert.match(metrics, /kup_forwarding_loop_endpoints\{service="default\/loop:dns",protocol="UDP"\} 1/);
  const debug = (await (
    await fetch(`http://127.0.0.1:${server.metricsServer!.port}/debug/services`)
  ).json()) as { service: string; protocol: string; loopEndpoints?: string[] }[];
  const loopTcp = debug.find((d) => d.service === 'default/loop:http' && d.protocol === 'TCP');
  assert.deepEqual(
    loopTcp?.loopEndpoints,
    [`127.0.0.1:${tcpPort}`],
    '/debug/services shows what it left out',
  );
  assert.equal(debug.find((d) => d.service === 'default/web:http')?.loopEndpoints, undefined);
  assert.equal(await request(webPort), '127.0.0.11', 'the other service keeps serving');
});
