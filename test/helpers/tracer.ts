// A protocols tracer over a table of its own that records every event it emits, for the tap tests; a
// hand-made connection for the tracer's unit tests.
import type { ConnectAttempt, ConnectionInfo } from '../../src/relay/observer.ts';
import type { ServicePortName } from '../../src/state/service-port.ts';
import { ConnectionTable } from '../../src/trace/connection-table.ts';
import { createTracer, type TraceEvent } from '../../src/trace/tracer.ts';

/** The tracer, its table and the events so far; the subscription ends with the test. */
export function recordingTracer(t: { after(fn: () => void): void }) {
  const table = new ConnectionTable();
  const tracer = createTracer({ mode: 'protocols', table });
  const events: TraceEvent[] = [];
  const sub = tracer.subscribe({}, (e) => events.push(e))!;
  t.after(() => sub.close());
  return { table, tracer, events };
}

/** A ConnectionInfo whose fields a test may set (as the relay sets them on its connections). */
export type HandMadeConnection = { -readonly [K in keyof ConnectionInfo]: ConnectionInfo[K] } & {
  failedAttempts: ConnectAttempt[];
};

/**
 * A connection of prod/shop:web as the relay makes one: opened at `startMs`, nothing relayed yet. One
 * object, nothing else allocated (the memory tests count what a connection costs).
 */
export function handMadeConnection(
  id: number,
  clientAddress: string,
  clientPort: number,
  endpoint: ConnectionInfo['endpoint'],
  startMs: number,
): HandMadeConnection {
  return {
    id,
    service: 'prod/shop:web' as ServicePortName,
    protocol: 'TCP',
    clientAddress,
    clientPort,
    endpoint,
    startMs,
    endMs: 0,
    bytesFromClient: 0,
    bytesToClient: 0,
    failedAttempts: [],
    closeReason: undefined,
    observerData: undefined,
  };
}
