// One lifecycle for every part of the proxy that holds sockets, timers or child processes: started in
// order, closed in reverse, each close bounded (fastify/avvio). Imports nothing of the project but lib/.
import { ProxyError } from './errors.ts';
import type { Logger } from './log.ts';

/** A part of the running proxy. close() finishes what it holds, then releases it; destroy() is now. */
export interface Part {
  readonly name: string;
  start?(): Promise<void>;
  close(): Promise<void>;
  destroy?(): void;
  /** How long close() may take before the part is destroyed; default: the lifecycle's bound. */
  readonly closeBoundMs?: number;
}

/**
 * Starts `parts` in order, adding each to `started` once it has: close what `started` holds to undo
 * a start, also one cut short. When a part fails, those already started are closed (in reverse),
 * `started` is emptied and the error is thrown: nothing is left half running. `stopped()` true (a
 * shutdown began meanwhile) ends the start before the next part.
 */
export async function startParts(
  parts: readonly Part[],
  options: { log: Logger; boundMs: number; started: Part[]; stopped?: () => boolean },
): Promise<void> {
  const { started } = options;
  for (const part of parts) {
    if (options.stopped?.() === true) return;
    try {
      await part.start?.();
      started.push(part);
    } catch (err) {
      const undo = started.splice(0);
      await closeParts(undo, options.log, options.boundMs);
      throw err;
    }
  }
}

/**
 * Closes `parts` in reverse order, each within its bound: a part that does not close in time is
 * destroyed, logged with KUP_ERR_SHUTDOWN_TIMEOUT, and the others still close. A close that throws is
 * logged and does not stop the others. Resolves with the timeouts (empty when every part closed).
 */
export async function closeParts(
  parts: readonly Part[],
  log: Logger,
  boundMs: number,
): Promise<ProxyError[]> {
  const timeouts: ProxyError[] = [];
  for (const part of [...parts].reverse()) {
    const bound = part.closeBoundMs ?? boundMs;
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<'timeout'>((resolve) => {
      timer = setTimeout(() => resolve('timeout'), bound);
    });
    try {
      const outcome = await Promise.race([part.close().then(() => 'closed' as const), timedOut]);
      if (outcome === 'timeout') {
        const err = new ProxyError(
          'KUP_ERR_SHUTDOWN_TIMEOUT',
          `${part.name} did not close within ${bound} ms; destroyed`,
        );
        log.warn({ part: part.name, err }, 'Shutdown timeout');
        part.destroy?.();
        timeouts.push(err);
      }
    } catch (err) {
      log.error({ part: part.name, err }, 'Failed to close');
      part.destroy?.();
    } finally {
      clearTimeout(timer);
    }
  }
  return timeouts;
}
