import assert from 'node:assert/strict';
import { test } from 'node:test';
import client from 'prom-client';
import type { ServicePortStatus } from '../../../src/proxier/service-port-runtime.ts';
import { IDLE_STATS, newServicePortStats } from '../../../src/relay/service-context.ts';
import {
  renderFamily,
  renderServicePortMetrics,
  SERVICE_PORT_FAMILIES,
} from '../../../src/server/service-port-metrics.ts';

/** Just what the families read of a status. */
function status(
  name: string,
  protocol: 'TCP' | 'UDP',
  stats: Record<string, unknown>,
  loops = 0,
): ServicePortStatus {
  return {
    servicePort: { name, protocol },
    loopEndpoints: Array.from({ length: loops }, (_, i) => `10.0.0.${i}:80`),
    context: {
      stats: {
        accepted: 0,
        active: 0,
        bytesFromClients: 0,
        bytesToClients: 0,
        noEndpoints: 0,
        connectFailures: {},
        picks: new Map(),
        ejections: 0,
        udpSessionsEvicted: 0,
        udpSessionsEndpointRemoved: 0,
        rejected: {},
        ...stats,
      },
    },
  } as unknown as ServicePortStatus;
}

const STATUSES = [
  status('default/web:http', 'TCP', {
    accepted: 12,
    active: 3,
    bytesFromClients: 1200,
    bytesToClients: 34_000,
    connectFailures: { refused: 2, timeout: 1 },
    picks: new Map([
      ['10.244.0.11:8080', 7],
      ['[fd00::11]:8080', 5],
    ]),
    ejections: 1,
    rejected: { limit: 4 },
  }),
  status(
    'kube-system/kube-dns:dns',
    'UDP',
    { accepted: 5, udpSessionsEvicted: 2, udpSessionsEndpointRemoved: 1 },
    2,
  ),
  // Nothing a valid name can hold, but the text format must stay whole whatever a label holds.
  status('odd/"quoted"\\back\nline:p', 'TCP', { accepted: 1 }),
];

/** The same families as prom-client metrics fed the same values: what /metrics served before. */
async function promClientText(statuses: readonly ServicePortStatus[]): Promise<string> {
  const registry = new client.Registry();
  for (const family of SERVICE_PORT_FAMILIES) {
    const metric =
      family.type === 'counter'
        ? new client.Counter({
            name: family.name,
            help: family.help,
            labelNames: ['service', 'protocol', 'direction', 'reason', 'endpoint'],
            registers: [registry],
          })
        : new client.Gauge({
            name: family.name,
            help: family.help,
            labelNames: ['service', 'protocol'],
            registers: [registry],
          });
    for (const s of statuses) {
      family.series(s, (value, extra) => {
        const labels: Record<string, string> = {
          service: s.servicePort.name,
          protocol: s.servicePort.protocol,
        };
        if (extra !== undefined) {
          const m = /^(\w+)="(.*)"$/.exec(extra)!;
          labels[m[1]!] = m[2]!;
        }
        if (metric instanceof client.Counter) metric.inc(labels, value);
        else metric.set(labels, value);
      });
    }
  }
  return registry.metrics();
}

test('renderServicePortMetrics: the same text prom-client wrote for the same series, escaping included', async () => {
  assert.equal(
    await renderServicePortMetrics(
      () => STATUSES,
      async () => {},
    ),
    await promClientText(STATUSES),
  );
  // And with no service port: each family's HELP and TYPE only.
  assert.equal(
    await renderServicePortMetrics(
      () => [],
      async () => {},
    ),
    await promClientText([]),
  );
});

test('renderServicePortMetrics: statuses read once, a turn of the event loop every 1,000 service ports', async () => {
  const many = Array.from({ length: 2500 }, (_, i) => status(`default/s${i}:p`, 'TCP', { accepted: i }));
  let reads = 0;
  let turns = 0;
  let rendered = 0;
  let most = 0;
  // Counts the service ports each family renders between two turns.
  const families = SERVICE_PORT_FAMILIES.map((f) => ({
    ...f,
    series: (s: ServicePortStatus, emit: Parameters<typeof f.series>[1]) => {
      rendered++;
      most = Math.max(most, rendered);
      f.series(s, emit);
    },
  }));
  const text = await renderServicePortMetrics(
    () => {
      reads++;
      return many;
    },
    async () => {
      turns++;
      rendered = 0;
    },
    families,
  );
  assert.equal(reads, 1);
  assert.equal(turns, Math.ceil((families.length * many.length) / 1000) - 1);
  assert.equal(most, 1000);
  assert.equal(
    text,
    await renderServicePortMetrics(
      () => many,
      async () => {},
    ),
  );
  // With the default turn (setImmediate), I/O gets to run in between.
  let between = false;
  setImmediate(() => {
    between = true;
  });
  const started = renderServicePortMetrics(() => many);
  assert.equal(between, false);
  await started;
  assert.equal(between, true);
});

test('renderFamily: series per service port in order; UDP-only and loop families skip the others', () => {
  const lines = (name: string) =>
    renderFamily(SERVICE_PORT_FAMILIES.find((f) => f.name === name)!, STATUSES)
      .split('\n')
      .filter((l) => !l.startsWith('#'));
  assert.deepEqual(lines('kup_service_endpoint_picks_total'), [
    'kup_service_endpoint_picks_total{service="default/web:http",protocol="TCP",endpoint="10.244.0.11:8080"} 7',
    'kup_service_endpoint_picks_total{service="default/web:http",protocol="TCP",endpoint="[fd00::11]:8080"} 5',
  ]);
  assert.deepEqual(lines('kup_udp_sessions_evicted_total'), [
    'kup_udp_sessions_evicted_total{service="kube-system/kube-dns:dns",protocol="UDP"} 2',
  ]);
  assert.deepEqual(lines('kup_forwarding_loop_endpoints'), [
    'kup_forwarding_loop_endpoints{service="kube-system/kube-dns:dns",protocol="UDP"} 2',
  ]);
  assert.equal(
    lines('kup_service_connections_total')[2],
    'kup_service_connections_total{service="odd/\\"quoted\\"\\\\back\\nline:p",protocol="TCP"} 1',
  );
});

test('an idle TCP service port (the shared idle counters) shows the series a new one does', async () => {
  const idle = status('default/idle:http', 'TCP', {});
  const withOwn = status('default/idle:http', 'TCP', {});
  (idle.context as { stats: unknown }).stats = IDLE_STATS;
  (withOwn.context as { stats: unknown }).stats = newServicePortStats();
  const text = await renderServicePortMetrics(() => [idle]);
  assert.equal(text, await renderServicePortMetrics(() => [withOwn]));
  assert.equal(text, await promClientText([withOwn]));
  assert.match(text, /^kup_service_connections_total\{[^}]*\} 0$/m);
});
