// Prometheus metrics (prom-client): kube-proxy's sync metrics and the process's own; the per service port
// counters that the data path keeps as plain fields are rendered apart (service-port-metrics.ts).
import client from 'prom-client';
import type { Config } from '../config/config.ts';
import type { Proxier } from '../proxier/proxier.ts';
import { configz } from './configz.ts';
import { collectDefaultMetrics } from './event-loop-delay.ts';
import type { Route } from './http.ts';
import { sendJSON, sendText } from './http.ts';
import { renderServicePortMetrics } from './service-port-metrics.ts';

export type ProxyMetrics = {
  registry: client.Registry;
  /** What /metrics serves: the registry's metrics and the per service port families. */
  text(): Promise<string>;
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
  collectDefaultMetrics(registry);
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

  const each = (
    fn: (service: string, protocol: string, s: ReturnType<Proxier['status']>[number]) => void,
  ) => {
    const p = getProxier();
    if (p === undefined) return;
    for (const s of p.status()) fn(s.servicePort.name, s.servicePort.protocol, s);
  };
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
    // The per service port families are not prom-client metrics: see service-port-metrics.ts.
    text: async () =>
      `${await registry.metrics()}\n${await renderServicePortMetrics(() => getProxier()?.status() ?? [])}`,
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
    '/metrics': async (_req, res) => sendText(res, 200, await metrics.text(), metrics.registry.contentType),
    '/proxyMode': (_req, res) => sendText(res, 200, 'userspace'),
    '/configz': (_req, res) => sendJSON(res, 200, configz(config)),
    '/healthz': (_req, res) => sendText(res, 200, 'ok'),
  };
}
