// The Grafana dashboard (kube-userspace-proxy.json beside this file) as a table of rows and panels; the
// layout, ids and data source references are derived. `node deploy/grafana/dashboard.ts` rewrites the
// JSON (formatted by Biome, as the lint wants it); test/unit/deploy/grafana-dashboard.test.ts fails when
// the two differ.
import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

type Target = { expr: string; legend: string };
type Panel = {
  title: string;
  description: string;
  unit: string;
  targets: Target[];
  /** Grid columns of 24; 8 by default. */
  width?: number;
  /** A stat panel (the last value, coloured by thresholds) instead of a time series. */
  stat?: { thresholds: [number, string][] };
  /** Series whose name matches this are drawn below the axis (the other direction). */
  negativeY?: string;
  /** Axis maximum (1 for ratios). */
  max?: number;
};
type Row = { title: string; panels: Panel[] };

// Grafana's variable syntax, not a template literal.
const DS = { type: 'prometheus', uid: '$' + '{datasource}' } as const;
/** This proxy's series on the chosen nodes; with the chosen services for per-service metrics. */
const NODE = 'job=~"$job", instance=~"$instance"';
const SVC = `${NODE}, service=~"$service"`;
const RATE = '[$__rate_interval]';

export const ROWS: Row[] = [
  {
    title: 'Sync health',
    panels: [
      {
        title: 'Time since last sync',
        description:
          'Seconds since the proxy last synced its rules. A sync runs at least every --iptables-sync-period (30s); past 2 minutes (for 3) KubeUserspaceProxySyncStale fires.',
        unit: 's',
        width: 6,
        stat: {
          thresholds: [
            [0, 'green'],
            [60, 'orange'],
            [120, 'red'],
          ],
        },
        targets: [
          {
            expr: `time() - max by (instance) (kubeproxy_sync_proxy_rules_last_timestamp_seconds{${NODE}})`,
            legend: '{{instance}}',
          },
        ],
      },
      {
        title: 'Syncs',
        description: 'Rule syncs per second (periodic, and after Service changes).',
        unit: 'ops',
        width: 6,
        targets: [
          {
            expr: `sum by (instance) (rate(kubeproxy_sync_proxy_rules_duration_seconds_count{${NODE}}${RATE}))`,
            legend: '{{instance}}',
          },
        ],
      },
      {
        title: 'Sync duration',
        description: 'How long a sync of the proxy rules takes (listeners and iptables), p50 and p99.',
        unit: 's',
        width: 6,
        targets: [
          {
            expr: `histogram_quantile(0.99, sum by (instance, le) (rate(kubeproxy_sync_proxy_rules_duration_seconds_bucket{${NODE}}${RATE})))`,
            legend: 'p99 {{instance}}',
          },
          {
            expr: `histogram_quantile(0.5, sum by (instance, le) (rate(kubeproxy_sync_proxy_rules_duration_seconds_bucket{${NODE}}${RATE})))`,
            legend: 'p50 {{instance}}',
          },
        ],
      },
      {
        title: 'Change waiting for a sync',
        description:
          'Age of the oldest Service change not yet synced; no line while none waits. /healthz turns 503 past 2 × --iptables-sync-period.',
        unit: 's',
        width: 6,
        targets: [
          {
            expr: `time() - (kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{${NODE}} > kubeproxy_sync_proxy_rules_last_timestamp_seconds{${NODE}})`,
            legend: '{{instance}}',
          },
        ],
      },
      {
        title: 'Network programming latency (p99)',
        description:
          'From an EndpointSlice change (its endpoints.kubernetes.io/last-change-trigger-time) to the proxy applying it. Empty without that annotation (manifests usually lack it).',
        unit: 's',
        targets: [
          {
            expr: `histogram_quantile(0.99, sum by (instance, le) (rate(kubeproxy_network_programming_duration_seconds_bucket{${NODE}}${RATE})))`,
            legend: '{{instance}}',
          },
        ],
      },
      {
        title: 'Service and endpoint changes',
        description: 'Service and EndpointSlice changes the proxy took in, per second.',
        unit: 'cps',
        targets: [
          {
            expr: `sum by (instance) (rate(kubeproxy_sync_proxy_rules_service_changes_total{${NODE}}${RATE}))`,
            legend: 'services {{instance}}',
          },
          {
            expr: `sum by (instance) (rate(kubeproxy_sync_proxy_rules_endpoint_changes_total{${NODE}}${RATE}))`,
            legend: 'endpoints {{instance}}',
          },
        ],
      },
      {
        title: 'iptables restore failures',
        description:
          'Failed iptables-restore runs in each interval. Each is retried as a full sync; the log line "Sync failed" shows the lines around the failing one.',
        unit: 'short',
        targets: [
          {
            expr: `sum by (instance) (increase(kubeproxy_sync_proxy_rules_iptables_restore_failures_total{${NODE}}${RATE}))`,
            legend: '{{instance}}',
          },
        ],
      },
    ],
  },
  {
    title: 'Service traffic',
    panels: [
      {
        title: 'New connections and UDP sessions',
        description: 'TCP connections accepted and UDP sessions opened per second, per service port.',
        unit: 'cps',
        targets: [
          {
            expr: `sum by (service, protocol) (rate(kup_service_connections_total{${SVC}}${RATE}))`,
            legend: '{{service}} {{protocol}}',
          },
        ],
      },
      {
        title: 'Open connections and UDP sessions',
        description: 'TCP connections and UDP sessions open now, per service port.',
        unit: 'short',
        targets: [
          {
            expr: `sum by (service, protocol) (kup_service_connections_active{${SVC}})`,
            legend: '{{service}} {{protocol}}',
          },
        ],
      },
      {
        title: 'Bytes relayed',
        description:
          'Bytes per second from clients (up) and to clients (down). Counted when a connection closes, so a long connection shows at its end.',
        unit: 'Bps',
        negativeY: '.*to_client.*',
        targets: [
          {
            expr: `sum by (service, direction) (rate(kup_service_bytes_total{${SVC}}${RATE}))`,
            legend: '{{service}} {{direction}}',
          },
        ],
      },
      {
        title: 'Closed for lack of endpoints',
        description:
          'Connections closed and datagrams dropped because the service port had no endpoint (before the next sync rejects them in the kernel).',
        unit: 'cps',
        targets: [
          {
            expr: `sum by (service, protocol) (rate(kup_service_no_endpoints_total{${SVC}}${RATE}))`,
            legend: '{{service}} {{protocol}}',
          },
        ],
      },
      {
        title: 'Rejected connections',
        description:
          'Connections closed at accept and UDP sessions not opened, by reason: limit (--max-connections-per-service), fd-exhausted, loop.',
        unit: 'cps',
        targets: [
          {
            expr: `sum by (service, reason) (rate(kup_service_connections_rejected_total{${SVC}}${RATE}))`,
            legend: '{{service}} {{reason}}',
          },
        ],
      },
      {
        title: 'Open connections per node',
        description: 'TCP connections and UDP sessions open now on each node, all chosen services.',
        unit: 'short',
        targets: [
          {
            expr: `sum by (instance) (kup_service_connections_active{${SVC}})`,
            legend: '{{instance}}',
          },
        ],
      },
    ],
  },
  {
    title: 'Endpoints',
    panels: [
      {
        title: 'Connect failures',
        description:
          'Failed connects to endpoints per second, by reason. A failed connect is retried on another endpoint; clients see it only when all fail.',
        unit: 'cps',
        targets: [
          {
            expr: `sum by (service, reason) (rate(kup_service_connect_failures_total{${SVC}}${RATE}))`,
            legend: '{{service}} {{reason}}',
          },
        ],
      },
      {
        title: 'Endpoint ejections',
        description:
          'Endpoints ejected by outlier detection (--outlier-consecutive-failures connect failures in a row) in each interval. /debug/services shows which, and until when.',
        unit: 'short',
        targets: [
          {
            expr: `sum by (service, protocol) (increase(kup_endpoint_ejections_total{${SVC}}${RATE}))`,
            legend: '{{service}} {{protocol}}',
          },
        ],
      },
      {
        title: 'Picks per endpoint (top 20)',
        description: 'How often the balancer chose each endpoint, per second.',
        unit: 'cps',
        targets: [
          {
            expr: `topk(20, sum by (service, endpoint) (rate(kup_service_endpoint_picks_total{${SVC}}${RATE})))`,
            legend: '{{service}} → {{endpoint}}',
          },
        ],
      },
      {
        title: 'Endpoints left out as forwarding loops',
        description:
          "Endpoints that are the proxy's own listeners (a proxy port, a NodePort, a service IP), left out of the balancer.",
        unit: 'short',
        width: 12,
        targets: [
          {
            expr: `sum by (service, protocol) (kup_forwarding_loop_endpoints{${SVC}})`,
            legend: '{{service}} {{protocol}}',
          },
        ],
      },
      {
        title: 'Local-policy services without local endpoints',
        description:
          'Service ports with a Local traffic policy and endpoints, none of them on this node: their traffic of that kind is dropped.',
        unit: 'short',
        width: 12,
        targets: [
          {
            expr: `sum by (traffic_policy) (kubeproxy_sync_proxy_rules_no_local_endpoints_total{${NODE}})`,
            legend: '{{traffic_policy}}',
          },
        ],
      },
    ],
  },
  {
    title: 'UDP',
    panels: [
      {
        title: 'UDP sessions and their cap',
        description: 'UDP sessions open across all service ports, and --udp-max-sessions-total.',
        unit: 'short',
        targets: [
          { expr: `sum by (instance) (kup_udp_sessions{${NODE}})`, legend: 'open {{instance}}' },
          { expr: `max by (instance) (kup_udp_sessions_max{${NODE}})`, legend: 'cap {{instance}}' },
        ],
      },
      {
        title: 'UDP sessions opened',
        description: 'UDP sessions opened per second, per service port.',
        unit: 'cps',
        targets: [
          {
            expr: `sum by (service) (rate(kup_service_connections_total{${SVC}, protocol="UDP"}${RATE}))`,
            legend: '{{service}}',
          },
        ],
      },
      {
        title: 'UDP sessions evicted',
        description:
          'Sessions evicted (the idlest) because --udp-max-sessions or --udp-max-sessions-total was reached.',
        unit: 'cps',
        targets: [
          {
            expr: `sum by (service) (rate(kup_udp_sessions_evicted_total{${SVC}}${RATE}))`,
            legend: '{{service}}',
          },
        ],
      },
      {
        title: 'UDP sessions open per service',
        description: 'UDP sessions open now, per service port.',
        unit: 'short',
        width: 12,
        targets: [
          {
            expr: `sum by (service) (kup_service_connections_active{${SVC}, protocol="UDP"})`,
            legend: '{{service}}',
          },
        ],
      },
      {
        title: 'UDP sessions whose endpoint left',
        description: 'Sessions closed because their endpoint went away; the next datagram picks a live one.',
        unit: 'cps',
        width: 12,
        targets: [
          {
            expr: `sum by (service) (rate(kup_udp_sessions_endpoint_removed_total{${SVC}}${RATE}))`,
            legend: '{{service}}',
          },
        ],
      },
    ],
  },
  {
    title: 'Resources',
    panels: [
      {
        title: 'File descriptors in use',
        description:
          'Open descriptors over the limit. Each TCP connection holds two; past the limit new connections are shed (see the panel beside).',
        unit: 'percentunit',
        max: 1,
        targets: [
          {
            expr: `process_open_fds{${NODE}} / process_max_fds{${NODE}}`,
            legend: '{{instance}}',
          },
        ],
      },
      {
        title: 'Out of file descriptors',
        description:
          'Times an accept, connect or UDP session found no descriptor (EMFILE/ENFILE) in each interval, by operation.',
        unit: 'short',
        targets: [
          {
            expr: `sum by (instance, operation) (increase(kup_fd_exhausted_total{${NODE}}${RATE}))`,
            legend: '{{instance}} {{operation}}',
          },
        ],
      },
      {
        title: 'CPU',
        description: 'CPU time of the process (100% = one core). The data path runs on one thread.',
        unit: 'percentunit',
        targets: [
          {
            expr: `sum by (instance) (rate(process_cpu_seconds_total{${NODE}}${RATE}))`,
            legend: '{{instance}}',
          },
        ],
      },
      {
        title: 'Memory',
        description: 'Resident memory and the JavaScript heap in use.',
        unit: 'bytes',
        targets: [
          { expr: `sum by (instance) (process_resident_memory_bytes{${NODE}})`, legend: 'rss {{instance}}' },
          { expr: `sum by (instance) (nodejs_heap_size_used_bytes{${NODE}})`, legend: 'heap {{instance}}' },
        ],
      },
      {
        title: 'Event loop delay (p99)',
        description:
          'How late the event loop ran, p99 between scrapes: every relayed byte can wait this long. Warns (KubeUserspaceProxyEventLoopLag) past 100 ms.',
        unit: 's',
        targets: [
          {
            expr: `max by (instance) (nodejs_eventloop_lag_p99_seconds{${NODE}})`,
            legend: '{{instance}}',
          },
        ],
      },
      {
        title: 'Garbage collection',
        description: 'Share of time spent in garbage collection.',
        unit: 'percentunit',
        targets: [
          {
            expr: `sum by (instance) (rate(nodejs_gc_duration_seconds_sum{${NODE}}${RATE}))`,
            legend: '{{instance}}',
          },
        ],
      },
      {
        title: 'Trace followers',
        description:
          'Subscribers of the live trace stream (/debug/trace followers), how many it takes, and subscriptions refused in each interval because that many were following.',
        unit: 'short',
        width: 12,
        targets: [
          { expr: `sum by (instance) (kup_trace_followers{${NODE}})`, legend: 'following {{instance}}' },
          { expr: `max by (instance) (kup_trace_followers_max{${NODE}})`, legend: 'max {{instance}}' },
          {
            expr: `sum by (instance) (increase(kup_trace_followers_refused_total{${NODE}}${RATE}))`,
            legend: 'refused {{instance}}',
          },
        ],
      },
      {
        title: 'Trace events not delivered',
        description:
          'Trace events a follower did not get, per second: slow-follower (it did not read), over-budget (the stream spent its CPU budget).',
        unit: 'cps',
        width: 12,
        targets: [
          {
            expr: `sum by (instance, reason) (rate(kup_trace_events_dropped_total{${NODE}}${RATE}))`,
            legend: '{{instance}} {{reason}}',
          },
        ],
      },
    ],
  },
];

