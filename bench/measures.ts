// The measures of the namespace benchmark. Traffic measures run alternately against every target
// (the order rotates each round) and keep every sample; memory and scale measures drive the proxy CLI
// and the peers directly. Each measure returns samples; medians and ratios are the report's job.
import { setTimeout as sleep } from 'node:timers/promises';
import { scaleIP, scaleService, scaleSlice } from './apiserver-agent.ts';
import { NET } from './configs.ts';
import { cpuOf, cpuSnapshot, otherTicks, rssOf } from './processes.ts';
import { PROXY_BIN, type Rig, type Target, type TargetName } from './rig.ts';
import { median, parseDnsperf, parseIperf3, parseWrk } from './tools.ts';

const CLK_TCK = 100;

export type Options = {
  rounds: number;
  /** Seconds per traffic sample. */
  seconds: number;
  /** Connections held for the per-connection memory measure. */
  heldConnections: number;
  /** Service ports of the scale measures. */
  services: number;
  /** Repetitions of the one-change measures (service added, endpoint changed). */
  changes: number;
  log: (line: string) => void;
};

/**
 * One run of one measure against one target. `cpu`: the in-between processes' CPU, % of one core;
 * `otherCpu`: what processes outside the benchmark used meanwhile (% of one core), i.e. noise.
 */
export type Sample = {
  target: TargetName;
  round: number;
  values: Record<string, number>;
  cpu?: number;
  otherCpu?: number;
  error?: string;
};

export type MeasureResult = {
  name: string;
  title: string;
  /** The value names of a sample, in the order the report shows them, with units. */
  fields: Record<string, string>;
  samples: Sample[];
  notes: string[];
};

export type Measure = {
  name: string;
  title: string;
  /** traffic measures share the running proxies; scale stops them and runs its own. */
  kind: 'traffic' | 'memory' | 'scale';
  run(rig: Rig, options: Options): Promise<MeasureResult>;
};

/** Rotates the target order each round, so no target always runs first (warm caches, turbo, GC). */
function rotate<T>(xs: readonly T[], by: number): T[] {
  const k = by % xs.length;
  return [...xs.slice(k), ...xs.slice(0, k)];
}

async function alternate(
  rig: Rig,
  options: Options,
  targets: readonly Target[],
  label: string,
  one: (t: Target) => Promise<{ values: Record<string, number>; error?: string }>,
): Promise<Sample[]> {
  const samples: Sample[] = [];
  for (let round = 0; round < options.rounds; round++) {
    for (const t of rotate(targets, round)) {
      const pids = t.pids();
      const ours = rig.ourPids();
      const other0 = cpuSnapshot(ours);
      const cpu0 = cpuOf(pids);
      const t0 = performance.now();
      let r: { values: Record<string, number>; error?: string };
      try {
        r = await one(t);
      } catch (err) {
        r = { values: {}, error: (err as Error).message };
      }
      const secs = (performance.now() - t0) / 1000;
      const sample: Sample = { target: t.name, round, values: r.values };
      if (pids.length > 0) sample.cpu = ((cpuOf(pids) - cpu0) / CLK_TCK / secs) * 100;
      sample.otherCpu = (otherTicks(other0, cpuSnapshot(ours)) / CLK_TCK / secs) * 100;
      if (r.error) sample.error = r.error;
      samples.push(sample);
      const shown = Object.entries(r.values)
        .map(([k, v]) => `${k}=${v >= 100 ? Math.round(v) : v.toFixed(3)}`)
        .join(' ');
      options.log(
        `  ${label} round ${round + 1}/${options.rounds} ${t.name.padEnd(13)} ${shown}${sample.cpu === undefined ? '' : ` cpu=${sample.cpu.toFixed(0)}%`} other=${sample.otherCpu.toFixed(0)}%${r.error ? ` ERROR ${r.error}` : ''}`,
      );
    }
  }
  return samples;
}

