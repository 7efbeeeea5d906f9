// Every PromQL expression deploy/ ships, with where it is and the labels it shows: the Grafana dashboard's
// panel queries (legends) and variable queries, the alert rules (annotations), and the series the
// promtool rule tests feed in. For tests that check them against the grammar and a real /metrics.
import { readFileSync } from 'node:fs';
import { parse } from 'yaml';
import { expandGrafanaVariables } from './promql.ts';

const DEPLOY = new URL('../../deploy/', import.meta.url);

export type Query = {
  /** Where it is, for messages: `dashboard "Syncs" A`, `alert KubeUserspaceProxyDown`. */
  where: string;
  /** PromQL (Grafana's interval variables already replaced). */
  expr: string;
  /** Labels the result must carry: a legend's `{{x}}`, an annotation's `$labels.x`, a variable's label. */
  shows: string[];
};

export type Rule = {
  alert: string;
  expr: string;
  for?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
};
export type RuleFile = { groups: { name: string; rules: Rule[] }[] };

export type GrafanaTarget = { refId: string; expr: string; legendFormat?: string; datasource?: unknown };
export type GrafanaPanel = {
  id: number;
  type: string;
  title: string;
  gridPos: { h: number; w: number; x: number; y: number };
  datasource?: { type: string; uid: string };
  targets?: GrafanaTarget[];
  panels?: GrafanaPanel[];
  fieldConfig?: { defaults?: { unit?: string } };
};
export type GrafanaVariable = {
  name: string;
  type: string;
  query?: string | { query: string };
  datasource?: { type: string; uid: string };
};
export type Dashboard = {
  uid: string;
  title: string;
  schemaVersion: number;
  templating: { list: GrafanaVariable[] };
  panels: GrafanaPanel[];
};

export function readDashboard(): Dashboard {
  return JSON.parse(readFileSync(new URL('grafana/kube-userspace-proxy.json', DEPLOY), 'utf8')) as Dashboard;
}

export function readRules(): RuleFile {
  return parse(readFileSync(new URL('prometheus/alerts.yaml', DEPLOY), 'utf8')) as RuleFile;
}

export type RuleTests = {
  rule_files: string[];
  tests: {
    name: string;
    input_series: { series: string; values: string }[];
    alert_rule_test?: { eval_time: string; alertname: string; exp_alerts?: unknown[] }[];
  }[];
};

export function readRuleTests(): RuleTests {
  return parse(readFileSync(new URL('prometheus/alerts_test.yaml', DEPLOY), 'utf8')) as RuleTests;
}

/** `{{service}} {{protocol}}` → ['service', 'protocol']. */
export function legendLabels(legend: string): string[] {
  return [...legend.matchAll(/\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}/g)].map((m) => m[1]!);
}

/** `{{ $labels.service }}` → ['service']. */
export function annotationLabels(text: string): string[] {
  return [...text.matchAll(/\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)/g)].map((m) => m[1]!);
}

/** Panels in order, with those inside collapsed rows. */
export function allPanels(dashboard: Dashboard): GrafanaPanel[] {
  return dashboard.panels.flatMap((p) => [p, ...(p.panels ?? [])]);
}

/** Every query of the dashboard: panel targets, and `label_values(selector, label)` of its variables. */
export function dashboardQueries(dashboard: Dashboard): Query[] {
  const out: Query[] = [];
  for (const p of allPanels(dashboard))
    for (const t of p.targets ?? [])
      out.push({
        where: `dashboard "${p.title}" ${t.refId}`,
        expr: expandGrafanaVariables(t.expr),
        shows: legendLabels(t.legendFormat ?? ''),
      });
  for (const v of dashboard.templating.list) {
    if (v.type !== 'query') continue;
    const query = typeof v.query === 'string' ? v.query : (v.query?.query ?? '');
    const m = /^label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$/.exec(query);
    if (!m) throw new Error(`variable ${v.name}: not label_values(selector, label): ${query}`);
    out.push({ where: `dashboard variable ${v.name}`, expr: m[1]!, shows: [m[2]!] });
  }
  return out;
}

/** Every alert's expression, with the labels its annotations print. */
export function ruleQueries(rules: RuleFile): Query[] {
  return rules.groups.flatMap((g) =>
    g.rules.map((r) => ({
      where: `alert ${r.alert}`,
      expr: r.expr,
      shows: [...new Set(Object.values(r.annotations ?? {}).flatMap(annotationLabels))],
    })),
  );
}

/** The promtool tests' input series as selectors (`name{a="b"}` is PromQL too). */
export function ruleTestSeries(tests: RuleTests): Query[] {
  return tests.tests.flatMap((t) =>
    t.input_series.map((s) => ({ where: `rule test "${t.name}" series`, expr: s.series, shows: [] })),
  );
}
