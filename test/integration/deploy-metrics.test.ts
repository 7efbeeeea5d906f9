// The dashboard and the alert rules in deploy/ name only what a real proxy exports: the proxy as users run
// it (the bin, a manifest, --no-iptables) serves traffic that gives every labelled series a sample
// (connect failures, a rejection at the cap, a UDP eviction, a forwarding loop); then every metric each
// query names must be a family of its /metrics, every label it matches or groups by must be on those
// series, and every label a legend or annotation prints must be in the result. Also: every metric of
// ours is charted.
import assert from 'node:assert/strict';
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtemp, rename, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import {
  dashboardQueries,
  type Query,
  readDashboard,
  readRules,
  readRuleTests,
  ruleQueries,
  ruleTestSeries,
} from '../helpers/deploy-queries.ts';
import { type Exposition, parseExposition, seriesLabels, seriesNames } from '../helpers/exposition.ts';
import { service, slice, toYaml } from '../helpers/manifests.ts';
import { parsePromQL, resultLabels, selectors, unknownReferences } from '../helpers/promql.ts';
import { freePort } from '../helpers/proxy-process.ts';
import { request, tcpServer, udpRequest, udpServer, waitFor } from '../helpers/servers.ts';

const BIN = fileURLToPath(new URL('../../bin/kube-userspace-proxy.js', import.meta.url));
/** Labels Prometheus adds to every scraped series. */
const TARGET_LABELS = ['job', 'instance'];
/** Series Prometheus makes itself, with their labels. */
const SYNTHETIC: Record<string, string[]> = { up: TARGET_LABELS };

type After = { after(fn: () => unknown): void };

