// The bookkeeping of a failed endpoint, shared by the TCP relay (a connect attempt failed) and the UDP
// relay (a session's socket reported an error): counters, the client's affinity, outlier detection, and
// running out of descriptors. Allocates nothing beyond the attempt it remembers.
import type { Logger } from '../lib/log.ts';
import type { Balancer } from '../loadbalancer/balancer.ts';
import type { EjectionEvent } from '../loadbalancer/outlier.ts';
import type { Endpoint } from '../state/endpoint.ts';
import { type ConnectFailureReason, connectErrorReason } from './close-reason.ts';
import type { FdOperation, FdPressure } from './fd-pressure.ts';
import type { ConnectAttempt } from './observer.ts';
import { countConnectFailure, type ServicePortContext } from './service-context.ts';

/** The connection or session a failure happened on. */
export interface FailedConnection {
  readonly context: ServicePortContext;
  /** The balancer the endpoint came from. */
  readonly balancer: Balancer;
  readonly clientAddress: string;
  readonly failedAttempts: ConnectAttempt[];
}

/**
 * Hears of each ejection this process decided (--workers: the main process tells the others, so that
 * no process keeps trying an endpoint one of them found failing).
 */
export type EjectionListener = (context: ServicePortContext, ejection: EjectionEvent) => void;

/** The listener's shared parts a failure reports to. */
export interface FailureSink {
  readonly fdPressure: FdPressure;
  readonly log: Logger;
  readonly onEjection?: EjectionListener | undefined;
}

/**
 * Records that `endpoint` failed `conn` with `err`: counts it by reason and remembers the attempt.
 * When descriptors ran out (returns `'fd-exhausted'`) it is our shortage, not the endpoint's: `fdPressure`
 * hears of it under `op`, and there is no ejection and no affinity reset; the caller closes at once.
 * Otherwise the client's affinity to `endpoint` is dropped and the failure goes to outlier detection
 * (an ejection is counted and logged). Returns the reason.
 */
export function endpointFailed(
  conn: FailedConnection,
  endpoint: Endpoint,
  err: NodeJS.ErrnoException,
  sink: FailureSink,
  op: FdOperation,
  nowMs: number,
): ConnectFailureReason {
  const reason = connectErrorReason(err);
  const stats = conn.context.stats;
  countConnectFailure(stats, reason);
  conn.failedAttempts.push({ endpoint: endpoint.key, error: err.code ?? err.message });
  if (reason === 'fd-exhausted') {
    sink.fdPressure.exhausted(op, nowMs, err);
    return reason;
  }
  conn.balancer.resetAffinity(conn.clientAddress, endpoint);
  const ejection = conn.balancer.reportFailure(endpoint, nowMs);
  if (ejection !== undefined) {
    stats.ejections++;
    sink.log.warn(
      {
        service: conn.context.name,
        endpoint: endpoint.key,
        forMs: ejection.untilMs - nowMs,
        ejections: ejection.ejections,
      },
      'Endpoint ejected after consecutive failures',
    );
    sink.onEjection?.(conn.context, ejection);
  }
  return reason;
}
