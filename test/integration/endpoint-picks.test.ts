// kup_service_endpoint_picks_total kept a series for every endpoint that ever existed: with pods that
// come and go (a rollout every hour, a scale-out and back), /metrics grew without bound. The picks of an
// endpoint that left are now dropped when the endpoint set changes.
import assert from 'node:assert/strict';
import net from 'node:net';
import { test } from 'node:test';
import { service, slice, startManifestProxy } from '../helpers/manifests.ts';
import { request, waitFor } from '../helpers/servers.ts';

/** Pods on 127.0.0.31-40 sharing one port, each answering its own address. */
async function pods(t: { after(fn: () => unknown): void }, n: number): Promise<number> {
  const servers: net.Server[] = [];
  let port = 0;
  for (let i = 0; i < n; i++) {
    const host = `127.0.0.${31 + i}`;
    const s = net.createServer((c) => c.end(host));
    await new Promise<void>((r) => s.listen(port, host, r));
    port = (s.address() as net.AddressInfo).port;
    servers.push(s);
  }
  t.after(() => Promise.all(servers.map((s) => new Promise((r) => s.close(r)))));
  return port;
}

function pickSeries(metrics: string): string[] {
  return metrics
    .split('\n')
    .filter((l) => l.startsWith('kup_service_endpoint_picks_total{'))
    .map((l) => /endpoint="([^"]+)"/.exec(l)![1]!)
    .sort();
}

test('endpoint picks: the series of endpoints that left are dropped, those that stay keep counting', async (t) => {
  const port = await pods(t, 10);
  const ips = Array.from({ length: 10 }, (_, i) => `127.0.0.${31 + i}`);
  const svc = service('web', '10.96.0.3', [{ name: 'http', port: 80, targetPort: port }]);
  const generation = (list: string[]) => [
    svc,
    slice(
      'web',
      'web-1',
      list.map((ip) => ({ ip })),
      [{ name: 'http', port }],
    ),
  ];
  const proxy = await startManifestProxy(generation(ips.slice(0, 3)));
  t.after(() => proxy.close());
  const key = 'default/web:http/TCP';
  await waitFor(() => proxy.proxyPort(key) !== undefined);
  const webPort = proxy.proxyPort(key)!;
  const metrics = proxy.server.metrics;

  // A rollout in three steps: each generation of pods replaces the last, and takes traffic.
  for (const gen of [ips.slice(0, 3), ips.slice(3, 6), ips.slice(6, 10)]) {
    await proxy.write(generation(gen));
    await waitFor(
      () => proxy.server.proxier.get(key as never)!.endpoints.every((e) => gen.includes(e.ip)),
      5000,
      'the new generation',
    );
    for (let i = 0; i < gen.length * 2; i++) assert.ok(gen.includes(await request(webPort)));
  }
  const last = ips.slice(6, 10).map((ip) => `${ip}:${port}`);
  assert.deepEqual(pickSeries(await metrics.text()), last.sort(), 'only the current pods have a series');
  const picks = proxy.server.proxier.get(key as never)!.context.stats.picks;
  assert.equal(
    [...picks.values()].reduce((a, b) => a + b, 0),
    8,
    'their counts are kept',
  );
});