/** The proxy process on a manifest it reloads, its log lines, and its /metrics. */
async function startProxy(t: After, objects: unknown[], extraArgs: string[]) {
  const dir = await mkdtemp(join(tmpdir(), 'kup-deploy-metrics-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const manifest = join(dir, 'm.yaml');
  let n = 0;
  const write = async (objs: unknown[]) => {
    const tmp = join(dir, `.m.yaml.${n++}`);
    await writeFile(tmp, toYaml(objs));
    await rename(tmp, manifest);
  };
  await write(objects);
  const metricsPort = await freePort();
  const child: ChildProcess = spawn(
    process.execPath,
    [
      BIN,
      '--manifest',
      manifest,
      '--no-iptables',
      '--state-file=',
      '--hostname-override=node-1',
      '--bind-address=0.0.0.0',
      '--healthz-bind-address=',
      `--metrics-bind-address=127.0.0.1:${metricsPort}`,
      // The caps below (one connection, one UDP session) are per process: with workers, which process a
      // client lands in is SO_REUSEPORT's hash, and the second client may never meet the first one's cap.
      '--workers=1',
      ...extraArgs,
    ],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  t.after(() => child.kill('SIGKILL'));
  let stderr = '';
  child.stderr!.on('data', (d) => (stderr = (stderr + String(d)).slice(-4096)));
  const lines: Record<string, unknown>[] = [];
  createInterface({ input: child.stdout! }).on('line', (line) => {
    try {
      lines.push(JSON.parse(line) as Record<string, unknown>);
    } catch {
      // Not a log line.
    }
  });
  const alive = () => child.exitCode === null && child.signalCode === null;
  const proxyPort = (key: string) =>
    (lines.find((l) => l.msg === 'Opened service port' && l.service === key)?.proxyPort as number) ?? 0;
  const metrics = async () => (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text();
  const opened = async (...keys: string[]) => {
    await waitFor(
      () => {
        if (!alive()) throw new Error(`the proxy exited: ${stderr}`);
        return keys.every((k) => proxyPort(k) > 0);
      },
      20_000,
      `the proxy to open ${keys.join(', ')}`,
    );
    return keys.map(proxyPort);
  };
  return { write, metrics, opened, alive };
}

/** What a query names that the scrape does not have: its problems, with where they are. */
function queryProblems(q: Query, exposition: Exposition): string[] {
  const known = (name: string) =>
    SYNTHETIC[name] ? new Set(SYNTHETIC[name]) : seriesLabels(exposition, name, TARGET_LABELS);
  let expr: ReturnType<typeof parsePromQL>;
  try {
    expr = parsePromQL(q.expr);
  } catch (err) {
    return [`${q.where}: ${(err as Error).message}`];
  }
  const problems = unknownReferences(expr, known);
  const result = resultLabels(expr, (name) => known(name) ?? new Set());
  // Only where every name is known: an unknown metric is reported once, by name.
  if (problems.length === 0)
    for (const label of q.shows)
      if (!result.has(label)) problems.push(`shows ${label}, which the result lacks`);
  return problems.map((p) => `${q.where}: ${p}`);
}

test('every metric and label the dashboard and the alerts name is in a real proxy /metrics, and every metric of ours is charted', async (t) => {
  // web: one endpoint answers, one refuses (connect failures, an ejection); it holds until the client ends.
  const web = await tcpServer('127.0.0.61', (s) => {
    s.write('web');
    s.on('end', () => s.end());
  });
  t.after(() => web.close());
  const dns = await udpServer('127.0.0.63');
  t.after(() => dns.close());
  const objects = [
    service('web', '10.96.0.61', [{ name: 'http', port: 80, targetPort: web.port }]),
    slice('web', 'web-1', [{ ip: '127.0.0.61' }, { ip: '127.0.0.62' }], [{ name: 'http', port: web.port }]),
    service('dns', '10.96.0.63', [{ name: 'dns', port: 53, targetPort: dns.port, protocol: 'UDP' }]),
    slice('dns', 'dns-1', [{ ip: '127.0.0.63' }], [{ name: 'dns', port: dns.port, protocol: 'UDP' }]),
  ];
  const proxy = await startProxy(t, objects, [
    '--max-connections-per-service=1',
    '--udp-max-sessions=1',
    '--udp-timeout=30s',
    '--outlier-consecutive-failures=1',
  ]);
  const [webPort, dnsPort] = (await proxy.opened('default/web:http/TCP', 'default/dns:dns/UDP')) as [
    number,
    number,
  ];

  // Round robin meets the refusing endpoint half the time; the connect moves on to the other. The client
  // sees its close before the proxy has closed its own two sockets: the next request waits for that, or
  // the cap of 1 would turn it away.
  const webIdle = /kup_service_connections_active\{service="default\/web:http",protocol="TCP"\} 0\b/;
  for (let i = 0; i < 6; i++) {
    await waitFor(async () => webIdle.test(await proxy.metrics()), 5_000, 'the last web connection closed');
    assert.equal(await request(webPort), 'web');
  }
  // One connection held open: the next is closed at accept (the cap is 1).
  await waitFor(async () => webIdle.test(await proxy.metrics()), 5_000, 'the last web connection closed');
  const held = net.connect({ host: '127.0.0.1', port: webPort });
  t.after(() => held.destroy());
  await new Promise((resolve, reject) => {
    held.once('data', resolve);
    held.once('error', reject);
  });
  assert.equal(await request(webPort), '', 'closed at the cap');
  // Two UDP clients (two source ports) and a cap of one session: the first session is evicted.
  for (const q of ['a', 'b']) assert.equal(String(await udpRequest(dnsPort, q)), q);
  // A Service whose endpoint is web's proxy port: a forwarding loop, left out.
  await proxy.write([
    ...objects,
    service('loop', '10.96.0.64', [{ name: 'http', port: 80, targetPort: webPort }]),
    slice('loop', 'loop-1', [{ ip: '127.0.0.1' }], [{ name: 'http', port: webPort }]),
  ]);
  let text = '';
  const want = [
    /kup_service_connect_failures_total\{service="default\/web:http",protocol="TCP",reason="refused"\} [1-9]/,
    /kup_service_connections_rejected_total\{service="default\/web:http",protocol="TCP",reason="limit"\} [1-9]/,
    /kup_udp_sessions_evicted_total\{service="default\/dns:dns",protocol="UDP"\} [1-9]/,
    /kup_forwarding_loop_endpoints\{service="default\/loop:http",protocol="TCP"\} 1/,
  ];
  await waitFor(
    async () => {
      text = await proxy.metrics();
      return want.every((re) => re.test(text));
    },
    10_000,
    'the series the traffic makes',
  ).catch((err: Error) => {
    throw new Error(`${err.message}; missing: ${want.filter((re) => !re.test(text)).join(', ')}`);
  });
  assert.ok(proxy.alive());

  const exposition = parseExposition(text);
  const queries = [
    ...dashboardQueries(readDashboard()),
    ...ruleQueries(readRules()),
    ...ruleTestSeries(readRuleTests()),
  ];
  assert.ok(queries.length > 50, `${queries.length} queries`);
  assert.deepEqual(
    queries.flatMap((q) => queryProblems(q, exposition)),
    [],
  );

  // The check fails on a name or a label that is not there.
  const broken = [
    { where: 'x', expr: 'rate(kup_service_connections_totl[5m]) + kup_udp_sessions{service="a"}', shows: [] },
    { where: 'y', expr: 'sum by (service, reason) (rate(kup_service_connections_total[5m]))', shows: [] },
    { where: 'z', expr: 'sum by (instance) (kup_udp_sessions)', shows: ['node'] },
  ];
  assert.deepEqual(
    broken.flatMap((q) => queryProblems(q, exposition)),
    [
      'x: no metric kup_service_connections_totl',
      'x: kup_udp_sessions has no label service',
      'y: sum by reason: not a label of its input',
      'z: shows node, which the result lacks',
    ],
  );

  // Every family of ours (kup_, and kube-proxy's kubeproxy_) has a panel.
  const charted = new Set(
    dashboardQueries(readDashboard()).flatMap((q) => selectors(parsePromQL(q.expr)).map((s) => s.name)),
  );
  const uncharted = [...exposition.families.values()]
    .filter((f) => /^(?:kup|kubeproxy)_/.test(f.name))
    .filter((f) => !seriesNames(f).some((s) => charted.has(s)))
    .map((f) => f.name);
  assert.deepEqual(uncharted, [], 'chart them in deploy/grafana/dashboard.ts (then run it)');
});
