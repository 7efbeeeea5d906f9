// Metrics of the resource limits (connection cap, descriptor exhaustion, the UDP session cap), added to
// the proxy's registry. Like the other data-path metrics, values live in plain fields and are copied only
// when scraped. The descriptor limit itself is prom-client's `process_max_fds` / `process_open_fds`.
import client from 'prom-client';
import type { Proxier } from './proxier.ts';

export function registerResourceMetrics(
  registry: client.Registry,
  getProxier: () => Proxier | undefined,
): void {
  new client.Counter({
    name: 'kup_service_connections_rejected_total',
    help: 'TCP connections closed at accept and UDP sessions not opened, by reason (limit: --max-connections-per-service; fd-exhausted: out of file descriptors; loop: came back from this proxy too many times)',
    labelNames: ['service', 'protocol', 'reason'],
    registers: [registry],
    collect() {
      this.reset();
      for (const s of getProxier()?.status() ?? []) {
        for (const [reason, n] of Object.entries(s.context.stats.rejected))
          this.inc({ service: s.servicePort.name, protocol: s.servicePort.protocol, reason }, n);
      }
    },
  });
  new client.Counter({
    name: 'kup_fd_exhausted_total',
    help: 'Times a file descriptor was missing (EMFILE/ENFILE), by operation (accept: once a second while none is left, as libuv then closes new connections itself)',
    labelNames: ['operation'],
    registers: [registry],
    collect() {
      this.reset();
      const counts = getProxier()?.fdPressure.counts;
      for (const [operation, n] of Object.entries(counts ?? {})) this.inc({ operation }, n);
    },
  });
  new client.Gauge({
    name: 'kup_forwarding_loop_endpoints',
    help: "Endpoints left out of a service port's balancer because they lead back to this proxy (its proxy ports, NodePorts or service IPs)",
    labelNames: ['service', 'protocol'],
    registers: [registry],
    collect() {
      this.reset();
      for (const s of getProxier()?.status() ?? []) {
        if (s.loopEndpoints.length > 0)
          this.set({ service: s.servicePort.name, protocol: s.servicePort.protocol }, s.loopEndpoints.length);
      }
    },
  });
  new client.Gauge({
    name: 'kup_udp_sessions',
    help: 'Open UDP sessions across all service ports',
    registers: [registry],
    collect() {
      this.set(getProxier()?.udpBudget?.size ?? 0);
    },
  });
  new client.Gauge({
    name: 'kup_udp_sessions_max',
    help: 'The cap on UDP sessions across all service ports (--udp-max-sessions-total); 0 = none',
    registers: [registry],
    collect() {
      this.set(getProxier()?.udpBudget?.max ?? 0);
    },
  });
}
