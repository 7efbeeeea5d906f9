// The namespace benchmark: this proxy beside HAProxy (TCP), nginx stream (UDP and TCP) and a direct
// connection, same machine, same run, alternating rounds, medians and ratios. Writes
// bench/results/<date>-<host>.json and bench/results/latest.md, and prints the table.
// Needs root and the tools of bench/setup.sh; exits with 3 when they are missing (bench/run.ts falls back).
// Run: node bench/harness.ts [--quick] [--only tcp-1,dns,...] [--rounds N] [--seconds S] [--workers-compare] [--listener-target]
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, writeFile } from 'node:fs/promises';
import { cpus, hostname } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { MEASURES, type MeasureResult, type Options, warmUp } from './measures.ts';
import { machineBusy } from './processes.ts';
import { describeMachine, type Results, renderMarkdown, sourceHash } from './report.ts';
import { PROXY_BIN, type ProxyTargetName, Rig, type TraceLayout } from './rig.ts';
import { NGINX_STREAM_MODULE, TOOLS } from './tools.ts';

/** Exit code when root or a tool is missing: the caller may run the loopback benchmark instead. */
const EXIT_UNAVAILABLE = 3;

const USAGE = `node bench/harness.ts [--quick] [--only NAME[,NAME]] [--rounds N] [--seconds S]
  --quick      1 round × 2 s, 1,000 held connections, 2,000 services, 20 s sustained (about 4 minutes)
  --only       run only these measures: ${MEASURES.map((m) => m.name).join(', ')}
  --rounds     rounds of every traffic measure (default 5; memory at most 2, scale at most 3)
  --seconds    seconds per traffic sample (default 3)
  --sustained S  seconds of the sustained Connection: close sample, http-close-60s (default 60; --quick 20)
  --sustained-rounds N  its rounds (default 2, at most --rounds; --quick 1)
  --workers-compare  also run proxy-w1: the proxy with --workers 1 beside the default (skipped, with a
               note, when the CLI has no --workers)
  --listener-target  also run proxy-listener: the traced proxy reached at its listeners (the node's
               address, the ports its rules REDIRECT to): what the REDIRECT's NAT costs, in the run
  --services   service ports of the scale measure (default 10000)
  --connections  idle connections held for the memory measure (default 5000)
  --wait-quiet S wait up to S seconds for the machine to be quiet (< 10 % busy) before starting
  --trace-layout normal (default): the traced proxy on the node, --trace=none on node2; swap: the
               other way round; control: both --trace=none (an A/A control of the tracing column)`;

/** What keeps the benchmark from running here, or undefined. */
function unavailable(): string | undefined {
  if (process.getuid?.() !== 0) return 'needs root (network namespaces, iptables)';
  const missing: string[] = TOOLS.filter((t) => spawnSync('sh', ['-c', `command -v ${t}`]).status !== 0);
  if (!existsSync(NGINX_STREAM_MODULE)) missing.push('libnginx-mod-stream');
  if (missing.length > 0) return `missing ${missing.join(', ')} (run: sudo bash bench/setup.sh)`;
  return undefined;
}

/** The flags of the `proxy-w1` target (--workers-compare). */
const WORKERS_1 = ['--workers', '1'];

/**
 * Whether the CLI (dist/, built) accepts `flags`: asks it for its version with them, which parses every
 * flag and starts nothing. Undefined when accepted, else what it said.
 */
function rejectedFlags(flags: readonly string[]): string | undefined {
  const r = spawnSync(process.execPath, [PROXY_BIN, ...flags, '--version'], {
    encoding: 'utf8',
    timeout: 30_000,
  });
  if (r.status === 0) return undefined;
  return `${r.stderr ?? ''}${r.stdout ?? ''}`.trim().split('\n')[0] || `exit ${r.status}`;
}

