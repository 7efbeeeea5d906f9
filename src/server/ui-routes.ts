// The live console's routes on the metrics server: the page and its files (ui-assets.ts) and three small
// JSON endpoints it polls: /ui/api/overview (sync health, totals), /ui/api/services (one page of service
// ports) and /ui/api/connections (one page of the table). The trace stream is /debug/trace itself. Reads
// only what the proxier, the tracer and the metrics already keep; rates are sampled when the console asks.
import type http from 'node:http';
import type { Config } from '../config/config.ts';
import type { Logger } from '../lib/log.ts';
import { jsonSafe } from '../lib/printable.ts';
import type { Proxier, ServicePortStatus } from '../proxier/proxier.ts';
import type {
  ConnectionListing,
  ConnectionRecord,
  ConnectionState,
  ConnectionTable,
  ListOptions,
} from '../trace/connection-table.ts';
import type { Tracer } from '../trace/tracer.ts';
import type { Route } from './http.ts';
import { sendText } from './http.ts';
import type { ProxyMetrics } from './metrics.ts';
import type { ProxyHealth } from './proxy-health.ts';
import { RateHistory, type RateHistoryOptions, type ReadCounters } from './rate-history.ts';
import { UI_SECURITY_HEADERS, uiAssetRoutes } from './ui-assets.ts';
import { type ConnectionsQuery, listOptionsOf, PROTOCOL_FILTERS, uiConnections } from './ui-connections.ts';
import { uiOverview } from './ui-overview.ts';
import { SERVICE_SORTS, type ServiceSort, uiServices } from './ui-services.ts';

/** What the console reads: the running proxy's parts (ProxyServer has them all). */
export interface UiSource {
  readonly proxier: Proxier;
  readonly connections: ConnectionTable;
  /** The connection table of the whole proxy (with --workers, every process's). */
  listConnections(options: ListOptions): Promise<ConnectionListing>;
  readonly tracer: Tracer;
  readonly health: ProxyHealth;
  readonly state: { readonly pendingServiceChanges: number; readonly pendingEndpointChanges: number };
  readonly metrics: ProxyMetrics;
  readonly config: Config;
  readonly nodeName: string;
  readonly log: Logger;
}

export type UiRoutesOptions = {
  history?: RateHistoryOptions;
  now?: () => number;
  /** The rate history is let go this long after the console last asked (default a minute). */
  releaseAfterMs?: number;
};

const RELEASE_AFTER_MS = 60_000;

/** Rows a page holds at most. */
export const MAX_PAGE = 500;
const MAX_QUERY_CHARS = 256;

type Parsed<T> = { ok: T; error?: undefined } | { ok?: undefined; error: string };

