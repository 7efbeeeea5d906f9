// The benchmark's results as a person reads them: the machine, every measure's median per target, the
// ratios the performance goals are about, and what looked wrong (errors, spread between rounds).
// Pure apart from `describeMachine`, which asks the tools for their versions.
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { cpus, hostname, release, totalmem } from 'node:os';
import { join } from 'node:path';
import { VERSION } from '../src/lib/version.ts';
import { type MeasureResult, medians, type Sample } from './measures.ts';
import type { TargetName, TraceLayout } from './rig.ts';
import { median, versionOf } from './tools.ts';

export type Machine = {
  host: string;
  cores: number;
  cpu: string;
  memoryGiB: number;
  kernel: string;
  node: string;
  proxy: string;
  tools: Record<string, string>;
};

export type Results = {
  date: string;
  machine: Machine;
  options: {
    rounds: number;
    seconds: number;
    quick: boolean;
    only: string[];
    /** Where the traced and untraced proxies ran (absent: normal). */
    layout?: TraceLayout;
    /** Length and rounds of the sustained Connection: close measure (absent in older results). */
    sustainedSeconds?: number;
    sustainedRounds?: number;
  };
  measures: MeasureResult[];
  proxies: { name: string; crashed: boolean; warnings: number; sample: string[] }[];
  /** CPU use of the whole machine (% of all cores) in the 2 s before the run, and its top processes. */
  busyBefore: { percent: number; top: string[] };
  notes: string[];
  durationSeconds: number;
};

function toolVersion(cmd: string, args: string[]): string {
  const r = spawnSync(cmd, args, { encoding: 'utf8' });
  if (r.error) return 'missing';
  const text = `${r.stdout ?? ''}${r.stderr ?? ''}`;
  const m = /Version\s+(\d[\w.+~-]*)/.exec(text);
  return m ? m[1]! : versionOf(text);
}

/**
 * A short hash of the proxy's source as it is on disk (src/, bin/): a commit marked -dirty says little,
 * and others may change the tree while a benchmark runs.
 */
export function sourceHash(): string {
  const root = new URL('..', import.meta.url).pathname;
  const hash = createHash('sha256');
  const walk = (dir: string) => {
    for (const e of readdirSync(join(root, dir), { withFileTypes: true }).sort((a, b) =>
      a.name.localeCompare(b.name),
    )) {
      const rel = join(dir, e.name);
      if (e.isDirectory()) walk(rel);
      else hash.update(rel).update(readFileSync(join(root, rel)));
    }
  };
  walk('src');
  walk('bin');
  return hash.digest('hex').slice(0, 12);
}

/** Cores, CPU model, kernel, Node, the proxy's version and commit, and every tool's version. */
export function describeMachine(): Machine {
  const git = spawnSync('git', ['describe', '--always', '--dirty'], {
    encoding: 'utf8',
    cwd: new URL('..', import.meta.url).pathname,
  });
  const commit = git.status === 0 ? git.stdout.trim() : 'unknown';
  return {
    host: hostname(),
    cores: cpus().length,
    cpu: cpus()[0]?.model ?? 'unknown',
    memoryGiB: Math.round(totalmem() / 2 ** 30),
    kernel: release(),
    node: process.version,
    proxy: `${VERSION} (${commit}, source ${sourceHash()})`,
    tools: {
      iperf3: toolVersion('iperf3', ['--version']),
      wrk: toolVersion('wrk', ['-v']),
      dnsperf: toolVersion('dnsperf', ['-h']),
      haproxy: toolVersion('haproxy', ['-v']),
      nginx: toolVersion('nginx', ['-v']),
      dnsmasq: toolVersion('dnsmasq', ['-v']),
      iptables: `${toolVersion('iptables', ['--version'])}${/nf_tables/.test(spawnSync('iptables', ['--version'], { encoding: 'utf8' }).stdout ?? '') ? ' (nf_tables)' : ' (legacy)'}`,
    },
  };
}

