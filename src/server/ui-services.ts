// /ui/api/services: the console's service port list, filtered, sorted and cut to one page on the server (a
// node may run 10,000 service ports; the page shows 50), each row with its addresses, endpoint states,
// counters and the latest rates; the one expanded port also with its endpoints one by one (state, picks,
// ejected until when) and its rate series. Pure: builds the body from proxier status and the rate history.
import type { ProxyError } from '../lib/errors.ts';
import type { ServicePortStatus } from '../proxier/proxier.ts';
import type { Endpoint } from '../state/endpoint.ts';
import { parseServicePortKey, type ServicePortKey } from '../state/service-port.ts';
import type { DebugServicePort } from './debug.ts';
import type { RateHistory, RateSeries } from './rate-history.ts';

export const SERVICE_SORTS = ['name', 'active', 'rate', 'failures'] as const;
export type ServiceSort = (typeof SERVICE_SORTS)[number];

export type ServicesQuery = {
  /** Part of the name, the start of an IP (cluster, external, LB or endpoint), or a port number. */
  readonly q: string;
  readonly sort: ServiceSort;
  readonly offset: number;
  readonly limit: number;
  /** The key (`ns/name:port/PROTO`) of the port to describe in full. */
  readonly expand: string | undefined;
};

/** Most endpoints listed for the expanded port (a Service may have thousands). */
export const MAX_LISTED_ENDPOINTS = 1000;

export type EndpointState = 'ready' | 'serving' | 'terminating' | 'ejected';

export type UiEndpoint = {
  endpoint: string;
  state: EndpointState;
  /** ISO time the ejection ends, for `ejected`. */
  ejectedUntil?: string;
  /** On this node (the node-local list of a Local traffic policy uses it). */
  local: boolean;
  picks: number;
};

export type UiServicePort = {
  key: string;
  service: string;
  protocol: 'TCP' | 'UDP';
  clusterIPs: readonly string[];
  port: number;
  nodePort: number;
  externalIPs: readonly string[];
  loadBalancerIPs: readonly string[];
  proxyPort: number;
  localProxyPort: number;
  sessionAffinity: 'None' | 'ClientIP';
  /** The port's trace annotation, when it overrides --trace. */
  trace?: string;
  /** The PROXY protocol header its TCP connections send their endpoints, when they send one. */
  proxyProtocol?: 'v1' | 'v2';
  endpointCounts: { total: number; ready: number; terminating: number; ejected: number; loop: number };
  /** /debug/services' counters, and the connections turned away by reason. */
  connections: DebugServicePort['connections'] & { rejected: Record<string, number> };
  /** The newest rates: connections/s, bytes/s from and to clients, no-endpoint closes/s. */
  rates: number[];
  /** Connections/s over the window (aligned with the body's `times`); null when idle the whole window. */
  spark: (number | null)[] | null;
  error?: { code: string; message: string };
};

export type UiServiceDetail = UiServicePort & {
  endpoints: UiEndpoint[];
  /** Endpoints not listed past MAX_LISTED_ENDPOINTS. */
  moreEndpoints: number;
  /** Endpoints left out because they lead back to this proxy. */
  loopEndpoints: readonly string[];
  /** Every series over the window, aligned with `times`; null when idle the whole window. */
  series: RateSeries | null;
};

export type UiServicesBody = {
  /** Service ports in all (running and failed). */
  total: number;
  /** Those the query matched. */
  matched: number;
  offset: number;
  limit: number;
  /** Sample times (epoch ms) of every series in the body. */
  times: number[];
  items: UiServicePort[];
  /** The expanded port, when the query names one that exists (on this page or not). */
  detail?: UiServiceDetail;
};

export type ServicesInput = {
  running: readonly ServicePortStatus[];
  failures: ReadonlyMap<ServicePortKey, ProxyError>;
  nodePortErrors: ReadonlyMap<ServicePortKey, ProxyError>;
  history: RateHistory;
  nowMs: number;
};

/** One row per service port that should run, as the query asks. */
export function uiServices(input: ServicesInput, query: ServicesQuery): UiServicesBody {
  const { running, failures, history } = input;
  const rows: Row[] = [];
  const q = query.q.trim().toLowerCase();
  for (const s of running) if (q === '' || matchesRunning(s, q)) rows.push({ s, key: s.servicePort.key });
  for (const [key, err] of failures)
    if (q === '' || key.toLowerCase().includes(q)) rows.push({ key, failed: err });
  sortRows(rows, query.sort, history);
  const page = rows.slice(query.offset, query.offset + query.limit);
  const body: UiServicesBody = {
    total: running.length + failures.size,
    matched: rows.length,
    offset: query.offset,
    limit: query.limit,
    times: history.times(),
    items: page.map((r) => rowOf(r, input)),
  };
  const expand = query.expand;
  if (expand !== undefined) {
    const found = running.find((s) => s.servicePort.key === expand);
    const failed = failures.get(expand as ServicePortKey);
    if (found !== undefined) body.detail = detailOf(found, input);
    else if (failed !== undefined)
      body.detail = {
        ...rowOf({ key: expand, failed }, input),
        endpoints: [],
        moreEndpoints: 0,
        loopEndpoints: [],
        series: null,
      };
  }
  return body;
}

type Row = { key: string; s?: ServicePortStatus; failed?: ProxyError };

