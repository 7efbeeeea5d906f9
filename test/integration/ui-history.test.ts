// The console's rate history lives only while someone looks: samples are taken when the console asks, and
// a while after it last asked, the history (and every port's ring) is let go.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { startHttpServer } from '../../src/server/http.ts';
import type { UiOverview } from '../../src/server/ui-overview.ts';
import { uiRoutes } from '../../src/server/ui-routes.ts';
import { service, slice, startManifestProxy } from '../helpers/manifests.ts';

test('the rate history is sampled when asked and let go when nobody asks', async (t) => {
  const proxy = await startManifestProxy([
    service('web', '10.96.0.1', [{ name: 'http', port: 80, targetPort: 9 }]),
    slice('web', 'web-1', [{ ip: '127.0.0.1' }], [{ name: 'http', port: 9 }]),
  ]);
  t.after(() => proxy.close());
  // The console's clock decides when a sample is due; the release is a real timer.
  let clock = 1_000_000;
  const server = await startHttpServer(
    '127.0.0.1:0',
    uiRoutes(proxy.server, { history: { intervalMs: 1000 }, now: () => clock, releaseAfterMs: 300 }),
  );
  t.after(() => server.close());
  const overview = async () =>
    (await (await fetch(`http://127.0.0.1:${server.port}/ui/api/overview`)).json()) as UiOverview;
  assert.equal((await overview()).times.length, 1);
  // Asked again within the interval: no second sample.
  clock += 500;
  assert.equal((await overview()).times.length, 1);
  clock += 500;
  assert.equal((await overview()).times.length, 2);
  clock += 1000;
  const watched = await overview();
  assert.equal(watched.times.length, 3);
  assert.deepEqual(watched.rates[0], [null, 0, 0]);
  // Nobody asks for longer than releaseAfterMs: the next look starts a new history (without the release,
  // a fourth sample with rates).
  await new Promise((r) => setTimeout(r, 600));
  clock += 1000;
  const fresh = await overview();
  assert.equal(fresh.times.length, 1);
  assert.deepEqual(fresh.rates[0], [null]);
});