/** Every target's column; `proxy-listener`, `proxy-w1` and `nginx-sessions` only show when the run measured them. */
const COLUMNS: readonly { target: TargetName; label: string }[] = [
  { target: 'direct', label: 'direct' },
  { target: 'proxy', label: 'proxy' },
  { target: 'proxy-listener', label: 'proxy at its listeners (no REDIRECT)' },
  { target: 'proxy-notrace', label: 'proxy --trace=none' },
  { target: 'proxy-w1', label: 'proxy --workers 1' },
  { target: 'haproxy', label: 'HAProxy' },
  { target: 'nginx', label: 'nginx stream' },
  { target: 'nginx-sessions', label: 'nginx stream, UDP sessions kept' },
];
const OPTIONAL_COLUMNS: ReadonlySet<TargetName> = new Set(['proxy-listener', 'proxy-w1', 'nginx-sessions']);

/** A table's header and alignment rows: a `measure` column, then one right-aligned column a label. */
function tableHead(labels: readonly string[]): [string, string] {
  return [`| measure | ${labels.join(' | ')} |`, `|---|${labels.map(() => '---:').join('|')}|`];
}

function labelOf(target: TargetName): string {
  return COLUMNS.find((c) => c.target === target)?.label ?? target;
}

function fmt(v: number | undefined, digits = 2): string {
  if (v === undefined || Number.isNaN(v)) return '–';
  if (Math.abs(v) >= 1000) return Math.round(v).toLocaleString('en');
  if (Math.abs(v) >= 100) return v.toFixed(0);
  return v.toFixed(digits);
}

/** Rows of the traffic table: measure, value key, label, digits. */
const TRAFFIC_ROWS: readonly { measure: string; key: string; label: string; digits?: number }[] = [
  { measure: 'tcp-1', key: 'gbps', label: '1 TCP stream, Gbit/s' },
  { measure: 'tcp-8', key: 'gbps', label: '8 TCP streams, Gbit/s' },
  { measure: 'http-keepalive', key: 'rps', label: 'keep-alive, 32 conns: requests/s' },
  { measure: 'http-keepalive', key: 'p50', label: 'keep-alive: p50 ms', digits: 3 },
  { measure: 'http-keepalive', key: 'p99', label: 'keep-alive: p99 ms', digits: 3 },
  { measure: 'http-close', key: 'rps', label: 'Connection: close, 32 conns: connections/s' },
  { measure: 'http-close', key: 'p50', label: 'Connection: close: p50 ms', digits: 3 },
  { measure: 'http-close', key: 'p99', label: 'Connection: close: p99 ms', digits: 3 },
  {
    measure: 'http-close',
    key: 'twShare',
    label: 'Connection: close: % of connections leaving a TIME_WAIT in the client',
    digits: 1,
  },
  { measure: 'http-close-60s', key: 'rps', label: 'Connection: close sustained: connections/s' },
  { measure: 'http-close-60s', key: 'p99', label: 'Connection: close sustained: p99 ms', digits: 3 },
  {
    measure: 'http-close-60s',
    key: 'twShare',
    label: 'Connection: close sustained: % leaving a TIME_WAIT in the client',
    digits: 1,
  },
  { measure: 'dns', key: 'qps', label: 'DNS over UDP: queries/s' },
  { measure: 'dns', key: 'avg', label: 'DNS over UDP: avg latency ms', digits: 3 },
  { measure: 'conn-memory', key: 'bytesPerConnection', label: 'RSS per idle proxied connection, KiB' },
];

/** The machine's CPU a request, connection or query (measures with a rate). */
const MACHINE_ROWS: readonly { measure: string; label: string }[] = [
  { measure: 'http-keepalive', label: 'keep-alive, a request' },
  { measure: 'http-close', label: 'Connection: close, a connection' },
  { measure: 'http-close-60s', label: 'Connection: close sustained, a connection' },
  { measure: 'dns', label: 'DNS, a query' },
];

