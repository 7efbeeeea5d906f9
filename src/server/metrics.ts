// Prometheus metrics (prom-client): kube-proxy's sync metrics, plus per service port counters that the
// data path keeps as plain fields and that are read only when scraped.
import client from 'prom-client';
import type { Config } from '../config/config.ts';
import type { Proxier } from '../proxier/proxier.ts';
import { configz } from './configz.ts';
import type { Route } from './http.ts';
import { sendJSON, sendText } from './http.ts';

export type ProxyMetrics = {
  registry: client.Registry;
  syncDuration: client.Histogram;
  lastSync: client.Gauge;
  lastQueued: client.Gauge;
  serviceChangesTotal: client.Counter;
  endpointChangesTotal: client.Counter;
  networkProgrammingDuration: client.Histogram;
  iptablesRestoreFailures: client.Counter;
};

export function createMetrics(getProxier: () => Proxier | undefined): ProxyMetrics {
  const registry = new client.Registry();
  client.collectDefaultMetrics({ register: registry });
  const syncDuration = new client.Histogram({
    name: 'kubeproxy_sync_proxy_rules_duration_seconds',
    help: 'SyncProxyRules latency in seconds',
    buckets: client.exponentialBuckets(0.001, 2, 15),
    registers: [registry],
  });
  const lastSync = new client.Gauge({
    name: 'kubeproxy_sync_proxy_rules_last_timestamp_seconds',
    help: 'The last time proxy rules were successfully synced',
    registers: [registry],
  });
  const lastQueued = new client.Gauge({
    name: 'kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds',
    help: 'The last time a sync of proxy rules was queued',
    registers: [registry],
  });
  const serviceChangesTotal = new client.Counter({
    name: 'kubeproxy_sync_proxy_rules_service_changes_total',
    help: 'Cumulative proxy rules Service changes',
    registers: [registry],
  });
  const endpointChangesTotal = new client.Counter({
    name: 'kubeproxy_sync_proxy_rules_endpoint_changes_total',
    help: 'Cumulative proxy rules Endpoint changes',
    registers: [registry],
  });
  const networkProgrammingDuration = new client.Histogram({
    name: 'kubeproxy_network_programming_duration_seconds',
    help: 'In Cluster Network Programming Latency in seconds',
    buckets: [0.25, 0.5, ...range(1, 59, 1), ...range(60, 115, 5), ...range(120, 300, 30)],
    registers: [registry],
  });
  const iptablesRestoreFailures = new client.Counter({
    name: 'kubeproxy_sync_proxy_rules_iptables_restore_failures_total',
    help: 'Cumulative proxy iptables restore failures',
    registers: [registry],
  });

  const labels = ['service', 'protocol'];
  type Setter = (l: Record<string, string>, v: number) => void;
  // Values live on the data path as plain fields; these metrics copy them only when scraped.
  const perService = (
    name: string,
    help: string,
    type: 'counter' | 'gauge',
    extra: string[],
    read: (set: Setter) => void,
  ) => {
    const labelNames = [...labels, ...extra];
    if (type === 'counter') {
      new client.Counter({
        name,
        help,
        labelNames,
        registers: [registry],
        collect() {
          this.reset();
          read((l, v) => this.inc(l, v));
        },
      });
    } else {
      new client.Gauge({
        name,
        help,
        labelNames,
        registers: [registry],
        collect() {
          this.reset();
          read((l, v) => this.set(l, v));
        },
      });
    }
  };
  const each = (
    fn: (service: string, protocol: string, s: ReturnType<Proxier['status']>[number]) => void,
  ) => {
    const p = getProxier();
    if (p === undefined) return;
    for (const s of p.status()) fn(s.servicePort.name, s.servicePort.protocol, s);
  };
  perService(
    'kup_service_connections_total',
    'Connections accepted (TCP) or sessions opened (UDP) per service port',
    'counter',
    [],
    (set) => each((service, protocol, s) => set({ service, protocol }, s.context.stats.accepted)),
  );
  perService(
    'kup_service_connections_active',
    'Open TCP connections or UDP sessions per service port',
    'gauge',
    [],
    (set) => each((service, protocol, s) => set({ service, protocol }, s.context.stats.active)),
  );
  perService(
    'kup_service_bytes_total',
    'Bytes relayed per service port, of closed connections',
    'counter',
    ['direction'],
    (set) =>
      each((service, protocol, s) => {
        set({ service, protocol, direction: 'from_client' }, s.context.stats.bytesFromClients);
        set({ service, protocol, direction: 'to_client' }, s.context.stats.bytesToClients);
      }),
  );
  perService(
    'kup_service_no_endpoints_total',
    'Connections closed or datagrams dropped for lack of endpoints',
    'counter',
    [],
    (set) => each((service, protocol, s) => set({ service, protocol }, s.context.stats.noEndpoints)),
  );
  perService(
    'kup_service_connect_failures_total',
    'Failed connect attempts to endpoints, by reason',
    'counter',
    ['reason'],
    (set) =>
      each((service, protocol, s) => {
        for (const [reason, n] of Object.entries(s.context.stats.connectFailures))
          set({ service, protocol, reason }, n);
      }),
  );
  perService(
    'kup_service_endpoint_picks_total',
    'Times the load balancer chose each endpoint',
    'counter',
    ['endpoint'],
    (set) =>
      each((service, protocol, s) => {
        for (const [endpoint, n] of s.context.stats.picks) set({ service, protocol, endpoint }, n);
      }),
  );
  perService(
    'kup_endpoint_ejections_total',
    'Endpoints ejected by passive outlier detection (consecutive connect failures)',
    'counter',
    [],
    (set) => each((service, protocol, s) => set({ service, protocol }, s.context.stats.ejections)),
  );
  perService(
    'kup_udp_sessions_evicted_total',
    'UDP sessions evicted because the per-service or total cap was reached',
    'counter',
    [],
    (set) =>
      each((service, protocol, s) => {
        if (protocol === 'UDP') set({ service, protocol }, s.context.stats.udpSessionsEvicted);
      }),
  );
  perService(
    'kup_udp_sessions_endpoint_removed_total',
    'UDP sessions closed because their endpoint left (the next datagram picks a live one)',
    'counter',
    [],
    (set) =>
      each((service, protocol, s) => {
        if (protocol === 'UDP') set({ service, protocol }, s.context.stats.udpSessionsEndpointRemoved);
      }),
  );
  // kube-proxy's gauge: service ports with endpoints whose Local policy leaves none on this node (their
  // traffic of that kind is dropped).
  new client.Gauge({
    name: 'kubeproxy_sync_proxy_rules_no_local_endpoints_total',
    help: 'Number of services with a Local traffic policy and no endpoints',
    labelNames: ['traffic_policy'],
    registers: [registry],
    collect() {
      let internal = 0;
      let external = 0;
      each((_service, _protocol, s) => {
        const sp = s.servicePort;
        const { IPv4, IPv6 } = s.portalEndpoints;
        const noLocal = (IPv4.any && !IPv4.local) || (IPv6.any && !IPv6.local);
        if (noLocal && sp.internalPolicyLocal) internal++;
        if (noLocal && sp.externalPolicyLocal) external++;
      });
      this.set({ traffic_policy: 'internal' }, internal);
      this.set({ traffic_policy: 'external' }, external);
    },
  });
  return {
    registry,
    syncDuration,
    lastSync,
    lastQueued,
    serviceChangesTotal,
    endpointChangesTotal,
    networkProgrammingDuration,
    iptablesRestoreFailures,
  };
}

function range(from: number, to: number, step: number): number[] {
  const out: number[] = [];
  for (let v = from; v <= to; v += step) out.push(v);
  return out;
}

/**
 * The metrics server's own routes, as kube-proxy's: /metrics, /proxyMode, /configz (the effective
 * KubeProxyConfiguration keyed by its API group, see configz.ts) and a plain /healthz.
 */
export function metricsRoutes(metrics: ProxyMetrics, config: Config): Record<string, Route> {
  return {
    '/metrics': async (_req, res) =>
      sendText(res, 200, await metrics.registry.metrics(), metrics.registry.contentType),
    '/proxyMode': (_req, res) => sendText(res, 200, 'userspace'),
    '/configz': (_req, res) => sendJSON(res, 200, configz(config)),
    '/healthz': (_req, res) => sendText(res, 200, 'ok'),
  };
}