function iperf(streams: number): Measure {
  const name = streams === 1 ? 'tcp-1' : `tcp-${streams}`;
  const title = streams === 1 ? 'one TCP stream (iperf3)' : `${streams} TCP streams (iperf3 -P ${streams})`;
  return {
    name,
    title,
    kind: 'traffic',
    async run(rig, options) {
      const samples = await alternate(rig, options, rig.targets(), name, async (t) => {
        const args = [
          '-c',
          t.iperf.host,
          '-p',
          String(t.iperf.port),
          '-t',
          String(options.seconds),
          '-O',
          '1',
          '-J',
        ];
        if (streams > 1) args.push('-P', String(streams));
        let r = parseIperf3(
          (await rig.runIn(rig.client, 'iperf3', args, (options.seconds + 20) * 1000)).stdout,
        );
        // The server takes a moment after a test through a proxy (its control connection closes late).
        for (let retry = 0; retry < 5 && r.error?.includes('busy'); retry++) {
          await sleep(500);
          r = parseIperf3(
            (await rig.runIn(rig.client, 'iperf3', args, (options.seconds + 20) * 1000)).stdout,
          );
        }
        return {
          values: { gbps: r.gbps, retransmits: r.retransmits },
          ...(r.error ? { error: r.error } : {}),
        };
      });
      return {
        name,
        title,
        fields: { gbps: 'Gbit/s', retransmits: 'retransmits' },
        samples,
        notes: [
          'receiver-side rate; the first second is omitted (-O 1); iperf service has one endpoint (iperf3 pairs control and data connections)',
        ],
      };
    },
  };
}

function wrk(close: boolean): Measure {
  const name = close ? 'http-close' : 'http-keepalive';
  const title = close
    ? 'new connection per request, 32 connections (wrk -H "Connection: close")'
    : 'HTTP keep-alive, 32 connections (wrk)';
  return {
    name,
    title,
    kind: 'traffic',
    async run(rig, options) {
      const samples = await alternate(rig, options, rig.targets(), name, async (t) => {
        const args = ['-t1', '-c32', `-d${options.seconds}s`, '--latency'];
        if (close) args.push('-H', 'Connection: close');
        args.push(`http://${t.http.host}:${t.http.port}/`);
        const run = await rig.runIn(rig.client, 'wrk', args, (options.seconds + 20) * 1000);
        const r = parseWrk(run.stdout);
        const error =
          r.error ?? (r.errors > 0 ? `${r.errors} socket errors or non-2xx of ${r.requests}` : undefined);
        return {
          values: { rps: r.rps, p50: r.p50, p99: r.p99, errors: r.errors },
          ...(error ? { error } : {}),
        };
      });
      return {
        name,
        title,
        fields: {
          rps: close ? 'connections/s' : 'requests/s',
          p50: 'p50 ms',
          p99: 'p99 ms',
          errors: 'errors',
        },
        samples,
        notes: [
          'wrk -t1 -c32 --latency against nginx `return 200` backends (2 backends through the proxies, backend 1 for direct)',
        ],
      };
    },
  };
}

const dns: Measure = {
  name: 'dns',
  title: 'DNS over UDP (dnsperf -c 8 -q 32 against dnsmasq)',
  kind: 'traffic',
  async run(rig, options) {
    const queries = await rig.writeManifest('queries.txt', 'bench.test A\n');
    const targets = rig.targets().filter((t) => t.dns !== undefined);
    const samples = await alternate(rig, options, targets, 'dns', async (t) => {
      const args = [
        '-s',
        t.dns!.host,
        '-p',
        String(t.dns!.port),
        '-d',
        queries,
        '-l',
        String(options.seconds),
      ];
      args.push('-c', '8', '-q', '32', '-t', '2');
      const run = await rig.runIn(rig.client, 'dnsperf', args, (options.seconds + 20) * 1000);
      const r = parseDnsperf(run.stdout);
      const error = r.error ?? (r.lostPercent > 1 ? `${r.lostPercent}% of queries lost` : undefined);
      return {
        values: { qps: r.qps, lost: r.lostPercent, avg: r.avgLatencyMs },
        ...(error ? { error } : {}),
      };
    });
    return {
      name: 'dns',
      title: this.title,
      fields: { qps: 'queries/s', lost: 'lost %', avg: 'avg latency ms' },
      samples,
      notes: [
        '8 client sockets (source ports) with 32 queries in flight; HAProxy has no UDP and is not measured',
        'dnsmasq answers bench.test from --address; 2 dnsmasq backends through the proxies, backend 1 for direct',
      ],
    };
  },
};