const CPU_ROWS: readonly { measure: string; label: string }[] = [
  { measure: 'tcp-1', label: '1 TCP stream' },
  { measure: 'tcp-8', label: '8 TCP streams' },
  { measure: 'http-keepalive', label: 'keep-alive' },
  { measure: 'http-close', label: 'Connection: close' },
  { measure: 'http-close-60s', label: 'Connection: close sustained' },
  { measure: 'dns', label: 'DNS' },
];

/**
 * Ratios: row, measure, key; `lower`: lower is better (latency, memory, TIME_WAITs); `notTo`: columns
 * left empty (a direct connection's client closes next to nothing first: no ratio says anything).
 */
const RATIO_ROWS: readonly {
  measure: string;
  key: string;
  label: string;
  lower?: boolean;
  notTo?: readonly TargetName[];
}[] = [
  { measure: 'tcp-1', key: 'gbps', label: '1 TCP stream throughput' },
  { measure: 'tcp-8', key: 'gbps', label: '8 TCP streams throughput' },
  { measure: 'http-keepalive', key: 'rps', label: 'keep-alive requests/s' },
  { measure: 'http-keepalive', key: 'p99', label: 'keep-alive p99 latency (lower is better)', lower: true },
  { measure: 'http-close', key: 'rps', label: 'new connections/s' },
  { measure: 'http-close', key: 'p99', label: 'new connection p99 latency (lower is better)', lower: true },
  {
    measure: 'http-keepalive',
    key: 'machineUs',
    label: "keep-alive: the machine's CPU a request (lower is better)",
    lower: true,
  },
  {
    measure: 'http-close',
    key: 'machineUs',
    label: "new connections: the machine's CPU a connection (lower is better)",
    lower: true,
  },
  {
    measure: 'http-close',
    key: 'twShare',
    label: 'share of connections the client closes first (lower is better)',
    lower: true,
    notTo: ['direct'],
  },
  { measure: 'http-close-60s', key: 'rps', label: 'new connections/s, sustained' },
  { measure: 'http-close-60s', key: 'lastOverFirst', label: 'sustained: last 10 s / first 10 s' },
  {
    measure: 'http-close-60s',
    key: 'twShare',
    label: 'sustained: share the client closes first (lower is better)',
    lower: true,
    notTo: ['direct'],
  },
  { measure: 'dns', key: 'qps', label: 'DNS queries/s over UDP' },
  {
    measure: 'conn-memory',
    key: 'bytesPerConnection',
    label: 'RSS per idle connection (lower is better)',
    lower: true,
  },
];

/**
 * `to` may have `or`: other configurations of the same peer; per row the stronger of them that has a
 * value is taken (nginx stream's two UDP configurations for DNS), and the cell names it.
 */
type RatioColumn = { of: TargetName; to: TargetName; or?: readonly TargetName[]; label: string };
const RATIO_COLUMNS: readonly RatioColumn[] = [
  { of: 'proxy', to: 'haproxy', label: 'proxy / HAProxy' },
  { of: 'proxy', to: 'nginx', or: ['nginx-sessions'], label: 'proxy / nginx' },
  { of: 'proxy', to: 'direct', label: 'proxy / direct' },
  { of: 'proxy', to: 'proxy-notrace', label: 'tracing: protocols / none' },
  { of: 'proxy-w1', to: 'haproxy', label: 'proxy --workers 1 / HAProxy' },
  { of: 'proxy', to: 'proxy-w1', label: 'proxy default workers / --workers 1' },
  { of: 'proxy-listener', to: 'haproxy', label: 'proxy at its listeners (no REDIRECT) / HAProxy' },
  { of: 'proxy', to: 'proxy-listener', label: 'REDIRECT: through the ClusterIP / at the listeners' },
];

/**
 * Of `candidates`, the one with the best median of `key` (highest, or lowest when `lower`); undefined
 * when none has a value.
 */
export function strongerPeer(
  value: (target: TargetName) => number | undefined,
  candidates: readonly TargetName[],
  lower = false,
): TargetName | undefined {
  let best: TargetName | undefined;
  let bestValue = Number.NaN;
  for (const c of candidates) {
    const v = value(c);
    if (v === undefined || Number.isNaN(v)) continue;
    if (best === undefined || (lower ? v < bestValue : v > bestValue)) {
      best = c;
      bestValue = v;
    }
  }
  return best;
}