/** The console's routes, to merge into the metrics server's. */
export function uiRoutes(source: UiSource, options: UiRoutesOptions = {}): Record<string, Route> {
  const now = options.now ?? Date.now;
  const history = new RateHistory(options.history);
  const log = source.log.child({ component: 'ui' });
  // Nobody looking: the history (up to 2.4 KB a busy service port) goes, rather than wait for the next look.
  let release: NodeJS.Timeout | undefined;
  /** The running ports, and a rate sample from them when one is due. */
  const running = async (nowMs: number): Promise<ServicePortStatus[]> => {
    // The open connections of every process (--workers), only when a sample is due.
    const live = history.due(nowMs) ? (await source.listConnections({ state: 'active' })).active : [];
    const status = source.proxier.status();
    if (history.maybeSample(nowMs, readCounters(status, live))) {
      release ??= setTimeout(() => history.clear(), options.releaseAfterMs ?? RELEASE_AFTER_MS).unref();
      release.refresh();
    }
    return status;
  };
  return {
    ...uiAssetRoutes(log),
    '/ui/api/overview': async (_req, res) => {
      const nowMs = now();
      const status = await running(nowMs);
      let active = 0;
      let accepted = 0;
      for (const s of status) {
        active += s.context.stats.active;
        accepted += s.context.stats.accepted;
      }
      const restoreFailures = (await source.metrics.iptablesRestoreFailures.get()).values[0]?.value ?? 0;
      const p = source.proxier;
      sendJson(
        res,
        uiOverview({
          nowMs,
          nodeName: source.nodeName,
          iptables: source.config.iptables,
          trace: source.config.trace,
          health: source.health.status(nowMs),
          lastSyncMs: source.health.lastUpdatedMs,
          lastSync: p.lastSyncResult,
          pendingServiceChanges: source.state.pendingServiceChanges,
          pendingEndpointChanges: source.state.pendingEndpointChanges,
          iptablesRestoreFailures: restoreFailures,
          servicePorts: status.length + p.failures().size,
          failedServicePorts: p.failures().size,
          active,
          accepted,
          times: history.times(),
          rates: history.totals(),
          connections: {
            active: source.connections.activeCount,
            recent: source.connections.recentCount,
            dropped: source.connections.dropped,
          },
          tracer: source.tracer.stats(),
        }),
      );
    },
    '/ui/api/services': async (_req, res, url) => {
      const q = url.searchParams.get('q') ?? '';
      const sort = url.searchParams.get('sort') || 'name';
      const offset = count(url, 'offset', 0);
      const limit = count(url, 'limit', 50);
      const expand = url.searchParams.get('expand') || undefined;
      const error =
        offset.error ??
        limit.error ??
        (q.length > MAX_QUERY_CHARS ? `q is longer than ${MAX_QUERY_CHARS} characters` : undefined) ??
        (SERVICE_SORTS.includes(sort as ServiceSort)
          ? undefined
          : `invalid sort "${sort}": expected ${SERVICE_SORTS.join(', ')}`);
      if (error !== undefined) return sendText(res, 400, `${error}\n`);
      const nowMs = now();
      const p = source.proxier;
      sendJson(
        res,
        uiServices(
          {
            running: await running(nowMs),
            failures: p.failures(),
            nodePortErrors: p.nodePortErrors(),
            history,
            nowMs,
          },
          { q, sort: sort as ServiceSort, offset: offset.ok!, limit: limit.ok!, expand },
        ),
      );
    },
    '/ui/api/connections': async (_req, res, url) => {
      const get = (name: string) => url.searchParams.get(name) || undefined;
      const state = get('state') ?? 'all';
      const protocol = get('protocol');
      const offset = count(url, 'offset', 0);
      const limit = count(url, 'limit', 100);
      const error =
        offset.error ??
        limit.error ??
        (state === 'active' || state === 'closed' || state === 'all'
          ? undefined
          : `invalid state "${state}": expected active, closed or all`) ??
        (protocol === undefined || PROTOCOL_FILTERS.includes(protocol)
          ? undefined
          : `invalid protocol "${protocol}": expected ${PROTOCOL_FILTERS.join(', ')}`);
      if (error !== undefined) return sendText(res, 400, `${error}\n`);
      const query: ConnectionsQuery = {
        service: get('service'),
        client: get('client'),
        endpoint: get('endpoint'),
        protocol,
        state: state === 'all' ? undefined : (state as ConnectionState),
        offset: offset.ok!,
        limit: limit.ok!,
      };
      sendJson(res, uiConnections(await source.listConnections(listOptionsOf(query)), query));
    },
  };
}

/**
 * Every service port's counters for a rate sample: connections accepted, bytes each way (those of closed
 * connections, which the relays count, plus what the table's active connections carried so far, so that
 * a long connection shows as it goes, not at its close) and no-endpoint closes.
 */
function readCounters(
  status: readonly ServicePortStatus[],
  active: readonly ConnectionRecord[],
): ReadCounters {
  return (visit) => {
    const live = new Map<string, { in: number; out: number }>();
    for (const r of active) {
      const key = `${r.service}/${r.protocol}`;
      const sum = live.get(key);
      if (sum === undefined) live.set(key, { in: r.bytesFromClient, out: r.bytesToClient });
      else {
        sum.in += r.bytesFromClient;
        sum.out += r.bytesToClient;
      }
    }
    for (const s of status) {
      const st = s.context.stats;
      const l = live.get(s.servicePort.key);
      visit(
        s.servicePort.key,
        st.accepted,
        st.bytesFromClients + (l?.in ?? 0),
        st.bytesToClients + (l?.out ?? 0),
        st.noEndpoints,
      );
    }
  };
}

function count(url: URL, name: string, fallback: number): Parsed<number> {
  const v = url.searchParams.get(name);
  if (v === null || v === '') return { ok: fallback };
  if (!/^\d{1,9}$/.test(v)) return { error: `invalid ${name} "${v}": expected a non-negative integer` };
  const n = Number(v);
  if (name === 'limit' && (n < 1 || n > MAX_PAGE))
    return { error: `invalid limit "${v}": expected 1 to ${MAX_PAGE}` };
  return { ok: n };
}

/** As http.ts's sendJSON, never cached, with the console's headers; client text made safe as the trace's. */
function sendJson(res: http.ServerResponse, body: unknown): void {
  const text = jsonSafe(JSON.stringify(body));
  res.writeHead(200, {
    'Content-Type': 'application/json',
    'Cache-Control': 'no-store',
    'Content-Length': Buffer.byteLength(text),
    ...UI_SECURITY_HEADERS,
  });
  res.end(text);
}
