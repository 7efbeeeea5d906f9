// Metrics of the resource limits (descriptor exhaustion, the UDP session cap), added to the proxy's
// registry. Like the other data-path metrics, values live in plain fields and are copied only when
// scraped; those per service port (connections rejected, loop endpoints) are in service-port-metrics.ts.
// The descriptor limit itself is prom-client's `process_max_fds` / `process_open_fds`.
import client from 'prom-client';
import type { Proxier } from './proxier.ts';

export function registerResourceMetrics(
  registry: client.Registry,
  getProxier: () => Proxier | undefined,
): void {
  new client.Counter({
    name: 'kup_fd_exhausted_total',
    help: 'Times a file descriptor was missing (EMFILE/ENFILE), by operation (accept: the seconds in which an accept failed or none was left)',
    labelNames: ['operation'],
    registers: [registry],
    collect() {
      this.reset();
      const counts = getProxier()?.fdPressure.counts;
      for (const [operation, n] of Object.entries(counts ?? {})) this.inc({ operation }, n);
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
