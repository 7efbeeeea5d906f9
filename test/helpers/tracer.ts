// A protocols tracer over a table of its own that records every event it emits, for the tap tests.
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