const PANEL_HEIGHT = 8;

function panelJson(p: Panel, id: number, gridPos: { h: number; w: number; x: number; y: number }) {
  const targets = p.targets.map((t, i) => ({
    datasource: DS,
    editorMode: 'code',
    expr: t.expr,
    legendFormat: t.legend,
    range: true,
    refId: String.fromCharCode(65 + i),
  }));
  const common = { id, title: p.title, description: p.description, datasource: DS, gridPos, targets };
  if (p.stat !== undefined) {
    return {
      ...common,
      type: 'stat',
      fieldConfig: {
        defaults: {
          unit: p.unit,
          thresholds: {
            mode: 'absolute',
            steps: p.stat.thresholds.map(([value, color], i) => ({ color, value: i === 0 ? null : value })),
          },
        },
        overrides: [],
      },
      options: {
        colorMode: 'background',
        graphMode: 'none',
        justifyMode: 'auto',
        orientation: 'auto',
        reduceOptions: { calcs: ['lastNotNull'], fields: '', values: false },
        textMode: 'auto',
      },
    };
  }
  return {
    ...common,
    type: 'timeseries',
    fieldConfig: {
      defaults: {
        unit: p.unit,
        ...(p.negativeY === undefined ? { min: 0 } : {}),
        ...(p.max === undefined ? {} : { max: p.max }),
        custom: { drawStyle: 'line', fillOpacity: 10, lineWidth: 1, showPoints: 'never', spanNulls: false },
      },
      overrides:
        p.negativeY === undefined
          ? []
          : [
              {
                matcher: { id: 'byRegexp', options: p.negativeY },
                properties: [{ id: 'custom.transform', value: 'negative-Y' }],
              },
            ],
    },
    options: {
      legend: { calcs: [], displayMode: 'list', placement: 'bottom', showLegend: true },
      tooltip: { mode: 'multi', sort: 'desc' },
    },
  };
}