const connMemory: Measure = {
  name: 'conn-memory',
  title: 'RSS per idle proxied TCP connection',
  kind: 'memory',
  async run(rig, options) {
    const samples: Sample[] = [];
    const targets = rig.targets().filter((t) => t.name !== 'direct');
    for (let round = 0; round < Math.min(options.rounds, 2); round++) {
      // Fresh processes: memory freed by earlier connections would be reused and hide the cost.
      await rig.restartMiddles();
      for (const t of rotate(targets, round)) {
        await sleep(500);
        await rig.collectGarbage(t.name);
        const before = rssOf(t.pids());
        const r = await rig.clientProbe.request<{
          ok: boolean;
          open: number;
          failed: number;
          error?: string;
        }>(
          'hold',
          { host: t.http.host, port: t.http.port, n: options.heldConnections, concurrency: 64 },
          120_000,
        );
        await sleep(1000);
        const heap = await rig.collectGarbage(t.name);
        const after = rssOf(t.pids());
        await rig.clientProbe.request('release');
        const perConn = ((after - before) * 1024) / Math.max(r.open, 1);
        const sample: Sample = {
          target: t.name,
          round,
          values: {
            bytesPerConnection: perConn,
            open: r.open,
            rssBeforeKiB: before,
            rssAfterKiB: after,
            ...(heap.heapUsed === undefined ? {} : { heapUsedAfter: heap.heapUsed }),
          },
        };
        if (!r.ok) sample.error = `${r.failed} of ${options.heldConnections} connections failed (${r.error})`;
        samples.push(sample);
        options.log(
          `  conn-memory round ${round + 1} ${t.name.padEnd(13)} ${r.open} open, RSS ${before} → ${after} KiB, ${(perConn / 1024).toFixed(1)} KiB each${sample.error ? ` ERROR ${sample.error}` : ''}`,
        );
        // Let the closes finish before the next target is measured.
        await sleep(1500);
      }
    }
    return {
      name: 'conn-memory',
      title: `RSS per idle proxied TCP connection (${options.heldConnections} held, one keep-alive request each)`,
      fields: { bytesPerConnection: 'bytes', open: 'connections open' },
      samples,
      notes: [
        'RSS of the proxying process (nginx: master + workers) with the connections open minus before, divided by the open connections; freshly started processes each round; for the proxies, RSS is read after a full garbage collection (inspector, HeapProfiler.collectGarbage) both times',
      ],
    };
  },
};

type Answered = { ok: boolean; t: number; tries?: number; error?: string };
type Written = { ok: boolean; t: number; watches?: number; error?: string };

