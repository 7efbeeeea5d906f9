// The measures of the namespace benchmark. Traffic measures run alternately against every target
// (the order rotates each round) and keep every sample; memory and scale measures drive the proxy CLI
// and the peers directly. Each measure returns samples; medians and ratios are the report's job.
import { setTimeout as sleep } from 'node:timers/promises';
import { scaleIP, scaleService, scaleSlice } from './apiserver-agent.ts';
import { type ClientSnapshot, readCounters, snapshot, timeWaitShare } from './client-sockets.ts';
import { NET } from './configs.ts';
import { cpuOf, cpuSnapshot, machineJiffies, otherTicks, rssOf } from './processes.ts';
import { PROXY_BIN, type ProxyTargetName, type Rig, type Target, type TargetName } from './rig.ts';
import { median, parseDnsperf, parseIperf3, parseWrk } from './tools.ts';

const CLK_TCK = 100;

export type Options = {
  rounds: number;
  /** Seconds per traffic sample. */
  seconds: number;
  /** Seconds of the sustained `Connection: close` sample (http-close-60s), and its rounds. */
  sustainedSeconds: number;
  sustainedRounds: number;
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
 * `otherCpu`: what processes outside the benchmark used meanwhile (% of one core), i.e. noise;
 * `machineCpu`: every CPU's busy time meanwhile (the client, the backends, the middle and the kernel's
 * softirqs wherever they ran), % of one core. A measure with a rate (`rps`, `qps`) also gets `machineUs`, the
 * machine's CPU a request or connection in µs: what the whole path costs, apart from how fast it went.
 */
