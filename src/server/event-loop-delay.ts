// The event loop's delay for /metrics: prom-client's nodejs_eventloop_lag_{min,max,mean,stddev,p50,p90,p99}
// _seconds, from a sample every 100 ms instead of prom-client's 10 ms. Its 10 ms timer woke an idle
// proxy's main process ~95 times a second on every node (its workers ~1, HAProxy ~1); a 100 ms one ~10.
// Node's delay histogram records the time between two samples, the interval included, so prom-client's
// gauges read ~10 ms on an idle loop; these report how late the loop ran, the interval taken out (an idle
// loop reads ~0, a loop that runs 150 ms late reads 0.15). A stall longer than the interval is always
// seen, as what it delayed the sample due within it by (up to one interval less than the stall).
import { monitorEventLoopDelay } from 'node:perf_hooks';
import client from 'prom-client';

/** How often the loop's delay is sampled. */
export const EVENT_LOOP_SAMPLE_MS = 100;
/** prom-client samples in any case: at this resolution its timer never fires (~24.8 days). */
const DORMANT_MS = 2 ** 31 - 1;
const NS_PER_S = 1e9;

type DelayHistogram = ReturnType<typeof monitorEventLoopDelay>;

/** A gauge of the delay, as prom-client names it; `late`: a delay, to be read past the interval. */
type DelayGauge = { name: string; help: string; read: (h: DelayHistogram) => number; late: boolean };
const gauge = (stat: string, help: string, read: DelayGauge['read'], late = true): DelayGauge => ({
  name: `nodejs_eventloop_lag_${stat}_seconds`,
  help,
  read,
  late,
});
const DELAY_GAUGES: readonly DelayGauge[] = [
  gauge('min', 'The minimum recorded event loop delay', (h) => h.min),
  gauge('max', 'The maximum recorded event loop delay', (h) => h.max),
  gauge('mean', 'The mean of the recorded event loop delays', (h) => h.mean),
  gauge('stddev', 'The standard deviation of the recorded event loop delays', (h) => h.stddev, false),
  ...[50, 90, 99].map((p) =>
    gauge(`p${p}`, `The ${p}th percentile of the recorded event loop delays`, (h) => h.percentile(p)),
  ),
];

/**
 * Seconds late, from a delay of the histogram in nanoseconds (the time between two samples): the sampling
 * interval taken out, never below 0. Pure.
 */
export function lateSeconds(delayNs: number, sampleMs: number): number {
  return Math.max(0, delayNs - sampleMs * 1e6) / NS_PER_S;
}

/**
 * prom-client's default metrics (process, heap, GC, handles, ...) on `registry`, with the event loop's
 * delay sampled every `sampleMs` instead of prom-client's 10 ms.
 */
export function collectDefaultMetrics(registry: client.Registry, sampleMs = EVENT_LOOP_SAMPLE_MS): void {
  client.collectDefaultMetrics({ register: registry, eventLoopMonitoringPrecision: DORMANT_MS });
  for (const g of DELAY_GAUGES) registry.removeSingleMetric(g.name);
  const histogram = monitorEventLoopDelay({ resolution: sampleMs });
  histogram.enable();
  const gauges: client.Gauge[] = [];
  // The first gauge's collect sets them all and starts the next period, as prom-client's does (a registry
  // collects its metrics in the order they were registered).
  const collect = (): void => {
    const sampled = histogram.count > 0;
    DELAY_GAUGES.forEach((g, i) => {
      const ns = sampled ? g.read(histogram) : 0;
      gauges[i]!.set(g.late ? lateSeconds(ns, sampleMs) : ns / NS_PER_S);
    });
    histogram.reset();
  };
  DELAY_GAUGES.forEach((g, i) => {
    const help = `${g.help}, past the ${sampleMs} ms between samples.`;
    gauges.push(
      new client.Gauge({ name: g.name, help, registers: [registry], ...(i === 0 ? { collect } : {}) }),
    );
  });
}
