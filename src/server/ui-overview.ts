// /ui/api/overview: the console's header: sync health (when the rules were last synced and how long it
// took, changes waiting, iptables-restore failures, service ports that could not be opened), totals over
// every service port with their rates, and the tracer's state. Pure: every value comes in.
import type { SyncResult } from '../proxier/proxier.ts';
import type { TraceMode } from '../state/service-port.ts';
import type { TracerStats } from '../trace/tracer.ts';
import type { HealthStatus } from './proxy-health.ts';
import type { RateSeries } from './rate-history.ts';

export type OverviewInput = {
  nowMs: number;
  nodeName: string;
  iptables: boolean;
  trace: TraceMode;
  health: HealthStatus;
  /** Epoch ms of the last sync that applied everything queued before it; 0 = never. */
  lastSyncMs: number;
  lastSync: SyncResult | undefined;
  pendingServiceChanges: number;
  pendingEndpointChanges: number;
  iptablesRestoreFailures: number;
  servicePorts: number;
  failedServicePorts: number;
  /** Summed over every service port. */
  active: number;
  accepted: number;
  times: number[];
  rates: RateSeries;
  connections: { active: number; recent: number; dropped: number };
  tracer: TracerStats;
};

export type UiOverview = {
  now: string;
  node: string;
  mode: { iptables: boolean; trace: TraceMode };
  sync: {
    healthy: boolean;
    /** /healthz's reason: ok, not-synced, stale, node-ineligible. */
    reason: HealthStatus['reason'];
    lastSync: string | null;
    lastSyncAgoMs: number | null;
    lastSyncDurationMs: number | null;
    lastSyncFull: boolean | null;
    pendingServiceChanges: number;
    pendingEndpointChanges: number;
    /** Null with --no-iptables (nothing is restored). */
    iptablesRestoreFailures: number | null;
    failedServicePorts: number;
  };
  totals: { servicePorts: number; active: number; accepted: number };
  /** Sample times (epoch ms) and, aligned, connections/s, bytes/s from and to clients, no-endpoint closes/s. */
  times: number[];
  rates: RateSeries;
  connections: { active: number; recent: number; dropped: number };
  /** Events: since start; followers of /debug/trace (the console's stream is one); events lost to them. */
  tracer: { events: number; followers: number; maxFollowers: number; dropped: number };
};

export function uiOverview(i: OverviewInput): UiOverview {
  const synced = i.lastSyncMs > 0;
  return {
    now: new Date(i.nowMs).toISOString(),
    node: i.nodeName,
    mode: { iptables: i.iptables, trace: i.trace },
    sync: {
      healthy: i.health.healthy,
      reason: i.health.reason,
      lastSync: synced ? new Date(i.lastSyncMs).toISOString() : null,
      lastSyncAgoMs: synced ? Math.max(0, i.nowMs - i.lastSyncMs) : null,
      lastSyncDurationMs: i.lastSync === undefined ? null : Math.round(i.lastSync.durationMs * 10) / 10,
      lastSyncFull: i.lastSync?.full ?? null,
      pendingServiceChanges: i.pendingServiceChanges,
      pendingEndpointChanges: i.pendingEndpointChanges,
      iptablesRestoreFailures: i.iptables ? i.iptablesRestoreFailures : null,
      failedServicePorts: i.failedServicePorts,
    },
    totals: { servicePorts: i.servicePorts, active: i.active, accepted: i.accepted },
    times: i.times,
    rates: i.rates,
    connections: i.connections,
    tracer: {
      events: i.tracer.events,
      followers: i.tracer.subscribers,
      maxFollowers: i.tracer.maxSubscribers,
      dropped: i.tracer.droppedEvents + i.tracer.overBudgetEvents,
    },
  };
}