/** Per-round ratios of one value between two targets (rounds where both have a sample without error). */
export function roundRatios(
  samples: readonly Sample[],
  key: string,
  of: TargetName,
  to: TargetName,
): number[] {
  const out: number[] = [];
  const rounds = new Set(samples.map((s) => s.round));
  for (const r of rounds) {
    const a = samples.find((s) => s.round === r && s.target === of && !s.error)?.values[key];
    const b = samples.find((s) => s.round === r && s.target === to && !s.error)?.values[key];
    if (a !== undefined && b !== undefined && b !== 0 && !Number.isNaN(a) && !Number.isNaN(b))
      out.push(a / b);
  }
  return out;
}

/** Coefficient of variation (stdev / mean) of a value over the rounds. */
function spread(xs: readonly number[]): number {
  const v = xs.filter((x) => !Number.isNaN(x));
  if (v.length < 2) return 0;
  const mean = v.reduce((a, b) => a + b, 0) / v.length;
  const sd = Math.sqrt(v.reduce((a, b) => a + (b - mean) ** 2, 0) / (v.length - 1));
  return mean === 0 ? 0 : sd / mean;
}

function otherSummary(res: Results): string {
  const xs = res.measures
    .flatMap((x) => x.samples.map((s) => s.otherCpu))
    .filter((v): v is number => v !== undefined);
  if (xs.length === 0) return '(not measured)';
  return `${median(xs).toFixed(0)} % and ${Math.max(...xs).toFixed(0)} %`;
}