const scale: Measure = {
  name: 'scale',
  title: 'scale: service ports, cold start, one change',
  kind: 'scale',
  async run(rig, options) {
    const n = options.services;
    const [b1, b2] = NET.backends;
    const samples: Sample[] = [];
    const notes: string[] = [];
    const args = ['--proxy-port-range', '20000-30999'];
    const cleanup = async () => {
      const r = await rig.runIn(rig.node, process.execPath, [PROXY_BIN, '--cleanup'], 60_000);
      if (r.code !== 0) options.log(`  ! --cleanup exited with ${r.code}: ${r.stderr.slice(0, 300)}`);
    };
    const push = (values: Record<string, number>, round: number, error?: string) => {
      const s: Sample = { target: 'proxy', round, values };
      if (error) s.error = error;
      samples.push(s);
    };
    // The proxy is fed as in a cluster: list + watch from the API stand-in on the node's 127.0.0.1.
    const api = await rig.startApiServer();
    const master = { master: api.url };
    const load = async (count: number) => {
      const r = await api.request<{ ok: boolean; written?: number; error?: string }>(
        'load',
        { n: count, endpointOf1: b1 },
        120_000,
      );
      if (!r.ok) throw new Error(`API stand-in: load ${count}: ${r.error}`);
    };
    /** Writes one object; its `t` is when the stand-in had written the watch events. */
    const upsert = async (object: object): Promise<Written> => {
      const r = await api.request<Written>('upsert', { object }, 10_000);
      if (!r.ok) throw new Error(`API stand-in: upsert: ${r.error}`);
      // Services, EndpointSlices and the Node: a change is only "delivered" if the proxy watches.
      if ((r.watches ?? 0) < 3) r.error = `only ${r.watches} watches open on the API stand-in`;
      return r;
    };

    /**
     * From the proxy's metrics so far: time spent in syncs (kubeproxy_sync_proxy_rules_duration_seconds)
     * and network programming latency (kubeproxy_network_programming_duration_seconds: from a slice's
     * last-change-trigger-time until the proxy applied it), each as total ms and count.
     */
    const proxyTotals = async () => {
      const r = await rig.nodeProbe.request<{ ok: boolean; body?: string }>('get', {
        host: '127.0.0.1',
        port: NET.metricsPort,
        path: '/metrics',
        timeoutMs: 5000,
      });
      const value = (name: string) =>
        Number(new RegExp(`^${name} ([\\d.e+-]+)$`, 'm').exec(r.body ?? '')?.[1] ?? Number.NaN);
      return {
        syncMs: value('kubeproxy_sync_proxy_rules_duration_seconds_sum') * 1000,
        syncs: value('kubeproxy_sync_proxy_rules_duration_seconds_count'),
        programmingMs: value('kubeproxy_network_programming_duration_seconds_sum') * 1000,
        programmed: value('kubeproxy_network_programming_duration_seconds_count'),
      };
    };

    try {
      // The baseline: the same process with one service port, fed the same way.
      await cleanup();
      await load(1);
      const base = await rig.startProxy('scale', rig.node, master, args, 1);
      await sleep(1000);
      await rig.collectGarbage('scale');
      const rssBase = rssOf([base.daemon.pid]);
      await base.daemon.stop();
      options.log(`  scale: RSS with 1 service port ${rssBase} KiB (API stand-in, list+watch)`);

      const last = scaleIP(n);
      for (let round = 0; round < Math.min(options.rounds, 3); round++) {
        await cleanup();
        // Exactly the cold-start objects again (round 0's changes undone while no proxy watches).
        await load(n);
        // The client asks the last ClusterIP from before the start until it is answered.
        const served = rig.clientProbe.request<Answered>(
          'pollHttp',
          { host: last, port: 80, intervalMs: 20, timeoutMs: 300, concurrent: 15, maxMs: 180_000 },
          190_000,
        );
        await sleep(50);
        const started = await rig.startProxy('scale', rig.node, master, args, n, 250);
        const s = await served;
        const cpuSecs = cpuOf([started.daemon.pid]) / CLK_TCK;
        await sleep(1000);
        const heap = await rig.collectGarbage('scale');
        const rss = rssOf([started.daemon.pid]);
        const listed = (started.listedAt - started.spawnedAt) / 1000;
        const answered = s.ok ? (s.t - started.spawnedAt) / 1000 : Number.NaN;
        push(
          {
            listedSeconds: listed,
            servedSeconds: answered,
            startCpuSeconds: cpuSecs,
            bytesPerServicePort: ((rss - rssBase) * 1024) / n,
            rssKiB: rss,
            heapUsed: heap.heapUsed ?? Number.NaN,
          },
          round,
          s.ok ? undefined : s.error,
        );
        options.log(
          `  scale round ${round + 1}: ${n} listed after ${listed.toFixed(2)} s, last ClusterIP answered after ${answered.toFixed(2)} s, RSS ${rss} KiB (${(((rss - rssBase) * 1024) / n / 1024).toFixed(2)} KiB per service port), CPU ${cpuSecs.toFixed(1)} s`,
        );

        if (round === 0) {
          // One change at a time, each arriving at an idle proxy (past --iptables-min-sync-period, 1 s).
          for (let c = 0; c < options.changes; c++) {
            await sleep(1500);
            const i = n + 1 + c;
            const before = await proxyTotals();
            // Tries overlap (a new one every ms): SYNs to a ClusterIP not programmed yet are dropped.
            const poll = rig.clientProbe.request<Answered>(
              'pollHttp',
              { host: scaleIP(i), port: 80, intervalMs: 1, timeoutMs: 250, concurrent: 250, maxMs: 60_000 },
              70_000,
            );
            await sleep(20);
            // The EndpointSlice first (applied without a sync), then the Service: the time is the Service's.
            await upsert(scaleSlice(i, [b1, b2]));
            const w = await upsert(scaleService(i));
            const r = await poll;
            const ms = r.ok ? r.t - w.t : Number.NaN;
            const after = await proxyTotals();
            const syncMs = after.syncMs - before.syncMs;
            const syncs = after.syncs - before.syncs;
            push({ serviceAddedMs: ms, proxySyncMs: syncMs, syncs }, c, r.ok ? w.error : r.error);
            options.log(
              `  scale: service ${i} added, served after ${ms} ms (${r.tries} tries; the proxy's sync took ${syncMs.toFixed(0)} ms, ${syncs} sync(s))${w.error ? ` ! ${w.error}` : ''}`,
            );
          }
          for (let c = 0; c < options.changes; c++) {
            await sleep(1500);
            const to = c % 2 === 0 ? b2 : b1;
            const name = c % 2 === 0 ? 'pod2' : 'pod1';
            const before = await proxyTotals();
            const poll = rig.clientProbe.request<Answered>(
              'pollHttp',
              {
                host: scaleIP(1),
                port: 80,
                match: `^${name}`,
                intervalMs: 1,
                timeoutMs: 300,
                concurrent: 4,
                maxMs: 60_000,
              },
              70_000,
            );
            await sleep(20);
            // The trigger time (as the EndpointSlice controller sets it) lets the proxy say when it applied it.
            const w = await upsert(scaleSlice(1, [to], new Date()));
            const r = await poll;
            const ms = r.ok ? r.t - w.t : Number.NaN;
            const after = await proxyTotals();
            const applied = after.programmingMs - before.programmingMs;
            push(
              { endpointChangedMs: ms, programmingMs: applied, syncs: after.syncs - before.syncs },
              c,
              r.ok ? w.error : r.error,
            );
            options.log(
              `  scale: endpoint of svc-1 → ${name}, in effect after ${ms} ms (${r.tries} tries; applied by the proxy ${applied.toFixed(0)} ms after its trigger time, ${after.syncs - before.syncs} sync(s))${w.error ? ` ! ${w.error}` : ''}`,
            );
          }
        }
        await started.daemon.stop();
      }
      await cleanup();
    } finally {
      await rig.stopApiServer();
    }
    notes.push(
      `${n} Services with one TCP port each (2 endpoints), served by the Kubernetes API stand-in (test/helpers/fake-apiserver.ts) on the node namespace's 127.0.0.1; the CLI runs with --master http://127.0.0.1:PORT (no kubeconfig) and lists (pages of 500) then watches Services, EndpointSlices and its Node; --proxy-port-range 20000-30999; other flags default (--iptables-min-sync-period 1s)`,
      'cold start: from spawning the CLI until /debug/services lists every port (polled every 250 ms) and until the client pod gets an answer from the last ClusterIP (a try every 20 ms, up to 15 overlapping, each ≤ 300 ms)',
      'per service port: RSS with all ports open minus RSS of the same CLI fed the same way with one port, divided by the ports; both read after a full garbage collection (inspector)',
      "service added: the EndpointSlice is written first, then the Service; from the moment the stand-in has written the Service's watch event until the client pod is answered through the new ClusterIP (a new connection every 1 ms, up to 250 overlapping, each ≤ 250 ms); proxySyncMs: the proxy's own sync time for it (kubeproxy_sync_proxy_rules_duration_seconds)",
      "endpoint change: svc-1's EndpointSlice rewritten with the other pod; from the moment the stand-in has written the watch event until the client pod is answered by the new pod (a new connection every 1 ms, up to 4 overlapping, each ≤ 300 ms); the slice carries endpoints.kubernetes.io/last-change-trigger-time, so the proxy's kubeproxy_network_programming_duration_seconds says when it applied the change (programmingMs)",
      'each change arrives at an idle proxy, 1.5 s after the one before (past --iptables-min-sync-period)',
    );
    return {
      name: 'scale',
      title: `${n} services: memory per port, cold start, one change`,
      fields: {
        listedSeconds: 's until /debug/services lists all',
        servedSeconds: 's until the last ClusterIP answers',
        startCpuSeconds: 'CPU s of the proxy until then',
        bytesPerServicePort: 'bytes per idle service port',
        serviceAddedMs: 'ms until an added service is served',
        endpointChangedMs: 'ms until an endpoint change is in effect',
      },
      samples,
      notes,
    };
  },
};

