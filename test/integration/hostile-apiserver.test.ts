// The Kubernetes source against a hostile or broken API server (the stand-in's hostile modes): endless
// continue tokens, a list body that never ends, one huge or dense page, a watch line that never ends, a
// watch of endless new objects, a 410 storm, a flood of unknown event types, HTML pages and TLS mismatches. Each must cost bounded memory and time, be logged
// once per retry (or rate-limited) with the URL, leave what was listed in place, and recover when the
// server does. The last tests run the whole proxy (the stand-in in its own process) and relay traffic
// through each watch mode, measuring request latency and event-loop delay.
import assert from 'node:assert/strict';
import net from 'node:net';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { Writable } from 'node:stream';
import { type TestContext, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import tls from 'node:tls';
import { KubeConfig } from '@kubernetes/client-node';
import type { Config } from '../../src/config/config.ts';
import { DEFAULT_CONFIG } from '../../src/config/config.ts';
import { createLogger } from '../../src/lib/log.ts';
import { ProxyServer } from '../../src/proxy-server.ts';
import { DEFAULT_LIMITS, type Limits } from '../../src/source/api-limits.ts';
import { kubeConfigCredentials } from '../../src/source/kubeconfig-credentials.ts';
import { KubernetesSource } from '../../src/source/kubernetes.ts';
import { makeEndpointSlice, makeService, startFakeApiServer } from '../helpers/fake-apiserver.ts';
import { startFakeApiServerProcess } from '../helpers/fake-apiserver-process.ts';
import { request, waitFor } from '../helpers/servers.ts';
import {
  converged,
  type LogLine,
  listsOf,
  NODE,
  RecordingHandlers,
  recordingLogger,
  seedBasic,
  setup,
  synced,
} from '../helpers/source-harness.ts';

const SERVICES = '/api/v1/services';
const MiB = 1024 * 1024;
/** Small bounds so that each is reached in well under a second on loopback. */
const LIMITS: Limits = {
  ...DEFAULT_LIMITS,
  maxLineBytes: 1 * MiB,
  maxListBytes: 4 * MiB,
  maxListItems: 10_000,
  maxListPages: 50,
};
const BACKOFF = { initialMs: 50, maxMs: 400, resetMs: 1500 };
/** What a hostile answer may have in flight beyond a bound: loopback socket buffers autotune to MiBs. */
const SLACK = 6 * MiB;

const failedFor = (kind: string) => (l: LogLine) => l.msg === 'Watch failed, retrying' && l.kind === kind;
const errOf = (l: LogLine) => l.err as { code?: string; message: string; statusCode?: number };

/** The source on a seeded stand-in, synced, with the Services watch open; hostile knobs in `limits`. */
async function hostileSetup(t: TestContext, limits: Partial<Limits> = LIMITS) {
  const env = await setup(t, { seed: seedBasic, source: { backoff: BACKOFF, limits } });
  await synced(env.h);
  await converged(env.h, env.server);
  await env.server.waitForRequest((r) => r.verb === 'watch' && r.path === SERVICES);
  // An event in every watch: one that ends without any within a second counts as a failure.
  env.server.sendBookmark();
  return env;
}

/** What was listed before stays: no delete reached the handlers, and the Services are all there. */
function nothingLost(h: RecordingHandlers, from: number): void {
  const deletes = h.events.slice(from).filter((s) => s.op === 'delete');
  assert.deepEqual(deletes, [], 'no delete while the server misbehaves');
  assert.deepEqual([...h.objects.Service.keys()].sort(), ['default/web', 'kube-system/kube-dns']);
}

/** Max event-loop delay (ms) while `fn` runs. */
async function loopDelayDuring(fn: () => Promise<void>): Promise<number> {
  const histogram = monitorEventLoopDelay({ resolution: 10 });
  histogram.enable();
  try {
    await fn();
  } finally {
    histogram.disable();
  }
  return histogram.max / 1e6;
}

/** The most the heap and buffers grew (MiB, sampled every 20 ms) while `fn` runs. */
async function memoryGrowthDuring(fn: () => Promise<void>): Promise<number> {
  const used = () => {
    const m = process.memoryUsage();
    return m.heapUsed + m.arrayBuffers;
  };
  const base = used();
  let peak = base;
  const sampler = setInterval(() => {
    peak = Math.max(peak, used());
  }, 20);
  try {
    await fn();
  } finally {
    clearInterval(sampler);
  }
  return (Math.max(peak, used()) - base) / MiB;
}

for (const c of [
  {
    name: 'objects',
    limits: { ...LIMITS, maxListPages: 1000 },
    want: /more than 10000 objects \(maxListItems\)/,
  },
  {
    name: 'pages',
    limits: { ...LIMITS, maxListItems: 1_000_000 },
    want: /more than 50 pages \(maxListPages\)/,
  },
]) {
  test(`endless continue tokens: the list stops at its bound (${c.name}), one warning per retry with the URL`, async (t) => {
    const { server, h, log } = await hostileSetup(t, c.limits);
    const from = h.events.length;
    const mark = server.requests.length;
    const grownMiB = await memoryGrowthDuring(async () => {
      // Every page of Services is full (500) and carries a new continue token, forever. A 410 makes
      // the source relist; the slices and the Node relist normally.
      server.hostile('endless-continue', { path: SERVICES });
      server.expireHistory();
      server.closeWatches();
      const failed = await log.waitFor((l) => failedFor('Service')(l) && l.during === 'list', 10_000);
      assert.equal(errOf(failed).code, 'KUP_ERR_API_RESPONSE');
      assert.match(errOf(failed).message, new RegExp(`^GET ${server.url}${SERVICES}: `));
      assert.match(errOf(failed).message, c.want);
      // It keeps failing, with backoff; each attempt stops at the bound.
      await sleep(1000);
    });
    const failures = log.lines.filter(failedFor('Service')).length;
    const pages = listsOf(server, SERVICES, mark).length;
    t.diagnostic(`${failures} failures, ${pages} pages, memory grew ${grownMiB.toFixed(0)} MiB at most`);
    assert.ok(failures >= 2 && failures <= 8, `${failures} failures in ~1 s`);
    assert.ok(pages <= (failures + 1) * 51, `${pages} pages for ${failures} failures`);
    // Before: 1.35 GB in 30 s, nothing logged.
    assert.ok(grownMiB < 120, `memory grew ${grownMiB.toFixed(0)} MiB`);
    nothingLost(h, from);

    server.hostile(null);
    server.create(makeService('default', 'after'));
    await converged(h, server);
  });
}

test('a list body that never ends: read up to maxListBytes, then dropped and retried', async (t) => {
  const { server, h, log } = await hostileSetup(t);
  const from = h.events.length;
  const grownMiB = await memoryGrowthDuring(async () => {
    // 200, `{"items":[` and objects, without end, as fast as we read.
    server.hostile('endless-body', { path: SERVICES });
    server.expireHistory();
    server.closeWatches();
    const failed = await log.waitFor((l) => failedFor('Service')(l) && l.during === 'list', 10_000);
    assert.equal(errOf(failed).code, 'KUP_ERR_API_RESPONSE');
    assert.match(
      errOf(failed).message,
      new RegExp(`^GET ${server.url}${SERVICES}: more than ${4 * MiB} bytes`),
    );
    await sleep(1000);
  });
  const failures = log.lines.filter(failedFor('Service')).length;
  t.diagnostic(
    `${failures} failures, ${(server.hostileBytes / MiB).toFixed(1)} MiB sent, memory grew ${grownMiB.toFixed(0)} MiB at most`,
  );
  assert.ok(grownMiB < 120, `memory grew ${grownMiB.toFixed(0)} MiB`);
  assert.ok(failures >= 2 && failures <= 8, `${failures} failures in ~1 s`);
  // What the server got to send is what we read: at most the bound (plus buffers) per attempt.
  const attempts = failures + 1;
  assert.ok(
    server.hostileBytes <= attempts * (4 * MiB + SLACK),
    `${(server.hostileBytes / MiB).toFixed(1)} MiB sent for ${attempts} attempts`,
  );
  nothingLost(h, from);
  server.hostile(null);
  server.create(makeService('default', 'after'));
  await converged(h, server);
});

for (const c of [
  {
    name: 'a 40 MiB page (the default maxPageBytes, 32 MiB)',
    // 200, then `{"items":[` and items with a 4 KiB annotation to 40 MiB, then `]}`.
    options: {
      bytes: 40 * MiB,
      item: `{"metadata":{"name":"big","annotations":{"note":"${'x'.repeat(4096)}"}}}`,
    },
    want: new RegExp(`: page 1 is over ${32 * MiB} bytes \\(maxPageBytes\\), not parsed`),
  },
  {
    name: 'a dense 8 MiB page of empty objects (the default maxPageValues, 2 M)',
    // 200, then `{"items":[{},{},{},…` to 8 MiB: 2.8 M objects, 3 bytes each.
    options: { bytes: 8 * MiB, item: '{}' },
    want: /: page 1 holds more than 2000000 values \(maxPageValues\), not parsed/,
  },
]) {
  test(`one page that would cost seconds to parse: ${c.name} is refused unparsed, with the URL`, async (t) => {
    const { server, h, log } = await hostileSetup(t, {
      ...LIMITS,
      maxListBytes: DEFAULT_LIMITS.maxListBytes,
    });
    const from = h.events.length;
    let grownMiB = 0;
    let failures = 0;
    const maxDelayMs = await loopDelayDuring(async () => {
      grownMiB = await memoryGrowthDuring(async () => {
        server.hostile('huge-page', { path: SERVICES, ...c.options });
        server.expireHistory();
        server.closeWatches();
        const failed = await log.waitFor((l) => failedFor('Service')(l) && l.during === 'list', 10_000);
        assert.equal(errOf(failed).code, 'KUP_ERR_API_RESPONSE');
        assert.match(errOf(failed).message, new RegExp(`^GET ${server.url}${SERVICES}: `));
        assert.match(errOf(failed).message, c.want);
        // Meanwhile the other resources flow.
        server.create(makeEndpointSlice('default', 'during', 'web', ['10.244.7.7']));
        await h.waitFor((s) => s.key === 'default/during', 2000);
        await sleep(1000);
      });
      failures = log.lines.filter(failedFor('Service')).length;
    });
    t.diagnostic(
      `${failures} failures, ${(server.hostileBytes / MiB).toFixed(1)} MiB sent, loop delay max ${maxDelayMs.toFixed(0)} ms, memory grew ${grownMiB.toFixed(0)} MiB at most`,
    );
    // Before: parsed whole (40 MiB of objects 0.4 s; 8 MiB of `{}` 1 s and ~0.3 GB), then refused.
    assert.ok(maxDelayMs < 250, `event loop held for ${maxDelayMs.toFixed(0)} ms`);
    // Up to 32 MiB read per try, a few tries, buffers freed when the collector runs: what is bounded, not tight.
    assert.ok(grownMiB < 300, `memory grew ${grownMiB.toFixed(0)} MiB`);
    assert.ok(failures >= 2 && failures <= 8, `${failures} failures in ~1 s`);
    nothingLost(h, from);
    server.hostile(null);
    server.create(makeService('default', 'after'));
    await converged(h, server);
  });
}

test('a watch of endless new objects: the cache stops at maxListItems, the watch is dropped and relisted with backoff', async (t) => {
  const maxListItems = 50;
  const { server, h, log } = await hostileSetup(t, { ...LIMITS, maxListItems });
  const mark = server.requests.length;
  const logMark = log.lines.length;
  let grownMiB = 0;
  const maxDelayMs = await loopDelayDuring(async () => {
    grownMiB = await memoryGrowthDuring(async () => {
      // `{"type":"ADDED","object":{"kind":"Service",…,"metadata":{"name":"hostile-N",…}}}`, N = 0, 1, 2, …
      server.hostile('endless-adds', { path: SERVICES });
      server.closeWatches();
      const failed = await log.waitFor((l) => failedFor('Service')(l) && l.during === 'watch', 10_000);
      assert.equal(errOf(failed).code, 'KUP_ERR_API_RESPONSE');
      assert.match(
        errOf(failed).message,
        new RegExp(
          `^GET ${server.url}${SERVICES}: the watch would hold more than 50 objects \\(maxListItems\\); the watch is dropped and relisted`,
        ),
      );
      server.create(makeEndpointSlice('default', 'during', 'web', ['10.244.7.7']));
      await h.waitFor((s) => s.key === 'default/during', 2000);
      await sleep(1000);
    });
  });
  // The most Services the handlers ever held: replay their adds and deletes.
  let held = 0;
  let most = 0;
  for (const e of h.events.filter((e) => e.kind === 'Service')) {
    held += e.op === 'add' ? 1 : e.op === 'delete' ? -1 : 0;
    most = Math.max(most, held);
  }
  const failures = log.lines.slice(logMark).filter(failedFor('Service')).length;
  const relists = listsOf(server, SERVICES, mark).length;
  t.diagnostic(
    `${failures} watches dropped, ${relists} relists, at most ${most} Services held, ${(server.hostileBytes / MiB).toFixed(1)} MiB sent, loop delay max ${maxDelayMs.toFixed(0)} ms, memory grew ${grownMiB.toFixed(0)} MiB at most`,
  );
  // Before: every new name was cached and handed on, as many as the server cared to send.
  assert.equal(most, maxListItems);
  assert.ok(failures >= 2 && failures <= 8, `${failures} watches dropped in ~1 s`);
  assert.ok(relists >= failures - 1, `${relists} relists for ${failures} drops`);
  assert.ok(maxDelayMs < 250, `event loop held for ${maxDelayMs.toFixed(0)} ms`);
  server.hostile(null);
  server.create(makeService('default', 'after'));
  await converged(h, server);
  assert.deepEqual([...h.objects.Service.keys()].sort(), [
    'default/after',
    'default/web',
    'kube-system/kube-dns',
  ]);
});

test('a watch line that never ends: dropped at maxLineBytes, re-watched with backoff; the loop never stalls', async (t) => {
  const { server, h, log } = await hostileSetup(t);
  const from = h.events.length;
  let failures = 0;
  let grownMiB = 0;
  const maxDelayMs = await loopDelayDuring(async () => {
    grownMiB = await memoryGrowthDuring(async () => {
      // `{"type":"ADDED","object":{"metadata":{"name":"aaaa…` without a newline, as fast as we read.
      server.hostile('endless-line', { path: SERVICES });
      server.closeWatches();
      const failed = await log.waitFor((l) => failedFor('Service')(l) && l.during === 'watch', 10_000);
      assert.equal(errOf(failed).code, 'KUP_ERR_API_RESPONSE');
      assert.match(
        errOf(failed).message,
        new RegExp(`^GET ${server.url}${SERVICES}: a watch line longer than ${MiB} bytes`),
      );
      // Meanwhile the other resources flow.
      const slice = makeEndpointSlice('default', 'during', 'web', ['10.244.7.7']);
      server.create(slice);
      await h.waitFor((s) => s.key === 'default/during', 2000);
      await sleep(1000);
    });
    failures = log.lines.filter(failedFor('Service')).length;
  });
  t.diagnostic(
    `${failures} failures, ${(server.hostileBytes / MiB).toFixed(1)} MiB sent, loop delay max ${maxDelayMs.toFixed(0)} ms, memory grew ${grownMiB.toFixed(0)} MiB at most`,
  );
  assert.ok(grownMiB < 120, `memory grew ${grownMiB.toFixed(0)} MiB`);
  // Before: the line was rescanned for each chunk and held whole (relaying stalled after 25 s).
  assert.ok(maxDelayMs < 250, `event loop held for ${maxDelayMs.toFixed(0)} ms`);
  assert.ok(failures >= 2 && failures <= 8, `${failures} failures in ~1 s`);
  const attempts = failures + 1;
  assert.ok(
    server.hostileBytes <= attempts * (MiB + SLACK),
    `${(server.hostileBytes / MiB).toFixed(1)} MiB sent for ${attempts} attempts`,
  );
  nothingLost(h, from);
  server.hostile(null);
  server.create(makeService('default', 'after'));
  await converged(h, server);
});

test('a 410 storm: relists back off (a successful list does not reset it); a quiet period does', async (t) => {
  const { server, h, log } = await hostileSetup(t);
  const from = h.events.length;
  const mark = server.requests.length;
  const logMark = log.lines.length;
  // Every Services watch: 200, ERROR 410, end. Every list succeeds.
  server.hostile('gone-storm', { path: SERVICES });
  server.closeWatches();
  await sleep(2500);
  const lists = listsOf(server, SERVICES, mark).length;
  const after = log.lines.slice(logMark).filter((l) => l.kind === 'Service');
  const expired = after.filter((l) => l.msg === 'Watch expired, relisting');
  const attempts = after.filter(failedFor('Service')).map((l) => Number(l.attempt));
  // Before: each list reset the backoff, a relist every ~40 ms here (every 0.7 s with the defaults).
  assert.ok(lists >= 4 && lists <= 16, `${lists} relists in 2.5 s`);
  assert.equal(expired.length, 1, 'only the first 410 relists at once');
  assert.deepEqual(attempts.slice(0, 3), [2, 3, 4]);
  assert.ok(Math.max(...attempts) >= 5, `attempts ${attempts}`);
  nothingLost(h, from);

  server.hostile(null);
  server.create(makeService('default', 'after'));
  await converged(h, server);
  // Healthy for longer than resetMs: the next 410 is routine again, relisted at once.
  await sleep(BACKOFF.resetMs + 200);
  const quiet = log.lines.length;
  server.expireHistory();
  server.closeWatches();
  await log.waitFor((l) => l.msg === 'Watch expired, relisting' && log.lines.indexOf(l) >= quiet);
  await converged(h, server);
  assert.ok(!log.lines.slice(quiet).some(failedFor('Service')), 'no backoff after a quiet period');
});

test('a flood of unknown event types: a few warnings a minute; the watch is dropped after 1000, re-watched with backoff', async (t) => {
  const { server, h, log } = await hostileSetup(t);
  const from = h.events.length;
  const logMark = log.lines.length;
  let failures: LogLine[] = [];
  const maxDelayMs = await loopDelayDuring(async () => {
    // `{"type":"SURPRISE",…}` lines without end, as fast as we read.
    server.hostile('unknown-types', { path: SERVICES });
    server.closeWatches();
    await log.waitFor((l) => failedFor('Service')(l) && l.during === 'watch', 10_000);
    const slice = makeEndpointSlice('default', 'during', 'web', ['10.244.7.7']);
    server.create(slice);
    await h.waitFor((s) => s.key === 'default/during', 2000);
    await sleep(1000);
    failures = log.lines.slice(logMark).filter(failedFor('Service'));
  });
  const warnings = log.lines.slice(logMark).filter((l) => l.msg === 'Skipping watch event of unknown type');
  t.diagnostic(
    `${failures.length} watches dropped, ${warnings.length} warnings, ${(server.hostileBytes / MiB).toFixed(1)} MiB sent, loop delay max ${maxDelayMs.toFixed(0)} ms`,
  );
  // Before: one warning per line (here > 50,000 a second), and the flood read for as long as it lasted.
  assert.equal(warnings.length, 5);
  assert.equal(warnings[0]?.type, 'SURPRISE');
  assert.ok(failures.length >= 2 && failures.length <= 8, `${failures.length} watches dropped`);
  for (const f of failures) {
    assert.equal(errOf(f).code, 'KUP_ERR_API_RESPONSE');
    assert.match(errOf(f).message, new RegExp(`^GET ${server.url}${SERVICES}: more than 1000 watch lines`));
  }
  assert.ok(server.hostileBytes <= (failures.length + 1) * SLACK, `${server.hostileBytes} bytes sent`);
  assert.ok(maxDelayMs < 250, `event loop held for ${maxDelayMs.toFixed(0)} ms`);
  nothingLost(h, from);
  server.hostile(null);
  server.create(makeService('default', 'after'));
  await converged(h, server);
});

test("HTML answers (a proxy's error page): one error naming the URL, on list and watch, 200 or 502", async (t) => {
  const { server, h, log } = await setup(t, {
    seed: (s) => {
      seedBasic(s);
      // Before the source starts: the first list of Services is answered with a page.
      s.hostile('html', { path: SERVICES });
    },
    source: { backoff: BACKOFF, limits: LIMITS },
  });
  const listed = await log.waitFor((l) => failedFor('Service')(l) && l.during === 'list');
  assert.equal(errOf(listed).code, 'KUP_ERR_API_RESPONSE');
  assert.match(
    errOf(listed).message,
    new RegExp(`^GET ${server.url}${SERVICES}: answered text/html, not JSON .*502 Bad Gateway`),
  );
  server.hostile(null);
  await synced(h);

  await server.waitForRequest((r) => r.verb === 'watch' && r.path === SERVICES);
  server.sendBookmark();
  let mark = log.lines.length;
  server.hostile('html', { path: SERVICES });
  server.closeWatches();
  const watched = await log.waitFor(
    (l) => failedFor('Service')(l) && l.during === 'watch' && log.lines.indexOf(l) >= mark,
  );
  assert.equal(errOf(watched).code, 'KUP_ERR_API_RESPONSE');
  assert.match(errOf(watched).message, new RegExp(`^GET ${server.url}${SERVICES}: answered text/html`));

  mark = log.lines.length;
  server.hostile('html', { path: SERVICES, status: 502 });
  const bad = await log.waitFor(
    (l) => failedFor('Service')(l) && log.lines.indexOf(l) >= mark && errOf(l).statusCode === 502,
  );
  assert.equal(errOf(bad).statusCode, 502);
  assert.match(
    errOf(bad).message,
    new RegExp(`^GET ${server.url}${SERVICES}: 502: .*text/html.*502 Bad Gateway`),
  );
  // Before: each line of the page was a 'Skipping malformed watch line' warning.
  assert.ok(!log.lines.some((l) => /malformed/.test(l.msg)));
  server.hostile(null);
  server.create(makeService('default', 'after'));
  await converged(h, server);
});

/** A source on a kubeconfig whose server is `url`; recording logs; stopped in t.after. */
function sourceAt(t: TestContext, url: string) {
  const kc = new KubeConfig();
  kc.loadFromClusterAndUser({ name: 'c', server: url, skipTLSVerify: true }, { name: 'u' });
  const log = recordingLogger();
  const source = new KubernetesSource({
    credentials: kubeConfigCredentials(kc),
    handlers: new RecordingHandlers(),
    nodeName: NODE,
    log: log.logger,
    configSyncPeriodMs: 0,
    backoff: BACKOFF,
  });
  t.after(() => source.stop());
  return { source, log };
}

test('TLS mismatch: https:// to a plain HTTP server, http:// to a TLS server; the error names the URL', async (t) => {
  const plain = await startFakeApiServer();
  t.after(() => plain.close());
  const psk = Buffer.from('000102030405060708090a0b0c0d0e0f', 'hex');
  const secure = tls.createServer({
    pskCallback: () => psk,
    ciphers: 'PSK-AES128-GCM-SHA256',
    maxVersion: 'TLSv1.2',
  });
  await new Promise<void>((resolve) => secure.listen(0, '127.0.0.1', resolve));
  t.after(() => new Promise((resolve) => secure.close(resolve)));
  const securePort = (secure.address() as net.AddressInfo).port;

  for (const c of [
    { url: `https://127.0.0.1:${plain.port}`, hint: /the answer is not TLS: a plain HTTP server\?/ },
    { url: `http://127.0.0.1:${securePort}`, hint: /no HTTP answer: a TLS server\?/ },
  ]) {
    const { source, log } = sourceAt(t, c.url);
    await source.start();
    const failed = await log.waitFor((l) => failedFor('Service')(l) && Number(l.attempt) >= 3);
    assert.equal(errOf(failed).code, 'KUP_ERR_API_REQUEST');
    assert.match(errOf(failed).message, new RegExp(`^GET ${c.url}${SERVICES}: `));
    assert.match(errOf(failed).message, c.hint);
    assert.equal(source.synced, false);
    await source.stop();
  }
});

/** The whole proxy (--no-iptables, default bounds and backoff) on the stand-in in its own process. */
async function proxyOn(t: TestContext) {
  // Its own process: the stand-in's endless writes must not share the event loop measured here.
  const api = await startFakeApiServerProcess();
  t.after(() => api.close());
  const logs: string[] = [];
  const destination = new Writable({
    write(chunk, _e, cb) {
      logs.push(String(chunk));
      cb();
    },
  });
  const config: Config = {
    ...DEFAULT_CONFIG,
    // In this process: one relaying process (the worker mode has tests of its own).
    workers: 1,
    kubeconfig: api.kubeconfig,
    iptables: false,
    hostnameOverride: NODE,
    bindAddress: '127.0.0.1',
    healthzBindAddress: '127.0.0.1:0',
    metricsBindAddress: '127.0.0.1:0',
    iptablesMinSyncPeriodMs: 0,
  };
  const server = new ProxyServer(config, { log: createLogger({ level: 'info', destination }) });
  await server.start();
  t.after(() => server.close());
  const pods: net.Server[] = [];
  t.after(() => Promise.all(pods.map((p) => new Promise((r) => p.close(r)))));
  const pod = async (host: string, port = 0) => {
    const s = net.createServer((sock) => sock.end(host));
    pods.push(s);
    await new Promise<void>((resolve) => s.listen({ host, port }, resolve));
    return (s.address() as net.AddressInfo).port;
  };
  const port = await pod('127.0.0.11');
  await pod('127.0.0.12', port);
  const ports = [{ name: 'http', protocol: 'TCP', port }];
  const target = [{ name: 'http', protocol: 'TCP', port: 80, targetPort: port }];
  await api.create(makeService('shop', 'web', { ports: target }));
  await api.create(makeEndpointSlice('shop', 'web-abc', 'web', ['127.0.0.11'], ports));
  const key = 'shop/web:http/TCP';
  const proxyPort = () => server.proxier.get(key as never)?.proxyPort;
  await waitFor(() => proxyPort() !== undefined, 5000, 'the service port to open');
  const servicesRequests = async () =>
    (await api.stats()).requests.filter((r) => r.path === SERVICES && r.verb !== 'other').length;
  await waitFor(async () => (await servicesRequests()) >= 2, 5000, 'the Services watch');
  await api.sendBookmark();
  const healthz = async () => (await fetch(`http://127.0.0.1:${server.healthServer!.port}/healthz`)).status;
  return { api, logs, proxyPort, ports, servicesRequests, healthz };
}

// The endless lists are left to the tests above: at the default bound each attempt reads 256 MiB.
for (const mode of ['endless-line', 'unknown-types', 'gone-storm', 'html'] as const) {
  test(`the whole proxy relays without a stall while the API server answers ${mode}, and recovers`, async (t) => {
    const { api, logs, proxyPort, ports, servicesRequests, healthz } = await proxyOn(t);
    const before = await servicesRequests();
    await api.hostile(mode, { path: SERVICES });
    await api.expireHistory();
    await api.closeWatches();
    let worstMs = 0;
    let served = 0;
    const maxDelayMs = await loopDelayDuring(async () => {
      const until = Date.now() + 2000;
      while (Date.now() < until) {
        const started = performance.now();
        assert.equal(await request(proxyPort()!, { timeoutMs: 2000 }), '127.0.0.11', mode);
        worstMs = Math.max(worstMs, performance.now() - started);
        served++;
        await sleep(20);
      }
    });
    const calls = (await servicesRequests()) - before;
    const figure = `${mode}: ${served} served in 2 s, worst ${worstMs.toFixed(0)} ms, loop delay max ${maxDelayMs.toFixed(0)} ms, ${calls} Services requests, ${((await api.stats()).hostileBytes / MiB).toFixed(1)} MiB hostile`;
    t.diagnostic(figure);
    assert.ok(calls >= 1, figure);
    assert.ok(worstMs < 500, figure);
    assert.ok(maxDelayMs < 300, figure);
    assert.equal(await healthz(), 200);
    const failures = logs.filter((l) => l.includes('"msg":"Watch failed, retrying"'));
    assert.ok(
      failures.every((l) => l.includes(`GET ${api.url}/`)),
      failures.join(''),
    );
    if (mode === 'endless-line') assert.ok(failures.some((l) => l.includes('longer than 8388608 bytes')));
    assert.ok(!logs.some((l) => l.includes('Skipping malformed watch line')));
    // Recovery: an endpoint change is applied once the server behaves (within the backoff).
    await api.hostile(null);
    await api.update(makeEndpointSlice('shop', 'web-abc', 'web', ['127.0.0.12'], ports));
    await waitFor(async () => (await request(proxyPort()!)) === '127.0.0.12', 10_000, 'the new endpoint');
  });
}
