// The trace stream's metrics read the tracer's counters at each scrape.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import client from 'prom-client';
import { registerTraceMetrics } from '../../../src/server/trace-metrics.ts';
import type { TracerStats } from '../../../src/trace/tracer.ts';

test('followers, their maximum, refusals and dropped events, as of each scrape', async () => {
  const registry = new client.Registry();
  const stats: TracerStats = {
    events: 0,
    subscribers: 0,
    maxSubscribers: 32,
    refusedSubscribers: 0,
    droppedEvents: 0,
    overBudgetEvents: 0,
  };
  registerTraceMetrics(registry, { stats: () => ({ ...stats }) });
  const value = async (name: string, labels = '') => {
    const line = (await registry.metrics()).split('\n').find((l) => l.startsWith(`${name}${labels} `));
    return Number(line?.split(' ')[1]);
  };
  assert.equal(await value('kup_trace_followers'), 0);
  assert.equal(await value('kup_trace_followers_max'), 32);
  Object.assign(stats, { subscribers: 3, refusedSubscribers: 2, droppedEvents: 7, overBudgetEvents: 5 });
  assert.equal(await value('kup_trace_followers'), 3);
  assert.equal(await value('kup_trace_followers_refused_total'), 2);
  assert.equal(await value('kup_trace_events_dropped_total', '{reason="slow-follower"}'), 7);
  assert.equal(await value('kup_trace_events_dropped_total', '{reason="over-budget"}'), 5);
  // Counters are the tracer's totals, not added up across scrapes.
  assert.equal(await value('kup_trace_followers_refused_total'), 2);
});
