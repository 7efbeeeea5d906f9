// The live trace stream on table entries of hand-made connections: each event serialized once for every
// follower, the subscriber cap, bounded queues for followers that never read with exact drop counts, the
// time budget, and what a subscriber joining mid-batch gets.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ConnectionTable, type TableEntry } from '../../../src/trace/connection-table.ts';
import { EventStream, type EventStreamOptions, type LineSink } from '../../../src/trace/event-stream.ts';
import { OPENED, type TraceEvent } from '../../../src/trace/trace-event.ts';
import { ep } from '../../helpers/endpoints.ts';
import { handMadeConnection } from '../../helpers/tracer.ts';

let ids = 1;
const table = new ConnectionTable();

function entry(clientAddress = '10.0.0.1'): TableEntry {
  const conn = handMadeConnection(ids++, clientAddress, 40000, ep('10.1.0.1', 8080), 1000);
  return table.open(conn);
}

function stream(over: Partial<EventStreamOptions> = {}): EventStream {
  return new EventStream({
    maxSubscribers: 32,
    maxPending: 1024,
    flushIntervalMs: 0,
    maxCpuShare: 1,
    now: () => 5000,
    clock: () => performance.now(),
    ...over,
  });
}

type Line = Record<string, unknown>;
type Sink = { ready: boolean; chunks: Buffer[]; readonly lines: Line[]; sink: LineSink };

/** A line sink that keeps what it is given; `ready` is switchable. */
function sink(ready = true): Sink {
  const s: Sink = {
    ready,
    chunks: [] as Buffer[],
    get lines(): Line[] {
      return Buffer.concat(s.chunks)
        .toString()
        .split('\n')
        .filter((l) => l !== '')
        .map((l) => JSON.parse(l) as Line);
    },
    sink: {
      ready: () => s.ready,
      write: (b: Buffer) => {
        s.chunks.push(b);
      },
    },
  };
  return s;
}

/** Lets the flush timer (0 ms here) and any resume run. */
const flushed = () => new Promise((r) => setTimeout(r, 5));

test('each event is serialized once, whatever the number of followers: the unfiltered ones share the bytes', async () => {
  const es = stream();
  const all = [sink(), sink(), sink()];
  for (const s of all) es.subscribeLines({}, s.sink);
  const only = sink();
  es.subscribeLines({ client: '10.0.0.2' }, only.sink);
  const real = JSON.stringify;
  let calls = 0;
  JSON.stringify = ((...args: Parameters<typeof real>) => {
    calls++;
    return real(...args);
  }) as typeof real;
  try {
    for (let i = 0; i < 10; i++) es.record(entry(i % 2 === 0 ? '10.0.0.1' : '10.0.0.2'), OPENED);
    await flushed();
  } finally {
    JSON.stringify = real;
  }
  assert.equal(calls, 10, 'one JSON.stringify per event for four followers');
  assert.equal(all[0]!.chunks.length, 1);
  assert.ok(
    all.every((s) => s.chunks[0] === all[0]!.chunks[0]),
    'the same Buffer for every unfiltered follower',
  );
  assert.deepEqual(
    all[0]!.lines.map((l) => l.type),
    Array(10).fill('opened'),
  );
  assert.deepEqual(
    only.lines.map((l) => l.client),
    Array(5).fill('10.0.0.2:40000'),
  );
});

test('past maxSubscribers subscribing is refused and counted; a closed subscription frees its place', () => {
  const es = stream({ maxSubscribers: 2 });
  const a = es.subscribeLines({}, sink().sink);
  const b = es.subscribe({}, () => {});
  assert.ok(a !== undefined && b !== undefined);
  assert.equal(es.subscribeLines({}, sink().sink), undefined);
  assert.equal(
    es.subscribe({}, () => {}),
    undefined,
  );
  assert.deepEqual([es.stats().subscribers, es.stats().refusedSubscribers], [2, 2]);
  a.close();
  a.close();
  assert.ok(es.subscribeLines({}, sink().sink) !== undefined);
  assert.equal(es.stats().subscribers, 2);
});