/** The markdown report. */
export function renderMarkdown(res: Results): string {
  const m = res.machine;
  const byName = new Map(res.measures.map((x) => [x.name, x]));
  const med = new Map(res.measures.map((x) => [x.name, medians(x)]));
  const value = (measure: string, target: TargetName, key: string) => med.get(measure)?.get(target)?.[key];
  const layout = res.options.layout ?? 'normal';
  const control = layout === 'control';
  const measured = new Set(res.measures.flatMap((x) => x.samples.map((s) => s.target)));
  const shown = (t: TargetName) => !OPTIONAL_COLUMNS.has(t) || measured.has(t);
  // An A/A control run: `proxy` ran with --trace=none too.
  const cols = (
    control
      ? COLUMNS.map((c) => (c.target === 'proxy' ? { ...c, label: 'proxy (--trace=none, control)' } : c))
      : COLUMNS
  ).filter((c) => shown(c.target));
  const ratioCols = (
    control
      ? RATIO_COLUMNS.map((c) =>
          c.to === 'proxy-notrace' ? { ...c, label: 'A/A control: node / node2, both --trace=none' } : c,
        )
      : RATIO_COLUMNS
  ).filter((c) => shown(c.of) && shown(c.to));
  const out: string[] = [];
  out.push(`# kube-userspace-proxy benchmark, ${res.date}`, '');
  out.push(
    `Machine: ${m.cores} cores (${m.cpu}), ${m.memoryGiB} GiB, Linux ${m.kernel}, Node ${m.node}, host ${m.host}.`,
    `Proxy: kube-userspace-proxy ${m.proxy}, run from the compiled dist/ as installed. Tools: ${Object.entries(
      m.tools,
    )
      .map(([k, v]) => `${k} ${v}`)
      .join(', ')}.`,
    `Run: ${res.options.rounds} round(s) × ${res.options.seconds} s per sample${
      res.options.sustainedSeconds !== undefined && byName.has('http-close-60s')
        ? ` (sustained Connection: close: ${res.options.sustainedRounds} round(s) × ${res.options.sustainedSeconds} s)`
        : ''
    }${res.options.quick ? ' (--quick)' : ''}${
      res.options.only.length > 0 ? `, only ${res.options.only.join(', ')}` : ''
    }; every target measured once per round, the order rotated each round; medians of the rounds; ${Math.round(res.durationSeconds)} s in all.`,
    `Other work on the machine: ${res.busyBefore.percent.toFixed(0)} % of all cores busy before the run; during the samples, processes outside the benchmark used ${otherSummary(res)} of one core (median, max).`,
    '',
    'Everything runs on this one machine, in network namespaces made for the run: the load generator, the',
    'proxies and the backends share the same cores, so absolute numbers are low and the **ratios** are what',
    'carry over. Targets, all seen from a client pod: **direct** (backend pod IP), **proxy** (ClusterIP →',
    `iptables REDIRECT → this proxy, ${control ? '`--trace=none` for this A/A control run' : 'default `--trace=protocols`'}), **proxy --trace=none** (the same CLI on ${
      layout === 'swap'
        ? 'the node, the traced one on node2 in this run: `--trace-layout swap`'
        : 'a second node namespace'
    })${measured.has('proxy-listener') ? ", **proxy at its listeners** (the traced proxy reached at its node's address and the ports its rules `REDIRECT` to: the same processes without the NAT, to tell what the `REDIRECT` costs)" : ''}${measured.has('proxy-w1') ? ', **proxy --workers 1** (the traced proxy with `--workers 1`, on a third node namespace; **proxy** runs with the default workers)' : ''}, **HAProxy** (\`mode tcp\`, round robin, \`nbthread\` = cores) and **nginx stream**`,
    '(round robin, `worker_processes` = cores; UDP twice, `reuseport`: **nginx stream** with `proxy_responses 1`,',
    'a session per query, and **nginx stream, UDP sessions kept**: no `proxy_responses`, `proxy_timeout 1s`), both',
    'on the node IP. For DNS the proxy is compared with the stronger of the two nginx configurations.',
    '',
  );

  const hasTraffic = TRAFFIC_ROWS.some((r) => byName.has(r.measure));
  if (hasTraffic) {
    out.push('## Medians per target', '');
    out.push(...tableHead(cols.map((c) => c.label)));
    for (const row of TRAFFIC_ROWS) {
      if (!byName.has(row.measure)) continue;
      const cells = cols.map((c) => {
        const v = value(row.measure, c.target, row.key);
        return fmt(row.key === 'bytesPerConnection' && v !== undefined ? v / 1024 : v, row.digits ?? 2);
      });
      out.push(`| ${row.label} | ${cells.join(' | ')} |`);
    }
    out.push('');
    const cpuRows = CPU_ROWS.filter((r) => byName.has(r.measure));
    if (cpuRows.length > 0) {
      out.push('CPU of the process in the middle during the sample (% of one core; nginx: all workers):', '');
      const middles = cols.filter((c) => c.target !== 'direct');
      out.push(...tableHead(middles.map((c) => c.label)));
      for (const row of cpuRows) {
        const cells = middles.map((c) => fmt(value(row.measure, c.target, 'cpu'), 0));
        out.push(`| ${row.label} | ${cells.join(' | ')} |`);
      }
      out.push('');
    }
    const machineRows = MACHINE_ROWS.filter((r) =>
      cols.some((c) => value(r.measure, c.target, 'machineUs') !== undefined),
    );
    if (machineRows.length > 0) {
      out.push(
        "The machine's CPU a request, connection or query, µs (every CPU's busy time during the sample over its rate: the client, the backends, the middle and the kernel's softirqs wherever they ran; what the path costs, apart from how fast it went):",
        '',
      );
      out.push(...tableHead(cols.map((c) => c.label)));
      for (const row of machineRows) {
        const cells = cols.map((c) => fmt(value(row.measure, c.target, 'machineUs'), 1));
        out.push(`| ${row.label} | ${cells.join(' | ')} |`);
      }
      out.push('');
    }

    out.push('## Ratios', '');
    out.push(
      'Ratio of the medians; in brackets the lowest and highest ratio of single rounds. Where a peer runs in two configurations, the cell names the stronger one it was taken against.',
      '',
    );
    out.push(...tableHead(ratioCols.map((c) => c.label)));
    for (const row of RATIO_ROWS) {
      const res0 = byName.get(row.measure);
      if (!res0) continue;
      const cells = ratioCols.map((c) => {
        if (row.notTo?.includes(c.to)) return '–';
        const peers = [c.to, ...(c.or ?? [])];
        const to = strongerPeer((t) => value(row.measure, t, row.key), peers, row.lower) ?? c.to;
        const a = value(row.measure, c.of, row.key);
        const b = value(row.measure, to, row.key);
        if (a === undefined || b === undefined || Number.isNaN(a) || Number.isNaN(b) || b === 0) return '–';
        const rr = roundRatios(res0.samples, row.key, c.of, to);
        const range = rr.length > 1 ? ` (${Math.min(...rr).toFixed(2)}–${Math.max(...rr).toFixed(2)})` : '';
        const rivals = peers.filter((p) => value(row.measure, p, row.key) !== undefined);
        const against = rivals.length > 1 ? ` vs ${labelOf(to)}` : '';
        return `${(a / b).toFixed(2)}×${range}${against}`;
      });
      out.push(`| ${row.label} | ${cells.join(' | ')} |`);
    }
    out.push('');
    const dnsPeer = strongerPeer((t) => value('dns', t, 'qps'), ['nginx', 'nginx-sessions']);
    const dnsOther = dnsPeer === 'nginx' ? 'nginx-sessions' : 'nginx';
    if (dnsPeer !== undefined && value('dns', dnsOther, 'qps') !== undefined) {
      out.push(
        `DNS: the stronger nginx stream configuration in this run is **${labelOf(dnsPeer)}** (${fmt(value('dns', dnsPeer, 'qps'))} queries/s against ${fmt(value('dns', dnsOther, 'qps'))} for ${labelOf(dnsOther)}); the proxy's DNS ratio is taken against it.`,
        '',
      );
    }
  }

  const sustained = byName.get('http-close-60s');
  if (sustained) out.push(...sustainedSection(sustained, cols, value));

  const sc = byName.get('scale');
  if (sc) {
    // One column per proxy target measured (the default workers, and `--workers 1` with --workers-compare).
    const targets = (['proxy', 'proxy-w1'] as const).filter((t) => med.get('scale')?.has(t));
    const label = (t: string) => (t === 'proxy' ? 'proxy (default workers)' : 'proxy --workers 1');
    out.push(`## ${sc.title}`, '');
    out.push(
      `| measure | ${targets.map(label).join(' | ')} | every sample (${targets.join('; ')}) |`,
      `|---|${targets.map(() => '---:|').join('')}---|`,
    );
    // [label, key, unit]: a sample's value is divided by the unit (bytes and KiB read better larger).
    const rows: [string, string, number][] = [
      ['cold start: /debug/services lists every port, s', 'listedSeconds', 1],
      ['cold start: the last ClusterIP answers, s', 'servedSeconds', 1],
      ['CPU time of the proxy during the cold start, s', 'startCpuSeconds', 1],
      ['RSS after the cold start (main process and workers), MiB', 'rssKiB', 1024],
      ['RSS per idle service port, KiB', 'bytesPerServicePort', 1024],
      ['one service added: served after, ms', 'serviceAddedMs', 1],
      ['one endpoint change: in effect after, ms', 'endpointChangedMs', 1],
    ];
    for (const [name, key, unit] of rows) {
      const medians = targets.map((t) => fmt((med.get('scale')?.get(t)?.[key] ?? Number.NaN) / unit));
      const samples = targets
        .map((t) =>
          sc.samples
            .filter((s) => s.target === t)
            .map((s) => s.values[key])
            .filter((x): x is number => x !== undefined)
            .map((x) => fmt(x / unit))
            .join(', '),
        )
        .join('; ');
      out.push(`| ${name} | ${medians.join(' | ')} | ${samples} |`);
    }
    out.push('');
  }

  out.push('## How each measure was taken', '');
  for (const x of res.measures) for (const n of x.notes) out.push(`- ${x.name}: ${n}`);
  out.push('');

  const problems = findProblems(res);
  out.push('## What looked wrong', '');
  if (problems.length === 0)
    out.push('- nothing: no errors, no lost queries, every round within 10 % of its median.');
  for (const p of problems) out.push(`- ${p}`);
  for (const n of res.notes) out.push(`- ${n}`);
  out.push('');
  return out.join('\n');
}