function matchesRunning(s: ServicePortStatus, q: string): boolean {
  const sp = s.servicePort;
  if (sp.name.toLowerCase().includes(q)) return true;
  if (/^\d{1,5}$/.test(q)) {
    const n = Number(q);
    return sp.port === n || sp.nodePort === n || s.proxyPort === n || s.localProxyPort === n;
  }
  const starts = (ip: string) => ip.toLowerCase().startsWith(q);
  return (
    sp.clusterIPs.some(starts) ||
    sp.externalIPs.some(starts) ||
    sp.loadBalancerIPs.some(starts) ||
    s.endpoints.some((e) => starts(e.key)) ||
    s.localEndpoints.some((e) => starts(e.key))
  );
}

function sortRows(rows: Row[], sort: ServiceSort, history: RateHistory): void {
  const byName = (a: Row, b: Row) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0);
  if (sort === 'name') {
    rows.sort(byName);
    return;
  }
  // Computed once per row, not per comparison.
  const weight = new Map<string, number>();
  for (const r of rows) {
    const stats = r.s?.context.stats;
    let w = 0;
    if (stats !== undefined) {
      if (sort === 'active') w = stats.active;
      else if (sort === 'rate') w = history.latest(r.key)[0]!;
      else w = stats.connectFailed + stats.noEndpoints;
    }
    weight.set(r.key, w);
  }
  rows.sort((a, b) => weight.get(b.key)! - weight.get(a.key)! || byName(a, b));
}

function rowOf(r: Row, input: ServicesInput): UiServicePort {
  if (r.s === undefined) {
    const { name, protocol } = parseServicePortKey(r.key as ServicePortKey);
    return {
      key: r.key,
      service: name,
      protocol,
      clusterIPs: [],
      port: 0,
      nodePort: 0,
      externalIPs: [],
      loadBalancerIPs: [],
      proxyPort: 0,
      localProxyPort: 0,
      sessionAffinity: 'None',
      endpointCounts: { total: 0, ready: 0, terminating: 0, ejected: 0, loop: 0 },
      connections: {
        accepted: 0,
        active: 0,
        noEndpoints: 0,
        connectFailed: 0,
        connectFailures: {},
        rejected: {},
      },
      rates: [0, 0, 0, 0],
      spark: null,
      error: { code: r.failed!.code, message: r.failed!.message },
    };
  }
  const { servicePort: sp, context } = r.s;
  const stats = context.stats;
  const ejected = context.balancer.outlier?.ejected(input.nowMs) ?? [];
  const counts = {
    total: 0,
    ready: 0,
    terminating: 0,
    ejected: ejected.length,
    loop: r.s.loopEndpoints.length,
  };
  for (const e of allEndpoints(r.s)) {
    counts.total++;
    if (e.terminating) counts.terminating++;
    else if (e.ready) counts.ready++;
  }
  const err = input.nodePortErrors.get(sp.key);
  return {
    key: sp.key,
    service: sp.name,
    protocol: sp.protocol,
    clusterIPs: sp.clusterIPs,
    port: sp.port,
    nodePort: sp.nodePort,
    externalIPs: sp.externalIPs,
    loadBalancerIPs: sp.loadBalancerIPs,
    proxyPort: r.s.proxyPort,
    localProxyPort: r.s.localProxyPort,
    sessionAffinity: sp.sessionAffinity,
    ...(sp.trace === undefined ? {} : { trace: sp.trace }),
    ...(r.s.proxyProtocol === undefined ? {} : { proxyProtocol: r.s.proxyProtocol }),
    endpointCounts: counts,
    connections: {
      accepted: stats.accepted,
      active: stats.active,
      noEndpoints: stats.noEndpoints,
      connectFailed: stats.connectFailed,
      connectFailures: { ...stats.connectFailures },
      rejected: { ...stats.rejected },
    },
    rates: input.history.latest(sp.key),
    spark: input.history.one(sp.key, 0) ?? null,
    ...(err === undefined ? {} : { error: { code: err.code, message: err.message } }),
  };
}

/** The endpoints of both lists, each once (the node-local list is a subset of the merged endpoints). */
function allEndpoints(s: ServicePortStatus): Endpoint[] {
  if (s.localEndpoints.length === 0) return [...s.endpoints];
  const seen = new Map<string, Endpoint>();
  for (const e of s.endpoints) seen.set(e.key, e);
  for (const e of s.localEndpoints) if (!seen.has(e.key)) seen.set(e.key, e);
  return [...seen.values()];
}

function detailOf(s: ServicePortStatus, input: ServicesInput): UiServiceDetail {
  const row = rowOf({ key: s.servicePort.key, s }, input);
  const stats = s.context.stats;
  const until = new Map<string, number>();
  for (const e of s.context.balancer.outlier?.ejected(input.nowMs) ?? []) until.set(e.endpoint, e.untilMs);
  const all = allEndpoints(s).sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
  const endpoints = all.slice(0, MAX_LISTED_ENDPOINTS).map((e): UiEndpoint => {
    const untilMs = until.get(e.key);
    return {
      endpoint: e.key,
      state: untilMs !== undefined ? 'ejected' : endpointState(e),
      ...(untilMs === undefined ? {} : { ejectedUntil: new Date(untilMs).toISOString() }),
      local: e.isLocal,
      picks: stats.picks.get(e.key) ?? 0,
    };
  });
  return {
    ...row,
    endpoints,
    moreEndpoints: all.length - endpoints.length,
    loopEndpoints: [...s.loopEndpoints].sort(),
    series: input.history.series(s.servicePort.key) ?? null,
  };
}

function endpointState(e: Endpoint): EndpointState {
  if (e.terminating) return 'terminating';
  return e.ready ? 'ready' : 'serving';
}
