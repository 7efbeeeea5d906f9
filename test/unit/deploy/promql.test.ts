// The PromQL reader the dashboard and alert checks rely on: which metrics and labels an expression names,
// which labels its result keeps, and that what does not exist is reported.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parseExposition, seriesLabels } from '../../helpers/exposition.ts';
import {
  expandGrafanaVariables,
  parsePromQL,
  resultLabels,
  selectors,
  unknownReferences,
} from '../../helpers/promql.ts';

const names = (expr: string) => selectors(parsePromQL(expandGrafanaVariables(expr))).map((s) => s.name);

const selectorCases = [
  { name: 'a bare metric', expr: 'up', want: ['up'] },
  { name: 'matchers, strings with commas and braces', expr: 'a{b="x,}", c=~"$v|y", d!~\'z\'}', want: ['a'] },
  {
    name: 'aggregation with by before and after, functions, ranges',
    expr: 'sum by (service) (rate(a_total{job="j"}[5m])) / sum(rate(b_total[1h30m])) by (service)',
    want: ['a_total', 'b_total'],
  },
  {
    name: 'histogram_quantile over buckets, Grafana interval',
    expr: 'histogram_quantile(0.99, sum by (le, instance) (rate(h_bucket[$__rate_interval])))',
    want: ['h_bucket'],
  },
  {
    name: 'keywords and functions are not metrics',
    expr: 'time() - last > bool 120 and on (instance) (up == 1) or vector(0) unless absent(x)',
    want: ['last', 'up', 'x'],
  },
  {
    name: 'topk with a parameter, offset, subquery, unary minus, exponent',
    expr: 'topk(5, -a offset 5m) + max_over_time(b[10m:1m]) ^ 2 * 1e3',
    want: ['a', 'b'],
  },
  { name: '__name__ matcher', expr: '{__name__="n", x="y"}', want: ['n'] },
  { name: 'group_left with labels', expr: 'a * on (instance) group_left (node) b', want: ['a', 'b'] },
  { name: 'metric names with colons', expr: 'job:rate5m:sum{job="x"}', want: ['job:rate5m:sum'] },
];
for (const c of selectorCases) test(`selectors: ${c.name}`, () => assert.deepEqual(names(c.expr), c.want));

const badCases = [
  { name: 'unbalanced parenthesis', expr: 'sum(rate(a[5m])' },
  { name: 'a matcher without a string', expr: 'a{b=c}' },
  { name: 'a range on a function', expr: 'rate(a[5m])[5m]' },
  { name: 'trailing junk', expr: 'a b' },
  { name: 'an unknown character', expr: 'a ! b' },
  { name: 'an unterminated string', expr: 'a{b="c}' },
  { name: 'a Grafana variable outside a string', expr: 'a > $threshold' },
];
for (const c of badCases)
  test(`parse error: ${c.name}`, () => assert.throws(() => parsePromQL(c.expr), /at \d+ in/));

const labels: Record<string, string[]> = {
  a_total: ['service', 'protocol', 'reason'],
  b: ['operation'],
  h_bucket: ['le'],
  up: [],
};
const TARGET = ['job', 'instance'];
const known = (name: string) => (labels[name] ? new Set([...labels[name]!, ...TARGET]) : undefined);

const resultCases = [
  { name: 'by keeps only its labels', expr: 'sum by (service) (a_total)', want: ['service'] },
  {
    name: 'without drops its labels',
    expr: 'sum without (reason, job) (a_total)',
    want: ['instance', 'protocol', 'service'],
  },
  {
    name: 'histogram_quantile drops le',
    expr: 'histogram_quantile(0.9, sum by (le, job) (rate(h_bucket[5m])))',
    want: ['job'],
  },
  { name: 'a scalar keeps the vector side', expr: 'time() - b', want: ['instance', 'job', 'operation'] },
  { name: 'on() keeps its labels', expr: 'a_total / on (instance) b', want: ['instance'] },
  {
    name: 'group_left adds from the one side',
    expr: 'a_total * on (instance) group_left (operation) b',
    want: ['instance', 'job', 'operation', 'protocol', 'reason', 'service'],
  },
  {
    name: 'a filter keeps the left side',
    expr: 'a_total > b',
    want: ['instance', 'job', 'protocol', 'reason', 'service'],
  },
  { name: 'absent keeps its equality matchers', expr: 'absent(up{job="x", instance=~"y"})', want: ['job'] },
  {
    name: 'label_replace adds its target',
    expr: 'label_replace(b, "node", "$1", "instance", "(.*)")',
    want: ['instance', 'job', 'node', 'operation'],
  },
];
for (const c of resultCases)
  test(`result labels: ${c.name}`, () => {
    const got = resultLabels(parsePromQL(c.expr), (n) => known(n) ?? new Set());
    assert.deepEqual([...got].sort(), c.want);
  });

const referenceCases = [
  { name: 'all known', expr: 'sum by (service, reason) (rate(a_total{protocol="TCP"}[5m]))', want: [] },
  { name: 'an unknown metric', expr: 'rate(a_totl[5m])', want: ['no metric a_totl'] },
  { name: 'an unknown matcher label', expr: 'a_total{servce="x"}', want: ['a_total has no label servce'] },
  {
    name: 'by a label the input lacks',
    expr: 'sum by (operation) (rate(a_total[5m]))',
    want: ['sum by operation: not a label of its input'],
  },
  {
    name: 'by a label an inner aggregation dropped',
    expr: 'max by (service) (sum by (instance) (a_total))',
    want: ['max by service: not a label of its input'],
  },
  {
    name: 'on a label one side lacks',
    expr: 'a_total / on (service) b',
    want: ['/ on service: not a label of both sides'],
  },
  { name: 'a selector without a name', expr: '{job="x"}', want: ['a selector without a metric name'] },
];
for (const c of referenceCases)
  test(`unknown references: ${c.name}`, () =>
    assert.deepEqual(unknownReferences(parsePromQL(c.expr), known), c.want));

test('exposition: families from # TYPE, labels from samples, histogram series names', () => {
  const text = [
    '# HELP c_total A counter',
    '# TYPE c_total counter',
    'c_total{service="ns/a:b",protocol="TCP"} 1',
    'c_total{service="q\\"x,y={z}",reason="limit"} 2',
    '# TYPE h histogram',
    'h_bucket{le="0.1"} 0',
    'h_sum 0',
    'h_count 0',
    '# TYPE empty_total counter',
    '',
  ].join('\n');
  const e = parseExposition(text);
  assert.deepEqual([...e.families.keys()], ['c_total', 'h', 'empty_total']);
  const sorted = (s: Set<string> | undefined) => (s ? [...s].sort() : s);
  assert.deepEqual(sorted(seriesLabels(e, 'c_total', TARGET)), [
    'instance',
    'job',
    'protocol',
    'reason',
    'service',
  ]);
  assert.deepEqual(sorted(seriesLabels(e, 'h_bucket', TARGET)), ['instance', 'job', 'le']);
  assert.deepEqual(sorted(seriesLabels(e, 'h_count', [])), []);
  assert.equal(seriesLabels(e, 'h', TARGET), undefined, 'a histogram has no series of its own name');
  assert.deepEqual(sorted(seriesLabels(e, 'empty_total', TARGET)), ['instance', 'job']);
  assert.equal(seriesLabels(e, 'missing', TARGET), undefined);
  assert.throws(() => parseExposition('c_total{a="b" 1'), /line 1/);
});