/** A short unrecorded run against every target, so the first measured round is not a JIT warm-up. */
export async function warmUp(rig: Rig, options: Options): Promise<void> {
  for (const t of rig.targets()) {
    await rig.runIn(
      rig.client,
      'wrk',
      ['-t1', '-c32', '-d1s', `http://${t.http.host}:${t.http.port}/`],
      20_000,
    );
  }
  options.log('  warm-up: 1 s of wrk against every target');
}

export const MEASURES: readonly Measure[] = [
  iperf(1),
  iperf(8),
  wrk(false),
  wrk(true),
  dns,
  connMemory,
  scale,
];

/** Per target, the median of each value over the samples without errors (with them when all failed). */
export function medians(result: MeasureResult): Map<TargetName, Record<string, number>> {
  const out = new Map<TargetName, Record<string, number>>();
  const byTarget = new Map<TargetName, Sample[]>();
  for (const s of result.samples) byTarget.set(s.target, [...(byTarget.get(s.target) ?? []), s]);
  for (const [target, all] of byTarget) {
    const good = all.filter((s) => !s.error);
    const use = good.length > 0 ? good : all;
    const keys = new Set(use.flatMap((s) => Object.keys(s.values)));
    const m: Record<string, number> = {};
    for (const k of keys)
      m[k] = median(use.map((s) => s.values[k]).filter((v): v is number => v !== undefined));
    const cpus = use.map((s) => s.cpu).filter((v): v is number => v !== undefined);
    if (cpus.length > 0) m['cpu'] = median(cpus);
    out.set(target, m);
  }
  return out;
}
