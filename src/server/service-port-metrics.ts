// The per service port metrics, as Prometheus text rendered straight from the counters the data path
// keeps in plain fields (ServicePortStats), only when scraped. prom-client's labelled counters cost a
// reset and a hashed, sorted label set per series for every family, then a formatting pass per series:
// at 10,000 service ports (~110,000 series with 5 endpoints each) one scrape held the event loop
// ~350 ms, every 15-30 s, while this process also relays. Here one status() per scrape, each family
// a string built in one pass, and a turn of the event loop between families.
import type { ServicePortStatus } from '../proxier/service-port-runtime.ts';

/** Adds one series: `labels` after `service` and `protocol` (already `name="value"` pairs), its value. */
type Emit = (value: number, extra?: string) => void;

export type ServicePortFamily = {
  readonly name: string;
  readonly help: string;
  readonly type: 'counter' | 'gauge';
  /** The series of one service port, in order. */
  series(s: ServicePortStatus, emit: Emit): void;
};

/** A label value as the text format wants it: backslash, double quote and newline escaped. */
export function escapeLabelValue(value: string): string {
  return /[\\"\n]/.test(value)
    ? value.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n')
    : value;
}

/** `name="value"`, escaped. */
export function label(name: string, value: string): string {
  return `${name}="${escapeLabelValue(value)}"`;
}

function counts(record: Readonly<Record<string, number>>, name: string, emit: Emit): void {
  for (const key in record) emit(record[key]!, label(name, key));
}

/** The families, in the order /metrics lists them. */
export const SERVICE_PORT_FAMILIES: readonly ServicePortFamily[] = [
  {
    name: 'kup_service_connections_total',
    help: 'Connections accepted (TCP) or sessions opened (UDP) per service port',
    type: 'counter',
    series: (s, emit) => emit(s.context.stats.accepted),
  },
  {
    name: 'kup_service_connections_active',
    help: 'Open TCP connections or UDP sessions per service port',
    type: 'gauge',
    series: (s, emit) => emit(s.context.stats.active),
  },
  {
    name: 'kup_service_bytes_total',
    help: 'Bytes relayed per service port, of closed connections',
    type: 'counter',
    series: (s, emit) => {
      emit(s.context.stats.bytesFromClients, 'direction="from_client"');
      emit(s.context.stats.bytesToClients, 'direction="to_client"');
    },
  },
  {
    name: 'kup_service_no_endpoints_total',
    help: 'Connections closed or datagrams dropped for lack of endpoints',
    type: 'counter',
    series: (s, emit) => emit(s.context.stats.noEndpoints),
  },
  {
    name: 'kup_service_connect_failures_total',
    help: 'Failed connect attempts to endpoints, by reason',
    type: 'counter',
    series: (s, emit) => counts(s.context.stats.connectFailures, 'reason', emit),
  },
  {
    name: 'kup_service_endpoint_picks_total',
    help: 'Times the load balancer chose each endpoint',
    type: 'counter',
    series: (s, emit) => {
      for (const [endpoint, n] of s.context.stats.picks) emit(n, label('endpoint', endpoint));
    },
  },
  {
    name: 'kup_endpoint_ejections_total',
    help: 'Endpoints ejected by passive outlier detection (consecutive connect failures)',
    type: 'counter',
    series: (s, emit) => emit(s.context.stats.ejections),
  },
  {
    name: 'kup_udp_sessions_evicted_total',
    help: 'UDP sessions evicted because the per-service or total cap was reached',
    type: 'counter',
    series: (s, emit) => {
      if (s.servicePort.protocol === 'UDP') emit(s.context.stats.udpSessionsEvicted);
    },
  },
  {
    name: 'kup_udp_sessions_endpoint_removed_total',
    help: 'UDP sessions closed because their endpoint left (the next datagram picks a live one)',
    type: 'counter',
    series: (s, emit) => {
      if (s.servicePort.protocol === 'UDP') emit(s.context.stats.udpSessionsEndpointRemoved);
    },
  },
  {
    name: 'kup_service_connections_rejected_total',
    help: 'TCP connections closed at accept and UDP sessions not opened, by reason (limit: --max-connections-per-service; fd-exhausted: out of file descriptors; loop: came back from this proxy too many times)',
    type: 'counter',
    series: (s, emit) => counts(s.context.stats.rejected, 'reason', emit),
  },
  {
    name: 'kup_forwarding_loop_endpoints',
    help: "Endpoints left out of a service port's balancer because they lead back to this proxy (its proxy ports, NodePorts or service IPs)",
    type: 'gauge',
    series: (s, emit) => {
      if (s.loopEndpoints.length > 0) emit(s.loopEndpoints.length);
    },
  },
];

/** Service ports rendered in one turn of the event loop (~3 ms each turn at 5 endpoints a port). */
const PORTS_PER_TURN = 1000;

/** `service="…",protocol="…"` of a service port: the labels every series starts with. */
function head(s: ServicePortStatus): string {
  return `${label('service', s.servicePort.name)},${label('protocol', s.servicePort.protocol)}`;
}

/**
 * Adds the series of `statuses[from, to)` to `lines` (`heads`: their head() in the same order). The
 * family's text is `# HELP`, `# TYPE`, then these lines, as prom-client writes them.
 */
function addSeries(
  family: ServicePortFamily,
  statuses: readonly ServicePortStatus[],
  heads: readonly string[],
  from: number,
  to: number,
  lines: string[],
): void {
  let labels = '';
  const emit: Emit = (value, extra) => {
    lines.push(`${family.name}{${extra === undefined ? labels : `${labels},${extra}`}} ${value}`);
  };
  for (let i = from; i < to; i++) {
    labels = heads[i]!;
    family.series(statuses[i]!, emit);
  }
}

/** One family's text, in one go. */
export function renderFamily(family: ServicePortFamily, statuses: readonly ServicePortStatus[]): string {
  const lines = [`# HELP ${family.name} ${family.help}`, `# TYPE ${family.name} ${family.type}`];
  addSeries(family, statuses, statuses.map(head), 0, statuses.length, lines);
  return lines.join('\n');
}

/**
 * Every family's text for `statuses()` (read once), separated as prom-client separates its metrics and
 * ending with a newline; `yieldTurn` (injected for tests) runs every PORTS_PER_TURN service ports, so
 * connections are served meanwhile.
 */
export async function renderServicePortMetrics(
  statuses: () => readonly ServicePortStatus[],
  yieldTurn: () => Promise<void> = () => new Promise((resolve) => setImmediate(resolve)),
  families: readonly ServicePortFamily[] = SERVICE_PORT_FAMILIES,
): Promise<string> {
  const all = statuses();
  const heads = all.map(head);
  const texts: string[] = [];
  let budget = PORTS_PER_TURN;
  for (const family of families) {
    const lines = [`# HELP ${family.name} ${family.help}`, `# TYPE ${family.name} ${family.type}`];
    for (let from = 0; from < all.length; ) {
      if (budget <= 0) {
        await yieldTurn();
        budget = PORTS_PER_TURN;
      }
      const to = Math.min(all.length, from + budget);
      addSeries(family, all, heads, from, to, lines);
      budget -= to - from;
      from = to;
    }
    texts.push(lines.join('\n'));
  }
  return `${texts.join('\n\n')}\n`;
}