/**
 * The sustained Connection: close measure, one row per target: the rate of every interval, the last over
 * the first, the share of connections left in TIME_WAIT in the client and how many were there at the start.
 */
function sustainedSection(
  x: MeasureResult,
  cols: readonly { target: TargetName; label: string }[],
  value: (measure: string, target: TargetName, key: string) => number | undefined,
): string[] {
  const intervals = Object.entries(x.fields).filter(([k]) => /^r\d+_\d+$/.test(k));
  const rows = cols.filter((c) => x.samples.some((s) => s.target === c.target));
  const out = [`## ${x.title}`, ''];
  out.push(
    `| target | ${intervals.map(([k]) => `${k.slice(1).replace('_', '–')} s`).join(' | ')} | last / first | % leaving a TIME_WAIT | TIME_WAITs in the client at the start |`,
  );
  out.push(`|---|${intervals.map(() => '---:').join('|')}|---:|---:|---:|`);
  for (const c of rows) {
    const v = (key: string, digits = 2) => fmt(value(x.name, c.target, key), digits);
    out.push(
      `| ${c.label} | ${intervals.map(([k]) => v(k)).join(' | ')} | ${v('lastOverFirst')} | ${v('twShare', 1)} | ${v('twAtStart', 0)} |`,
    );
  }
  out.push('', 'Connections/s per interval (medians of the rounds).', '');
  return out;
}

