// Huge inputs do not hold the event loop: a 20,000-object manifest (10,000 Services with their
// EndpointSlices) is parsed, validated, applied, checked out and opened as 10,000 listeners in slices, a
// 12 MB YAML List and a 20 MB JSON List are read, hashed, parsed and applied in slices,
// while a timer measures the longest stall (perf_hooks.monitorEventLoopDelay, and the longest gap between
// ticks of a 5 ms interval). Unsliced, the same load held the loop for seconds.
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import { test } from 'node:test';
import { dump } from 'js-yaml';
import { stringify } from 'yaml';
import { createLogger } from '../../src/lib/log.ts';
import type { ProxyHandlers } from '../../src/source/handlers.ts';
import { ManifestSource } from '../../src/source/manifest.ts';
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

/**
 * Runs `fn` while measuring the event loop; returns its result, the longest stall in ms (wall clock), and
 * the longest busy stall: a gap between ticks counted only as far as this process used the CPU in it, so
 * that being descheduled on a loaded machine (seen: 100-300 ms with a load of 7 on 2 cores) does not count,
 * while work that holds the loop (and a garbage collection, which uses the CPU too) does.
 */
async function measured<T>(
  fn: () => Promise<T>,
): Promise<{ value: T; maxStallMs: number; maxBusyMs: number; ms: number }> {
  const h = monitorEventLoopDelay({ resolution: 5 });
  let last = performance.now();
  let lastCpu = process.cpuUsage();
  let maxGap = 0;
  let maxBusy = 0;
  const tick = setInterval(() => {
    const now = performance.now();
    const cpu = process.cpuUsage(lastCpu);
    maxGap = Math.max(maxGap, now - last);
    maxBusy = Math.max(maxBusy, Math.min(now - last, (cpu.user + cpu.system) / 1000));
    last = now;
    lastCpu = process.cpuUsage();
  }, 5);
  h.enable();
  const started = performance.now();
  try {
    const value = await fn();
    return {
      value,
      maxStallMs: Math.round(Math.max(maxGap, h.max / 1e6)),
      maxBusyMs: Math.round(maxBusy),
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

/** Service `i` (two ports) and its EndpointSlice of 8 endpoints: ~1.3 KB in JSON. */
function bigPair(i: number): [object, object] {
  const ip = `10.${96 + (i >> 16)}.${(i >> 8) & 255}.${i & 255}`;
  const ports = [
    { name: 'http', port: 80, targetPort: 8080 },
    { name: 'https', port: 443, targetPort: 8443 },
  ];
  const endpoints = Array.from({ length: 8 }, (_, k) => ({ ip: `10.${k + 1}.${(i >> 8) & 255}.${i & 255}` }));
  return [
    service(`svc-${i}`, ip, ports),
    slice(`svc-${i}`, `svc-${i}-abc`, endpoints, [
      { name: 'http', port: 8080 },
      { name: 'https', port: 8443 },
    ]),
  ];
}

const noop = () => {};
const NO_HANDLERS: ProxyHandlers = {
  onServiceAdd: noop,
  onServiceUpdate: noop,
  onServiceDelete: noop,
  onServicesSynced: noop,
  onEndpointSliceAdd: noop,
  onEndpointSliceUpdate: noop,
  onEndpointSliceDelete: noop,
  onEndpointSlicesSynced: noop,
  onNodeUpdate: noop,
  onNodeDelete: noop,
};

// Before: JSON.parse of the whole text (~0.5 s for 50 MB) and js-yaml on one huge `kind: List` document
// (~6 s for 70 MB) each ran in one piece, as did the hash and the decoding of the file. The bound is
// generous (slices are ~10 ms; a garbage collection of the new objects takes tens of ms on a loaded machine).
test('a 12 MB kubectl-style YAML List and a 20 MB JSON List load without stalling the event loop', {
  timeout: 180_000,
}, async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'kup-big-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  // Written a pair at a time, so that this process holds no big object graph while it measures (a
  // garbage collection's pause grows with what is alive).
  const pairs = (n: number, one: (i: number) => string) =>
    Array.from({ length: n }, (_, i) => one(i)).join('');
  const cases = [
    {
      name: 'YAML List (kubectl get -o yaml)',
      file: join(dir, 'list.yaml'),
      objects: 2 * 6_500,
      text: () =>
        `apiVersion: v1\nitems:\n${pairs(6_500, (i) => dump(bigPair(i), { seqNoIndent: true }))}kind: List\nmetadata:\n  resourceVersion: ""\n`,
    },
    {
      name: 'JSON List',
      file: join(dir, 'list.json'),
      objects: 2 * 15_000,
      text: () =>
        `{"apiVersion":"v1","kind":"List","items":[${pairs(15_000, (i) => `${i === 0 ? '' : ','}${JSON.stringify(bigPair(i)).slice(1, -1)}`)}]}`,
    },
  ];
  for (const c of cases) {
    const text = c.text();
    await writeFile(c.file, text);
    const source = new ManifestSource(c.file, NO_HANDLERS, createLogger({ level: 'silent' }));
    t.after(() => source.stop());
    const load = await measured(() => source.start());
    assert.equal(source.objects.size, c.objects);
    // A reload with one object changed: the text is read, hashed and cut again; one part is parsed.
    await writeFile(c.file, text.replace('svc-7-abc', 'svc-7-xyz'));
    const reload = await measured(() => source.reload());
    assert.ok(source.objects.has('EndpointSlice/default/svc-7-xyz'), 'reloaded');
    t.diagnostic(
      `${c.name}, ${(text.length / 2 ** 20).toFixed(1)} MiB, ${c.objects} objects: ` +
        `loaded in ${load.ms} ms, longest stall ${load.maxBusyMs} ms busy (${load.maxStallMs} ms wall); ` +
        `reloaded in ${reload.ms} ms, longest stall ${reload.maxBusyMs} ms busy (${reload.maxStallMs} ms wall)`,
    );
    assert.ok(load.maxBusyMs < 200, `${c.name}: load held the event loop ${load.maxBusyMs} ms`);
    assert.ok(reload.maxBusyMs < 200, `${c.name}: reload held the event loop ${reload.maxBusyMs} ms`);
    await source.stop();
  }
});
