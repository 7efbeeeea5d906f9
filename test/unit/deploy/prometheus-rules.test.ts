// deploy/prometheus: alert rules every Prometheus loads (promtool checks them and runs their tests), each
// with a `for`, a severity, a summary and description, and a runbook section in docs/alerts.md; the
// PrometheusRule holds the same groups. The dashboard's queries go through promtool's parser too.
// (Whether the metrics and labels they name exist: test/integration/deploy-metrics.test.ts.)
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { parseAllDocuments, stringify } from 'yaml';
import { dashboardQueries, readDashboard, readRules, readRuleTests } from '../../helpers/deploy-queries.ts';
import { parsePromQL, selectors } from '../../helpers/promql.ts';

const PROMETHEUS = fileURLToPath(new URL('../../../deploy/prometheus/', import.meta.url));
const ALERTS_DOC = readFileSync(new URL('../../../docs/alerts.md', import.meta.url), 'utf8');
const rules = readRules();
const allRules = rules.groups.flatMap((g) => g.rules);

test('alerts.yaml: one group of uniquely named alerts', () => {
  assert.deepEqual(
    rules.groups.map((g) => g.name),
    ['kube-userspace-proxy'],
  );
  const names = allRules.map((r) => r.alert);
  assert.equal(new Set(names).size, names.length);
  // What the issue asks for, plus what kube-proxy operators expect (down, absent).
  for (const want of [
    'KubeUserspaceProxyDown',
    'KubeUserspaceProxyAbsent',
    'KubeUserspaceProxySyncStale',
    'KubeUserspaceProxyIptablesRestoreFailing',
    'KubeUserspaceProxyEndpointsEjected',
    'KubeUserspaceProxyUDPSessionsEvicted',
    'KubeUserspaceProxyConnectionsRejected',
    'KubeUserspaceProxyFdExhausted',
    'KubeUserspaceProxyFdPressure',
  ])
    assert.ok(names.includes(want), want);
});

for (const r of allRules)
  test(`${r.alert}: for, severity, summary, description, a runbook section; it selects job="kube-userspace-proxy"`, () => {
    assert.deepEqual(Object.keys(r).sort(), ['alert', 'annotations', 'expr', 'for', 'labels']);
    assert.match(r.for ?? '', /^\d+[smh]$/);
    assert.deepEqual(Object.keys(r.labels ?? {}), ['severity']);
    assert.ok(['critical', 'warning'].includes(r.labels!.severity!), r.labels!.severity);
    assert.deepEqual(Object.keys(r.annotations ?? {}).sort(), ['description', 'runbook', 'summary']);
    const anchor = r.alert.toLowerCase();
    assert.equal(r.annotations!.runbook, `docs/alerts.md#${anchor}`);
    assert.ok(ALERTS_DOC.includes(`\n## ${r.alert}\n`), `docs/alerts.md has a section "## ${r.alert}"`);
    assert.ok(ALERTS_DOC.includes(`| ${r.alert} | ${r.labels!.severity} |`), 'and a row in its table');
    // kube-proxy exports the same kubeproxy_ names: without the job an alert would fire for it too.
    for (const s of selectors(parsePromQL(r.expr)))
      assert.ok(
        s.matchers.some((m) => m.label === 'job' && m.op === '=' && m.value === 'kube-userspace-proxy'),
        `${s.name} selects the job`,
      );
  });

test('prometheus-rule.yaml: a PrometheusRule with exactly the groups of alerts.yaml', () => {
  const docs = parseAllDocuments(readFileSync(join(PROMETHEUS, 'prometheus-rule.yaml'), 'utf8'));
  assert.equal(docs.length, 1);
  assert.deepEqual(docs[0]!.errors, []);
  const cr = docs[0]!.toJS() as Record<string, unknown>;
  assert.equal(cr.apiVersion, 'monitoring.coreos.com/v1');
  assert.equal(cr.kind, 'PrometheusRule');
  assert.deepEqual(cr.metadata, {
    name: 'kube-userspace-proxy',
    namespace: 'kube-system',
    labels: { 'k8s-app': 'kube-userspace-proxy' },
  });
  assert.deepEqual(cr.spec, rules);
});

test('alerts_test.yaml shows every alert firing at least once', () => {
  const tests = readRuleTests();
  assert.deepEqual(tests.rule_files, ['alerts.yaml']);
  const fired = new Set(
    tests.tests.flatMap((t) =>
      (t.alert_rule_test ?? []).filter((a) => (a.exp_alerts ?? []).length > 0).map((a) => a.alertname),
    ),
  );
  assert.deepEqual(
    allRules.map((r) => r.alert).filter((a) => !fired.has(a)),
    [],
  );
});

/** promtool from $PROMTOOL or PATH (CI unpacks Debian's prometheus package); undefined when missing. */
function findPromtool(): string | undefined {
  const candidates = [
    process.env.PROMTOOL,
    ...(process.env.PATH ?? '').split(delimiter).map((d) => join(d, 'promtool')),
  ];
  return candidates.find((c) => c && spawnSync(c, ['--version']).status === 0);
}

const promtool = findPromtool();
/** Skipped without promtool only outside CI: CI must run these. */
const skip = promtool === undefined && !process.env.CI ? 'promtool not found (set PROMTOOL or PATH)' : false;

function runPromtool(args: string[], cwd: string): void {
  assert.ok(promtool, 'promtool not found: CI installs it (.ci/run); set PROMTOOL or PATH');
  const r = spawnSync(promtool, args, { cwd, encoding: 'utf8', timeout: 60_000 });
  assert.equal(r.status, 0, `promtool ${args.join(' ')}:\n${r.stdout}${r.stderr}`);
}

test('promtool check rules: alerts.yaml', { skip }, () => {
  runPromtool(['check', 'rules', 'alerts.yaml'], PROMETHEUS);
});

test('promtool test rules: every alert fires on its series with its labels and annotations', { skip }, () => {
  runPromtool(['test', 'rules', 'alerts_test.yaml'], PROMETHEUS);
});

test("promtool parses the dashboard's queries (as recording rules)", { skip }, async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'kup-promtool-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const queries = dashboardQueries(readDashboard());
  const file = {
    groups: [
      { name: 'dashboard', rules: queries.map((q, i) => ({ record: `kup:dashboard:${i}`, expr: q.expr })) },
    ],
  };
  await writeFile(join(dir, 'dashboard.yaml'), stringify(file));
  runPromtool(['check', 'rules', 'dashboard.yaml'], dir);
});
