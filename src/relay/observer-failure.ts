// An observer (the tracer, a sniffer behind it) that throws costs only its own tracing, never the
// connection or the process: the relays call observers inside try/catch and hand what they catch here.
import type { Logger } from '../lib/log.ts';
import type { ConnectionObserver } from './observer.ts';
import { noopObserver } from './observer.ts';
import type { ServicePortContext } from './service-context.ts';

/** Which observer callback threw. */
export type ObserverCallback = 'opened' | 'clientData' | 'endpointData' | 'closed';

/**
 * `observer` threw `err` from `callback` on a connection of `context`'s service port. The first time
 * (while the context still holds that observer) the context's observer becomes `noopObserver`, so new
 * connections are not traced until the proxier sets one again, and the failure is logged; later throws
 * of connections already running are not logged again. The caller stops feeding the connection's bytes.
 */
export function observerFailed(
  context: ServicePortContext,
  observer: ConnectionObserver,
  log: Logger,
  err: unknown,
  callback: ObserverCallback,
): void {
  if (context.observer !== observer) return;
  context.observer = noopObserver;
  log.error(
    { err, service: context.name, callback },
    'Connection observer failed, tracing off for the service port',
  );
}
