// deploy/grafana/kube-userspace-proxy.json: what dashboard.ts generates, and a dashboard Grafana imports
// as it is: unique panel ids on a grid without overlaps, rows, a Prometheus data source variable every
// query uses, queries that parse and honour the job/node/service variables. (Whether the metrics they
// name exist: test/integration/deploy-metrics.test.ts, against a real proxy.)
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { buildDashboard } from '../../../deploy/grafana/dashboard.ts';
import {
  allPanels,
  type Dashboard,
  dashboardQueries,
  type GrafanaPanel,
  readDashboard,
} from '../../helpers/deploy-queries.ts';
import { parsePromQL, selectors } from '../../helpers/promql.ts';

const dashboard = readDashboard();
/** Grafana's `${datasource}` variable. */
const DS = { type: 'prometheus', uid: '$' + '{datasource}' };

test('the JSON is what deploy/grafana/dashboard.ts generates (run it after editing the panels)', () => {
  assert.deepEqual(dashboard, JSON.parse(JSON.stringify(buildDashboard())));
});

test('a current Grafana dashboard: schema version, uid, title, tags', () => {
  assert.ok(dashboard.schemaVersion >= 39, `schemaVersion ${dashboard.schemaVersion}`);
  assert.match(dashboard.uid, /^[a-zA-Z0-9_-]{1,40}$/);
  assert.equal(dashboard.title, 'kube-userspace-proxy');
  assert.equal((dashboard as unknown as { id: unknown }).id, null, 'no id: Grafana assigns one on import');
});

test('variables: a Prometheus data source, then job, node (instance) and service from it', () => {
  const vars = dashboard.templating.list;
  assert.deepEqual(
    vars.map((v) => `${v.name}:${v.type}`),
    ['datasource:datasource', 'job:query', 'instance:query', 'service:query'],
  );
  assert.equal((vars[0] as unknown as { query: string }).query, 'prometheus');
  for (const v of vars.slice(1)) {
    assert.deepEqual(v.datasource, DS, v.name);
    // A string: Grafana migrates it into its editor; an object with qryType but no fields it would break.
    assert.match(String(v.query), /^label_values\(.+, [a-z_]+\)$/, v.name);
    assert.equal((v as unknown as { definition: string }).definition, v.query, v.name);
  }
});

/** What is wrong with the grid: ids used twice, panels off the 24 columns, panels that overlap. */
function gridProblems(panels: GrafanaPanel[]): string[] {
  const problems: string[] = [];
  const ids = new Set<number>();
  for (const p of panels) {
    if (!Number.isInteger(p.id) || ids.has(p.id)) problems.push(`panel id ${p.id} of "${p.title}"`);
    ids.add(p.id);
    const g = p.gridPos;
    if (!g || g.w <= 0 || g.h <= 0 || g.x < 0 || g.y < 0 || g.x + g.w > 24)
      problems.push(`gridPos of "${p.title}": ${JSON.stringify(g)}`);
  }
  for (const [i, a] of panels.entries())
    for (const b of panels.slice(i + 1)) {
      const [p, q] = [a.gridPos, b.gridPos];
      if (p.x < q.x + q.w && q.x < p.x + p.w && p.y < q.y + q.h && q.y < p.y + p.h)
        problems.push(`"${a.title}" overlaps "${b.title}"`);
    }
  return problems;
}

test('panels: unique ids, on the 24-column grid, no overlaps', () => {
  assert.deepEqual(gridProblems(allPanels(dashboard)), []);
});

test('the grid check can fail', () => {
  const broken = structuredClone(dashboard) as Dashboard;
  const [, a, b] = broken.panels as [GrafanaPanel, GrafanaPanel, GrafanaPanel];
  b.id = a.id;
  b.gridPos = { ...a.gridPos, x: a.gridPos.x + 1 };
  assert.deepEqual(gridProblems(broken.panels), [
    `panel id ${a.id} of "${b.title}"`,
    `"${a.title}" overlaps "${b.title}"`,
  ]);
});

test('rows: sync health, service traffic, endpoints, UDP, resources; each with panels below it', () => {
  const rows = dashboard.panels.filter((p) => p.type === 'row');
  assert.deepEqual(
    rows.map((r) => r.title),
    ['Sync health', 'Service traffic', 'Endpoints', 'UDP', 'Resources'],
  );
  for (const [i, row] of dashboard.panels.entries()) {
    if (row.type !== 'row') continue;
    assert.equal(row.gridPos.w, 24);
    const next = dashboard.panels[i + 1];
    assert.ok(next && next.type !== 'row', `row "${row.title}" has panels`);
  }
});

test('every panel queries the datasource variable, with a unit, and each target has an expression and its own refId', () => {
  for (const p of allPanels(dashboard)) {
    if (p.type === 'row') continue;
    assert.ok(['timeseries', 'stat'].includes(p.type), `${p.title}: ${p.type}`);
    assert.deepEqual(p.datasource, DS, p.title);
    assert.ok(p.fieldConfig?.defaults?.unit, `${p.title}: a unit`);
    assert.ok((p.targets ?? []).length > 0, `${p.title}: targets`);
    const refIds = p.targets!.map((t) => t.refId);
    assert.equal(new Set(refIds).size, refIds.length, `${p.title}: refIds`);
    for (const t of p.targets!) {
      assert.ok(t.expr.trim() !== '', `${p.title} ${t.refId}: expr`);
      assert.deepEqual(t.datasource, DS, `${p.title} ${t.refId}`);
    }
  }
});

/** Our metrics with a `service` label. */
const PER_SERVICE =
  /^kup_(?:service_|endpoint_ejections_total|udp_sessions_evicted_total|udp_sessions_endpoint_removed_total|forwarding_loop_endpoints)/;

test('every query parses, and every selector is narrowed by $job and $instance ($service where it has one)', () => {
  for (const q of dashboardQueries(dashboard)) {
    const sels = selectors(parsePromQL(q.expr));
    assert.ok(sels.length > 0, q.where);
    for (const s of sels) {
      const matchers = new Map(s.matchers.map((m) => [m.label, `${m.op}"${m.value}"`]));
      if (q.where === 'dashboard variable job') continue;
      assert.equal(matchers.get('job'), '=~"$job"', `${q.where}: ${s.name} by $job`);
      if (q.where === 'dashboard variable instance') continue;
      assert.equal(matchers.get('instance'), '=~"$instance"', `${q.where}: ${s.name} by $instance`);
      if (q.where === 'dashboard variable service' || !PER_SERVICE.test(s.name ?? '')) continue;
      assert.equal(matchers.get('service'), '=~"$service"', `${q.where}: ${s.name} by $service`);
    }
  }
});

test('rates use $__rate_interval', () => {
  for (const p of allPanels(dashboard))
    for (const t of p.targets ?? [])
      for (const m of t.expr.matchAll(/\b(?:rate|increase)\([^[]*\[([^\]]+)\]/g))
        assert.equal(m[1], '$__rate_interval', `${p.title} ${t.refId}`);
});