async function main(): Promise<number> {
  const { values } = parseArgs({
    options: {
      quick: { type: 'boolean', default: false },
      only: { type: 'string', multiple: true, default: [] },
      rounds: { type: 'string' },
      seconds: { type: 'string' },
      sustained: { type: 'string' },
      'sustained-rounds': { type: 'string' },
      'workers-compare': { type: 'boolean', default: false },
      'listener-target': { type: 'boolean', default: false },
      services: { type: 'string' },
      connections: { type: 'string' },
      'wait-quiet': { type: 'string', default: '0' },
      'trace-layout': { type: 'string', default: 'normal' },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  if (values.help) {
    process.stdout.write(`${USAGE}\n`);
    return 0;
  }
  const only = values.only.flatMap((o) => o.split(',')).filter(Boolean);
  const unknown = only.filter((o) => !MEASURES.some((m) => m.name === o));
  if (unknown.length > 0) {
    process.stderr.write(`unknown measure(s) ${unknown.join(', ')}\n${USAGE}\n`);
    return 2;
  }
  const why = unavailable();
  if (why) {
    process.stderr.write(`namespace benchmark: ${why}\n`);
    return EXIT_UNAVAILABLE;
  }
  const quick = values.quick;
  const layout = values['trace-layout'] as TraceLayout;
  if (!['normal', 'swap', 'control'].includes(layout)) {
    process.stderr.write(`unknown --trace-layout ${layout}\n${USAGE}\n`);
    return 2;
  }
  const log = (line: string) => process.stderr.write(`${line}\n`);
  // The proxy runs as users run it, from dist/: build it from this checkout first.
  const root = fileURLToPath(new URL('..', import.meta.url));
  const build = spawnSync(
    process.execPath,
    ['node_modules/typescript/bin/tsc', '-p', 'tsconfig.build.json'],
    {
      cwd: root,
      encoding: 'utf8',
    },
  );
  if (build.status !== 0) {
    process.stderr.write(`namespace benchmark: building dist/ failed:\n${build.stdout}${build.stderr}\n`);
    return 1;
  }
  const rounds = Number(values.rounds ?? (quick ? 1 : 5));
  const options: Options = {
    rounds,
    seconds: Number(values.seconds ?? (quick ? 2 : 3)),
    sustainedSeconds: Number(values.sustained ?? (quick ? 20 : 60)),
    sustainedRounds: Number(values['sustained-rounds'] ?? (quick ? 1 : Math.min(rounds, 2))),
    heldConnections: Number(values.connections ?? (quick ? 1000 : 5000)),
    services: Number(values.services ?? (quick ? 2000 : 10_000)),
    changes: quick ? 1 : 3,
    log,
  };
  const selected = MEASURES.filter((m) => only.length === 0 || only.includes(m.name));
  log(
    `namespace benchmark: ${selected.map((m) => m.name).join(', ')}; ${options.rounds} round(s) × ${options.seconds} s`,
  );
  const notes: string[] = [];
  const proxyArgs: Partial<Record<ProxyTargetName, string[]>> = {};
  if (values['workers-compare']) {
    const rejected = rejectedFlags(WORKERS_1);
    if (rejected === undefined) proxyArgs['proxy-w1'] = WORKERS_1;
    else {
      const msg = `proxy-w1 skipped: the CLI rejects ${WORKERS_1.join(' ')} (${rejected})`;
      log(`! ${msg}`);
      notes.push(msg);
    }
  }

  // Other work on the machine makes every number noisy: say how busy it was before anything started.
  let before = await machineBusy(2000);
  const quietBy = Date.now() + Number(values['wait-quiet']) * 1000;
  while (before.percent >= 10 && Date.now() < quietBy) {
    log(`waiting for a quiet machine: ${before.percent.toFixed(0)} % busy (${before.top.join(', ')})`);
    await new Promise((r) => setTimeout(r, 8000));
    before = await machineBusy(2000);
  }
  log(
    `machine ${before.percent.toFixed(0)} % busy before the run${before.top.length > 0 ? ` (${before.top.join(', ')})` : ''}`,
  );
  const started = performance.now();
  const machine = describeMachine();
  const rig = await Rig.create({
    cores: cpus().length,
    proxyArgs,
    listenerTarget: values['listener-target'],
    log,
  });
  const results: MeasureResult[] = [];
  let proxies: Results['proxies'] = [];
  // One measure failing (a tool, a peer, the proxy) is reported and the others still run.
  const attempt = async (m: (typeof MEASURES)[number]) => {
    log(`${m.name}: ${m.title}`);
    try {
      results.push(await m.run(rig, options));
    } catch (err) {
      const msg = `${m.name} failed: ${(err as Error).stack ?? err}`;
      log(`! ${msg}`);
      notes.push(msg.split('\n').slice(0, 4).join(' '));
    }
  };
  try {
    // Memory first, on fresh processes; then the traffic measures; scale last (it replaces the proxy).
    const memory = selected.filter((x) => x.kind === 'memory');
    const traffic = selected.filter((x) => x.kind === 'traffic');
    if (memory.length + traffic.length > 0) await rig.startTrafficProxies(layout);
    for (const m of memory) await attempt(m);
    if (traffic.length > 0) {
      if (memory.length > 0) await rig.restartMiddles();
      await warmUp(rig, options);
    }
    for (const m of traffic) await attempt(m);
    await rig.stopTrafficProxies();
    for (const m of selected.filter((x) => x.kind === 'scale')) await attempt(m);
    proxies = rig.proxyHealth();
    for (const m of rig.peerMessages()) notes.push(`peer output: ${m}`);
  } finally {
    await rig.cleanup();
  }

  const sourceAfter = sourceHash();
  if (!machine.proxy.includes(sourceAfter))
    notes.push(
      `the proxy's source changed during the run (now ${sourceAfter}): measures taken before and after the change are mixed`,
    );
  const date = new Date().toISOString();
  const res: Results = {
    date,
    machine,
    options: {
      rounds: options.rounds,
      seconds: options.seconds,
      quick,
      only,
      layout,
      sustainedSeconds: options.sustainedSeconds,
      sustainedRounds: options.sustainedRounds,
    },
    measures: results,
    proxies,
    busyBefore: before,
    notes,
    durationSeconds: (performance.now() - started) / 1000,
  };
  const dir = fileURLToPath(new URL('results/', import.meta.url));
  await mkdir(dir, { recursive: true });
  const base = `${date.slice(0, 10)}-${hostname()}${quick ? '-quick' : ''}${layout === 'normal' ? '' : `-${layout}`}${only.length > 0 ? `-${only.join('+')}` : ''}`;
  const markdown = renderMarkdown(res);
  await writeFile(join(dir, `${base}.json`), `${JSON.stringify(res, null, 2)}\n`);
  await writeFile(join(dir, 'latest.md'), markdown);
  process.stdout.write(`${markdown}\nwrote bench/results/${base}.json and bench/results/latest.md\n`);
  return 0;
}

process.exitCode = await main();
