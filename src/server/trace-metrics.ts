// Metrics of the live trace stream: who follows it (/debug/trace and the console) and what they did not
// get. Read from the tracer's counters when scraped, like the data-path metrics; nothing on the hot path.
import client from 'prom-client';
import type { Tracer } from '../trace/tracer.ts';

/** Registers the trace stream's metrics on `registry`; each scrape reads `tracer.stats()`. */
export function registerTraceMetrics(registry: client.Registry, tracer: Pick<Tracer, 'stats'>): void {
  new client.Gauge({
    name: 'kup_trace_followers',
    help: 'Subscribers of the live trace stream now (/debug/trace followers)',
    registers: [registry],
    collect() {
      this.set(tracer.stats().subscribers);
    },
  });
  new client.Gauge({
    name: 'kup_trace_followers_max',
    help: 'Subscribers the live trace stream takes at once; more are refused',
    registers: [registry],
    collect() {
      this.set(tracer.stats().maxSubscribers);
    },
  });
  new client.Counter({
    name: 'kup_trace_followers_refused_total',
    help: 'Subscriptions to the live trace stream refused because the maximum were subscribed',
    registers: [registry],
    collect() {
      this.reset();
      this.inc(tracer.stats().refusedSubscribers);
    },
  });
  new client.Counter({
    name: 'kup_trace_events_dropped_total',
    help: 'Trace events a subscriber did not get, by reason (slow-follower: it did not read, counted once per subscriber; over-budget: the stream had spent its time budget)',
    labelNames: ['reason'],
    registers: [registry],
    collect() {
      this.reset();
      const stats = tracer.stats();
      this.inc({ reason: 'slow-follower' }, stats.droppedEvents);
      this.inc({ reason: 'over-budget' }, stats.overBudgetEvents);
    },
  });
}
