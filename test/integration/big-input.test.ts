// Huge inputs do not hold the event loop: a 20,000-object manifest (10,000 Services with their
// EndpointSlices) is parsed, validated, applied, checked out and opened as 10,000 listeners in slices,
// while a timer measures the longest stall (perf_hooks.monitorEventLoopDelay, and the longest gap between
// ticks of a 5 ms interval). Unsliced, the same load held the loop for seconds.
import assert from 'node:assert/strict';
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import { test } from 'node:test';
import { stringify } from 'yaml';
import { parseManifest, parseManifestAsync } from '../../src/source/manifest-parse.ts';
import { service, slice, startManifestProxy } from '../helpers/manifests.ts';
import { waitFor } from '../helpers/servers.ts';

function objects(n: number): object[] {
  const out: object[] = [];
  for (let i = 0; i < n; i++) {
    const ip = `10.${96 + (i >> 16)}.${(i >> 8) & 255}.${i & 255}`;
    out.push(service(`svc-${i}`, ip, [{ name: 'http', port: 80, targetPort: 8080 }]));
    out.push(
      slice(
        `svc-${i}`,
        `svc-${i}-abc`,
        [{ ip: `10.244.${(i >> 8) & 255}.${i & 255}` }],
        [{ name: 'http', port: 8080 }],
      ),
    );
  }
  return out;
}

/** Runs `fn` while measuring the event loop; returns its result and the longest stall in ms. */
async function measured<T>(fn: () => Promise<T>): Promise<{ value: T; maxStallMs: number; ms: number }> {
  const h = monitorEventLoopDelay({ resolution: 5 });
  let last = performance.now();
  let maxGap = 0;
  const tick = setInterval(() => {
    const now = performance.now();
    maxGap = Math.max(maxGap, now - last);
    last = now;
  }, 5);
  h.enable();
  const started = performance.now();
  try {
    const value = await fn();
    return {
      value,
      maxStallMs: Math.round(Math.max(maxGap, h.max / 1e6)),
      ms: Math.round(performance.now() - started),
    };
  } finally {
    h.disable();
    clearInterval(tick);
  }
}

test('a 20,000-object manifest: 10,000 service ports open without a long stall of the event loop', {
  timeout: 120_000,
}, async (t) => {
  const N = 10_000;
  const text = JSON.stringify({ apiVersion: 'v1', kind: 'List', items: objects(N) });
  let proxy: Awaited<ReturnType<typeof startManifestProxy>> | undefined;
  t.after(() => proxy?.close());
  const { maxStallMs, ms } = await measured(async () => {
    // An explicit range: kernel-chosen ports slow every bind down as they fill the ephemeral range.
    proxy = await startManifestProxy(text as never, { proxyPortRange: '20000-39999' });
    const p = proxy;
    await waitFor(() => p.server.proxier.status().length === N, 100_000, 'every service port');
  });
  t.diagnostic(
    `20,000 objects (JSON, ${(text.length / 2 ** 20).toFixed(1)} MiB) to 10,000 open service ports in ${ms} ms; longest event-loop stall ${maxStallMs} ms`,
  );
  assert.ok(maxStallMs < 400, `stall ${maxStallMs} ms`);
});

test('YAML manifests are parsed a document at a time; the result is the same as the synchronous parse', async (t) => {
  const objs = objects(1000);
  const text = objs.map((o) => stringify(o)).join('---\n');
  const sync = (() => {
    const started = performance.now();
    parseManifest(text);
    return Math.round(performance.now() - started);
  })();
  const { value, maxStallMs } = await measured(() => parseManifestAsync(text));
  t.diagnostic(
    `2,000 YAML documents: ${sync} ms in one piece synchronously; sliced, the longest stall was ${maxStallMs} ms`,
  );
  assert.deepEqual([...value.keys()], [...parseManifest(text).keys()]);
  assert.equal(value.size, 2000);
  assert.ok(maxStallMs < Math.max(100, sync / 2), `stall ${maxStallMs} ms`);
  // JSON takes the fast path, with the same objects.
  const json = await parseManifestAsync(JSON.stringify({ kind: 'List', items: objs }));
  assert.deepEqual([...json.keys()], [...value.keys()]);
  assert.equal(json.get('Service/default/svc-7')?.json, value.get('Service/default/svc-7')?.json);
});

test('a bad JSON manifest is reported with YAML locations', async () => {
  const text = JSON.stringify(
    {
      kind: 'List',
      items: [{ kind: 'Service', metadata: { name: 'x' }, spec: { ports: [{ port: 'eighty' }] } }],
    },
    null,
    1,
  );
  await assert.rejects(parseManifestAsync(text, 'm.json'), /m\.json:\d+:\d+: must be an integer/);
});