function queryVariable(name: string, label: string, query: string, all: boolean) {
  return {
    name,
    label,
    type: 'query',
    datasource: DS,
    definition: query,
    // A string, as Grafana's Prometheus data source migrates it into its editor's fields (an object with
    // `qryType` would need those fields filled in, or the editor rewrites it to `label_values(undefined)`).
    query,
    refresh: 2,
    sort: 1,
    hide: 0,
    regex: '',
    current: {},
    options: [],
    multi: all,
    includeAll: all,
    ...(all ? { allValue: '.*' } : {}),
    skipUrlSync: false,
  };
}

/** The dashboard as Grafana's JSON model (the classic one every Grafana imports). */
export function buildDashboard() {
  const panels: unknown[] = [];
  let id = 1;
  let y = 0;
  for (const row of ROWS) {
    panels.push({
      id: id++,
      type: 'row',
      title: row.title,
      collapsed: false,
      gridPos: { h: 1, w: 24, x: 0, y },
      panels: [],
    });
    y += 1;
    let x = 0;
    for (const p of row.panels) {
      const w = p.width ?? 8;
      if (x + w > 24) {
        x = 0;
        y += PANEL_HEIGHT;
      }
      panels.push(panelJson(p, id++, { h: PANEL_HEIGHT, w, x, y }));
      x += w;
    }
    y += PANEL_HEIGHT;
  }
  return {
    id: null,
    uid: 'kube-userspace-proxy',
    title: 'kube-userspace-proxy',
    description:
      "kube-userspace-proxy: kube-proxy's sync metrics and the proxy's per-service traffic, endpoints, UDP sessions and resources.",
    tags: ['kubernetes', 'kube-proxy', 'kube-userspace-proxy'],
    schemaVersion: 41,
    version: 1,
    editable: true,
    graphTooltip: 1,
    liveNow: false,
    refresh: '30s',
    time: { from: 'now-1h', to: 'now' },
    timepicker: {},
    timezone: 'browser',
    links: [],
    annotations: {
      list: [
        {
          builtIn: 1,
          datasource: { type: 'grafana', uid: '-- Grafana --' },
          enable: true,
          hide: true,
          iconColor: 'rgba(0, 211, 255, 1)',
          name: 'Annotations & Alerts',
          type: 'dashboard',
        },
      ],
    },
    templating: {
      list: [
        {
          name: 'datasource',
          label: 'Data source',
          type: 'datasource',
          query: 'prometheus',
          current: {},
          hide: 0,
          includeAll: false,
          multi: false,
          options: [],
          refresh: 1,
          regex: '',
          skipUrlSync: false,
        },
        // kup_udp_sessions_max: always exported, and only by this proxy (kube-proxy shares the kubeproxy_ names).
        queryVariable('job', 'Job', 'label_values(kup_udp_sessions_max, job)', false),
        queryVariable('instance', 'Node', 'label_values(kup_udp_sessions_max{job=~"$job"}, instance)', true),
        queryVariable(
          'service',
          'Service port',
          'label_values(kup_service_connections_total{job=~"$job", instance=~"$instance"}, service)',
          true,
        ),
      ],
    },
    panels,
  };
}

export const DASHBOARD_FILE = fileURLToPath(new URL('kube-userspace-proxy.json', import.meta.url));

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  writeFileSync(DASHBOARD_FILE, `${JSON.stringify(buildDashboard(), null, 2)}\n`);
  const biome = fileURLToPath(new URL('../../node_modules/.bin/biome', import.meta.url));
  execFileSync(biome, ['format', '--write', DASHBOARD_FILE], { stdio: 'inherit' });
  console.log(`wrote ${DASHBOARD_FILE}`);
}
