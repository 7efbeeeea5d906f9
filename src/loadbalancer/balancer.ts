// What the relays read of a service port's balancer: an endpoint for a client, and how it went. The
// proxier owns the balancers and changes their endpoints and affinity in place (round-robin.ts).
import type { Endpoint } from '../state/endpoint.ts';
import type { EjectionEvent } from './outlier.ts';

export interface Balancer {
  /** The endpoints in visiting order. */
  readonly endpoints: readonly Endpoint[];
  /**
   * The endpoint for a new connection or session from `clientIP` (ClientIP affinity first, unless
   * `resetAffinity`); undefined when there is none.
   */
  pick(clientIP: string, nowMs: number, resetAffinity?: boolean): Endpoint | undefined;
  /** A connect to `endpoint` failed; returns the ejection it caused, if any. */
  reportFailure(endpoint: Endpoint, nowMs: number): EjectionEvent | undefined;
  /** A connect to `endpoint` succeeded (ends a run of failures). */
  reportSuccess(endpoint: Endpoint): void;
  /** Forgets `clientIP`'s affinity when it points at `endpoint`. */
  resetAffinity(clientIP: string, endpoint: Endpoint): void;
  /** Passive outlier ejection, for status pages; undefined when off. */
  readonly outlier: { ejected(nowMs: number): { endpoint: string; untilMs: number }[] } | undefined;
}