export type Sample = {
  target: TargetName;
  round: number;
  values: Record<string, number>;
  cpu?: number;
  otherCpu?: number;
  machineCpu?: number;
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

/**
 * The part of a sample the CPU figures cover: all of it unless the sample calls `open()` and `close()`
 * around its load (snapshots taken before and after stay out).
 */
export type CpuWindow = { open(): void; close(): void };

async function alternate<T extends { readonly name: TargetName; pids(): number[] }>(
  rig: Rig,
  options: Options,
  targets: readonly T[],
  label: string,
  one: (t: T, window: CpuWindow) => Promise<{ values: Record<string, number>; error?: string }>,
): Promise<Sample[]> {
  const samples: Sample[] = [];
  for (let round = 0; round < options.rounds; round++) {
    for (const t of rotate(targets, round)) {
      const pids = t.pids();
      const ours = rig.ourPids();
      const mark = () => ({
        other: cpuSnapshot(ours),
        cpu: cpuOf(pids),
        machine: machineJiffies().busy,
        t: performance.now(),
      });
      let from = mark();
      let to: ReturnType<typeof mark> | undefined;
      const window: CpuWindow = {
        open: () => {
          from = mark();
        },
        close: () => {
          to = mark();
        },
      };
      let r: { values: Record<string, number>; error?: string };
      try {
        r = await one(t, window);
      } catch (err) {
        r = { values: {}, error: (err as Error).message };
      }
      to ??= mark();
      const secs = (to.t - from.t) / 1000;
      const sample: Sample = { target: t.name, round, values: r.values };
      if (pids.length > 0) sample.cpu = ((to.cpu - from.cpu) / CLK_TCK / secs) * 100;
      sample.otherCpu = (otherTicks(from.other, to.other) / CLK_TCK / secs) * 100;
      sample.machineCpu = ((to.machine - from.machine) / CLK_TCK / secs) * 100;
      const rate = r.values['rps'] ?? r.values['qps'];
      if (rate !== undefined && rate > 0) r.values['machineUs'] = (sample.machineCpu / 100) * (1e6 / rate);
      if (r.error) sample.error = r.error;
      samples.push(sample);
      const shown = Object.entries(r.values)
        .map(([k, v]) => `${k}=${Math.abs(v) >= 100 ? Math.round(v) : v.toFixed(3)}`)
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

/** The client pod's sockets closed by it first, and its counters (see client-sockets.ts). */
function clientNow(rig: Rig): Promise<ClientSnapshot> {
  return snapshot((cmd, args) => rig.runIn(rig.client, cmd, args, 30_000), rig.clientProbe.pid);
}

/** After the load: its last connections finish closing (the FIN of the side that closes second). */
const CLOSE_SETTLE_MS = 500;

/**
 * The share of the connections made since `before` that the client closed first (TIME_WAIT in the
 * client pod), towards `t`'s HTTP address; `twLeft` is what `ss` alone sees towards it.
 */
async function timeWaitValues(rig: Rig, before: ClientSnapshot, t: Target): Promise<Record<string, number>> {
  await sleep(CLOSE_SETTLE_MS);
  const tw = timeWaitShare(before, await clientNow(rig), `${t.http.host}:${t.http.port}`);
  return {
    twShare: tw.share,
    connections: tw.connections,
    timeWaits: tw.timeWaits,
    twReused: tw.reused,
    twLeft: tw.leftTowardsDst,
    twAtStart: [...before.closing.values()].reduce((a, b) => a + b, 0),
  };
}

const TIME_WAIT_NOTE =
  "TIME_WAIT share: of the connections the client pod opened during the run (its namespace's Tcp ActiveOpens), those it closed first, i.e. that entered TIME_WAIT (TcpExt TW + TWKilled, which the kernel counts when a TIME_WAIT starts, + TCPTimeWaitOverflow), read 0.5 s after the load ends; per namespace, so the previous target's TIME_WAITs do not count. Cross-check in the JSON: twLeft, the `ss -tan state time-wait` (and FIN-WAIT/CLOSING) count towards the target's own address:port after minus before, is lower by twReused (TIME_WAITs taken over by new connections, tcp_tw_reuse is on in the rig) and, near 60 s, by those already ended";

function wrkArgs(t: Target, seconds: number, close: boolean): string[] {
  const args = ['-t1', '-c32', `-d${seconds}s`, '--latency'];
  if (close) args.push('-H', 'Connection: close');
  args.push(`http://${t.http.host}:${t.http.port}/`);
  return args;
}

function wrkValues(stdout: string): { values: Record<string, number>; error?: string } {
  const r = parseWrk(stdout);
  const error =
    r.error ?? (r.errors > 0 ? `${r.errors} socket errors or non-2xx of ${r.requests}` : undefined);
  return { values: { rps: r.rps, p50: r.p50, p99: r.p99, errors: r.errors }, ...(error ? { error } : {}) };
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
      const samples = await alternate(rig, options, rig.targets(), name, async (t, window) => {
        const before = close ? await clientNow(rig) : undefined;
        window.open();
        const args = wrkArgs(t, options.seconds, close);
        const run = await rig.runIn(rig.client, 'wrk', args, (options.seconds + 20) * 1000);
        window.close();
        const r = wrkValues(run.stdout);
        if (before) Object.assign(r.values, await timeWaitValues(rig, before, t));
        return r;
      });
      return {
        name,
        title,
        fields: {
          rps: close ? 'connections/s' : 'requests/s',
          p50: 'p50 ms',
          p99: 'p99 ms',
          errors: 'errors',
          ...(close ? { twShare: '% of connections leaving a TIME_WAIT in the client' } : {}),
        },
        samples,
        notes: [
          'wrk -t1 -c32 --latency against nginx `return 200` backends (2 backends through the proxies, backend 1 for direct)',
          ...(close ? [TIME_WAIT_NOTE] : []),
        ],
      };
    },
  };
}

/** Length of the intervals of the sustained measure's rates. */
const RATE_INTERVAL_S = 10;

/** The value key of the sustained measure's rate from `from` to `to` seconds ("r0_10"). */
export function rateKey(from: number, to: number): string {
  return `r${from}_${to}`;
}

/**
 * `Connection: close` for a whole minute (or --sustained S): new connections/s per 10 s, so a decline
 * (the client's ports filling with TIME_WAITs) shows, and the share of connections left in TIME_WAIT.
 * The rates come from the client namespace's Tcp ActiveOpens, read every 10 s while one wrk runs.
 */
const httpCloseSustained: Measure = {
  name: 'http-close-60s',
  title: 'Connection: close, sustained (per-10 s rates)',
  kind: 'traffic',
  async run(rig, options) {
    const secs = options.sustainedSeconds;
    const opens = () => readCounters(rig.clientProbe.pid).activeOpens;
    const o = { ...options, rounds: options.sustainedRounds };
    const samples = await alternate(rig, o, rig.targets(), 'http-close-60s', async (t, window) => {
      const before = await clientNow(rig);
      window.open();
      const t0 = performance.now();
      const marks = [{ s: 0, n: opens() }];
      let finished = false;
      const load = rig.runIn(rig.client, 'wrk', wrkArgs(t, secs, true), (secs + 30) * 1000).finally(() => {
        finished = true;
      });
      for (let k = 1; k * RATE_INTERVAL_S < secs && !finished; k++) {
        const wait = t0 + k * RATE_INTERVAL_S * 1000 - performance.now();
        await Promise.race([sleep(Math.max(0, wait)), load.catch(() => {})]);
        if (!finished) marks.push({ s: (performance.now() - t0) / 1000, n: opens() });
      }
      const run = await load;
      marks.push({ s: (performance.now() - t0) / 1000, n: opens() });
      window.close();
      const r = wrkValues(run.stdout);
      const rates: number[] = [];
      for (let i = 1; i < marks.length; i++) {
        const rate = (marks[i]!.n - marks[i - 1]!.n) / (marks[i]!.s - marks[i - 1]!.s);
        rates.push(rate);
        r.values[rateKey((i - 1) * RATE_INTERVAL_S, Math.min(i * RATE_INTERVAL_S, secs))] = rate;
      }
      r.values['lastOverFirst'] = rates.length > 1 ? rates[rates.length - 1]! / rates[0]! : Number.NaN;
      Object.assign(r.values, await timeWaitValues(rig, before, t));
      return r;
    });
    const intervals: Record<string, string> = {};
    for (let from = 0; from < secs; from += RATE_INTERVAL_S) {
      const to = Math.min(from + RATE_INTERVAL_S, secs);
      intervals[rateKey(from, to)] = `connections/s ${from}–${to} s`;
    }
    return {
      name: 'http-close-60s',
      title: `Connection: close sustained for ${secs} s, 32 connections: connections/s per ${RATE_INTERVAL_S} s`,
      fields: {
        rps: 'connections/s',
        p50: 'p50 ms',
        p99: 'p99 ms',
        errors: 'errors',
        twShare: '% of connections leaving a TIME_WAIT in the client',
        lastOverFirst: 'last / first interval',
        ...intervals,
      },
      samples,
      notes: [
        `one wrk -t1 -c32 -H "Connection: close" run of ${secs} s per target (${options.sustainedRounds} round(s), targets alternated); the rate of each ${RATE_INTERVAL_S} s is the client namespace's Tcp ActiveOpens read every ${RATE_INTERVAL_S} s; no wait between targets (TIME_WAITs of the previous target, twAtStart, are still there: they hold ports towards another address, which new connections may share)`,
        TIME_WAIT_NOTE,
      ],
    };
  },
};

const dns: Measure = {
  name: 'dns',
  title: 'DNS over UDP (dnsperf -c 8 -q 32 against dnsmasq)',
  kind: 'traffic',
  async run(rig, options) {
    const queries = await rig.writeManifest('queries.txt', 'bench.test A\n');
    const samples = await alternate(rig, options, rig.dnsTargets(), 'dns', async (t) => {
      const args = ['-s', t.dns.host, '-p', String(t.dns.port), '-d', queries, '-l', String(options.seconds)];
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
        'nginx stream twice: `nginx` with proxy_responses 1 (a session per query), `nginx-sessions` keeping UDP sessions (no proxy_responses, proxy_timeout 1s); same process, worker_processes = cores, reuseport; the proxy is compared with the stronger of the two',
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
    // proxy-listener is the traced proxy's process again (and its ports change with each restart).
    const targets = rig.targets().filter((t) => t.name !== 'direct' && t.name !== 'proxy-listener');
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
        'RSS of the proxying processes (nginx: master + workers; this proxy: the main process + its workers) with the connections open minus before, divided by the open connections; freshly started processes each round; for this proxy, RSS is read after a full garbage collection of every process (inspector, HeapProfiler.collectGarbage; a worker opens its inspector on a free port) both times',
      ],
    };
  },
};

type Answered = { ok: boolean; t: number; tries?: number; error?: string };
type Written = { ok: boolean; t: number; watches?: number; error?: string };

/** Starts with one service port whose RSS the scale measure's baseline is the median of. */
const BASELINE_STARTS = 3;

const scale: Measure = {
  name: 'scale',
  title: 'scale: service ports, cold start, one change',
  kind: 'scale',
  async run(rig, options) {
    const n = options.services;
    const [b1, b2] = NET.backends;
    const samples: Sample[] = [];
    const notes: string[] = [];
    const common = ['--proxy-port-range', '20000-30999'];
    const cleanup = async () => {
      const r = await rig.runIn(rig.node, process.execPath, [PROXY_BIN, '--cleanup'], 60_000);
      if (r.code !== 0) options.log(`  ! --cleanup exited with ${r.code}: ${r.stderr.slice(0, 300)}`);
    };
    // The default workers, and with --workers-compare also `proxy-w1` (what each extra worker adds).
    const w1 = rig.proxyArgsOf('proxy-w1');
    const variants: [ProxyTargetName, string[]][] = [['proxy', common]];
    if (w1 !== undefined) variants.push(['proxy-w1', [...common, ...w1]]);
    let target: ProxyTargetName = 'proxy';
    const push = (values: Record<string, number>, round: number, error?: string) => {
      const s: Sample = { target, round, values };
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
      for (const [variant, args] of variants) {
        target = variant;
        // The baseline: the same process with one service port, fed the same way; the median of
        // BASELINE_STARTS starts (one start's RSS moves by ±3 MB, ±0.3 KiB a port at 10,000).
        const bases: number[] = [];
        for (let b = 0; b < BASELINE_STARTS; b++) {
          await cleanup();
          await load(1);
          const base = await rig.startProxy('scale', rig.node, master, args, 1);
          await sleep(1000);
          await rig.collectGarbage('scale');
          bases.push(rssOf(base.daemon.pids()));
          await base.daemon.stop();
        }
        const rssBase = [...bases].sort((x, y) => x - y)[bases.length >> 1]!;
        options.log(
          `  scale ${target}: RSS with 1 service port ${rssBase} KiB (median of ${bases.join(', ')}; API stand-in, list+watch)`,
        );

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
          const cpuSecs = cpuOf(started.daemon.pids()) / CLK_TCK;
          await sleep(1000);
          const heap = await rig.collectGarbage('scale');
          const rss = rssOf(started.daemon.pids());
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
            `  scale ${target} round ${round + 1}: ${n} listed after ${listed.toFixed(2)} s, last ClusterIP answered after ${answered.toFixed(2)} s, RSS ${rss} KiB (${(((rss - rssBase) * 1024) / n / 1024).toFixed(2)} KiB per service port), CPU ${cpuSecs.toFixed(1)} s`,
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
                `  scale ${target}: service ${i} added, served after ${ms} ms (${r.tries} tries; the proxy's sync took ${syncMs.toFixed(0)} ms, ${syncs} sync(s))${w.error ? ` ! ${w.error}` : ''}`,
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
                `  scale ${target}: endpoint of svc-1 → ${name}, in effect after ${ms} ms (${r.tries} tries; applied by the proxy ${applied.toFixed(0)} ms after its trigger time, ${after.syncs - before.syncs} sync(s))${w.error ? ` ! ${w.error}` : ''}`,
              );
            }
          }
          await started.daemon.stop();
        }
      }
      await cleanup();
    } finally {
      await rig.stopApiServer();
    }
    notes.push(
      `${n} Services with one TCP port each and 5 endpoints each (${n * 5} endpoints: both pods at each of their addresses), served by the Kubernetes API stand-in (test/helpers/fake-apiserver.ts) on the node namespace's 127.0.0.1; the CLI runs with --master http://127.0.0.1:PORT (no kubeconfig) and lists (pages of 500) then watches Services, EndpointSlices and its Node; --proxy-port-range 20000-30999; other flags default (--iptables-min-sync-period 1s)`,
      'cold start: from spawning the CLI until /debug/services lists every port (polled every 250 ms) and until the client pod gets an answer from the last ClusterIP (a try every 20 ms, up to 15 overlapping, each ≤ 300 ms)',
      `per service port: RSS of the CLI (main process and its workers) with all ports open minus the same with one port (the median of ${BASELINE_STARTS} starts), fed the same way, divided by the ports; both read after a full garbage collection of every process (inspector; a worker opens its own on a free port)`,
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
  httpCloseSustained,
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
    const machine = use.map((s) => s.machineCpu).filter((v): v is number => v !== undefined);
    if (machine.length > 0) m['machineCpu'] = median(machine);
    out.set(target, m);
  }
  return out;
}