/** % of one core that processes outside the benchmark may use during a sample before it is flagged. */
const OTHER_CPU_LIMIT = 20;

/** Errors of samples, proxies that logged warnings or died, and values that vary a lot between rounds. */
export function findProblems(res: Results): string[] {
  const out: string[] = [];
  for (const x of res.measures) {
    for (const s of x.samples)
      if (s.error) out.push(`${x.name} round ${s.round + 1}, ${s.target}: ${s.error.slice(0, 300)}`);
    if (x.name === 'scale' || x.name === 'conn-memory') continue;
    const targets = new Set(x.samples.map((s) => s.target));
    const mainKey = Object.keys(x.fields)[0]!;
    for (const t of targets) {
      const xs = x.samples
        .filter((s) => s.target === t && !s.error)
        .map((s) => s.values[mainKey] ?? Number.NaN);
      const cv = spread(xs);
      if (cv > 0.1)
        out.push(
          `${x.name}, ${t}: ${mainKey} varies ${(cv * 100).toFixed(0)} % between rounds (${xs.map((v) => fmt(v)).join(', ')}; median ${fmt(median(xs))})`,
        );
    }
  }
  if (res.busyBefore.percent > 10)
    out.push(
      `the machine was ${res.busyBefore.percent.toFixed(0)} % busy before the run (${res.busyBefore.top.join(', ')}): other work shares the cores`,
    );
  const other = res.measures.flatMap((x) =>
    x.samples
      .filter((s) => (s.otherCpu ?? 0) > OTHER_CPU_LIMIT)
      .map((s) => `${x.name}/${s.target}/${s.round + 1}`),
  );
  const all = res.measures.flatMap((x) => x.samples.filter((s) => s.otherCpu !== undefined));
  if (other.length > 0)
    out.push(
      `${other.length} of ${all.length} samples ran while processes outside the benchmark used more than ${OTHER_CPU_LIMIT} % of a core (${other.slice(0, 8).join(', ')}${other.length > 8 ? ', …' : ''}): their numbers are lower than the machine can do; rerun on a quiet machine`,
    );
  for (const p of res.proxies) {
    if (p.warnings > 0)
      out.push(
        `${p.name} logged ${p.warnings} warning/error line(s), e.g. ${p.sample.slice(0, 2).join(' | ').slice(0, 400)}`,
      );
    if (p.crashed) out.push(`${p.name} exited on its own during the run (see the log lines in the JSON)`);
  }
  return out;
}
