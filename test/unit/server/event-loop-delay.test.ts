// The event loop's delay gauges: prom-client's names, read past the 100 ms sampling interval, and a loop
// that is no longer woken every 10 ms to sample it.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import client from 'prom-client';
import { collectDefaultMetrics, lateSeconds } from '../../../src/server/event-loop-delay.ts';

const DELAY_NAMES = ['min', 'max', 'mean', 'stddev', 'p50', 'p90', 'p99'].map(
  (s) => `nodejs_eventloop_lag_${s}_seconds`,
);

test('lateSeconds: the delay past the interval, in seconds, never below 0', () => {
  assert.equal(lateSeconds(100_500_000, 100), 0.0005);
  assert.equal(lateSeconds(350_000_000, 100), 0.25);
  assert.equal(lateSeconds(99_000_000, 100), 0, 'a sample a little early is not negative');
  assert.equal(lateSeconds(0, 100), 0);
});

test("prom-client's default metrics, each delay gauge once, reading how late the loop ran", async () => {
  const registry = new client.Registry();
  collectDefaultMetrics(registry);
  const scrape = async () => {
    const text = await registry.metrics();
    const values = new Map<string, number>();
    for (const line of text.split('\n')) {
      const [name, value] = line.split(' ');
      if (name !== undefined && value !== undefined && !name.startsWith('#')) values.set(name, Number(value));
    }
    return { text, values };
  };
  const first = await scrape();
  for (const name of DELAY_NAMES) {
    assert.equal(first.text.split('\n').filter((l) => l.startsWith(`# HELP ${name} `)).length, 1, name);
  }
  for (const name of [
    'process_cpu_user_seconds_total',
    'nodejs_heap_size_used_bytes',
    'nodejs_eventloop_lag_seconds',
  ])
    assert.ok(first.values.has(name), `${name} is still there`);

  // Idle: on time (prom-client's own gauges would read the 10 ms between samples).
  await sleep(450);
  const idle = (await scrape()).values;
  assert.ok(
    idle.get('nodejs_eventloop_lag_min_seconds')! < 0.005,
    `idle min ${idle.get('nodejs_eventloop_lag_min_seconds')}`,
  );
  assert.ok(
    idle.get('nodejs_eventloop_lag_p50_seconds')! < 0.05,
    `idle p50 ${idle.get('nodejs_eventloop_lag_p50_seconds')}`,
  );

  // A 300 ms stall delays the sample due within it by 200-300 ms.
  await sleep(150);
  const until = Date.now() + 300;
  while (Date.now() < until);
  await sleep(150);
  const stalled = (await scrape()).values;
  const max = stalled.get('nodejs_eventloop_lag_max_seconds')!;
  assert.ok(max >= 0.15 && max < 1, `max after a 300 ms stall: ${max}`);
});

test('an idle process is woken ~10 times a second to sample its loop, not ~100', () => {
  // A process of its own, so that nothing else of the test runner's wakes it: voluntary context switches
  // over one idle second (prom-client's 10 ms sampling alone makes ~95).
  const script = `
    import client from 'prom-client';
    import { collectDefaultMetrics } from ${JSON.stringify(new URL('../../../src/server/event-loop-delay.ts', import.meta.url).href)};
    collectDefaultMetrics(new client.Registry());
    setTimeout(() => {
      const before = process.resourceUsage().voluntaryContextSwitches;
      setTimeout(() => console.log(process.resourceUsage().voluntaryContextSwitches - before), 1000);
    }, 300);
  `;
  const run = spawnSync(process.execPath, ['--input-type=module', '-e', script], {
    cwd: fileURLToPath(new URL('../../../', import.meta.url)),
    encoding: 'utf8',
    timeout: 20_000,
  });
  assert.equal(run.status, 0, run.stderr);
  const switches = Number(run.stdout.trim());
  assert.ok(switches >= 0 && switches < 40, `voluntary context switches in an idle second: ${switches}`);
});