test('a follower that never reads: its queue stays within maxPending, and the dropped lines count exactly', async () => {
  const es = stream({ maxPending: 100 });
  const slow = sink(false);
  const sub = es.subscribeLines({}, slow.sink)!;
  const fast = sink();
  es.subscribeLines({}, fast.sink);
  // 12 flushes of 500 events while it does not read.
  for (let round = 0; round < 12; round++) {
    for (let i = 0; i < 500; i++) es.record(entry(), OPENED);
    await flushed();
  }
  assert.equal(slow.chunks.length, 0, 'nothing is written to a sink that is not ready');
  assert.equal(fast.lines.length, 6000, 'the other follower got every event');
  slow.ready = true;
  sub.resume();
  await flushed();
  const events = slow.lines.filter((l) => l.type === 'opened').length;
  const dropped = slow.lines.filter((l) => l.type === 'dropped').reduce((n, l) => n + (l.count as number), 0);
  assert.ok(events <= 500, `at most one batch was queued, ${events} events`);
  assert.equal(events + dropped, 6000, 'every event is either delivered or counted in a dropped line');
  assert.equal(sub.dropped, dropped);
  assert.equal(es.stats().droppedEvents, dropped);
  // Reading again, it gets the next events as they come.
  es.record(entry(), OPENED);
  await flushed();
  assert.equal(slow.lines.at(-1)!.type, 'opened');
});

test('the time budget: past maxCpuShare events are not built; each follower is told how many it missed', async () => {
  // A clock that advances 1 ms a reading: building an event's object and line costs 2 ms here.
  let ms = 0;
  const es = stream({ maxCpuShare: 0.0001, clock: () => ms++ });
  const a = sink();
  const b = sink();
  es.subscribeLines({}, a.sink);
  es.subscribeLines({ client: '10.0.0.1' }, b.sink);
  for (let i = 0; i < 10; i++) es.record(entry(), OPENED);
  await flushed();
  // The budget (1 ms: 0.01 % of the ten seconds it may save up) covers the first event only.
  assert.deepEqual(
    a.lines.map((l) => (l.type === 'dropped' ? `dropped ${l.count}` : l.type)),
    ['opened', 'dropped 9'],
  );
  assert.deepEqual(b.lines, a.lines);
  assert.equal(es.stats().overBudgetEvents, 9);
});

test('a subscriber joining mid-batch gets what comes after (the rest is in the recent events it read)', async () => {
  const es = stream();
  const before: TableEntry[] = [entry(), entry(), entry()];
  const early = sink();
  const events: TraceEvent[] = [];
  es.subscribeLines({}, early.sink);
  for (const e of before) es.record(e, OPENED);
  const late = sink();
  es.subscribeLines({}, late.sink);
  es.subscribe({}, (e) => events.push(e));
  const after = [entry(), entry()];
  for (const e of after) es.record(e, OPENED);
  await flushed();
  assert.deepEqual(
    early.lines.map((l) => l.id),
    [...before, ...after].map((e) => e.id),
  );
  assert.deepEqual(
    late.lines.map((l) => l.id),
    after.map((e) => e.id),
  );
  assert.deepEqual(
    events.map((e) => e.id),
    after.map((e) => e.id),
  );
});

test('a sink that throws ends its own subscription; the others and the stream go on', async () => {
  const es = stream();
  es.subscribeLines(
    {},
    {
      ready: () => true,
      write: () => {
        throw new Error('broken pipe');
      },
    },
  );
  const ok = sink();
  es.subscribeLines({}, ok.sink);
  es.record(entry(), OPENED);
  await flushed();
  assert.equal(es.stats().subscribers, 1);
  es.record(entry(), OPENED);
  await flushed();
  assert.equal(ok.lines.length, 2);
});
