// What the tracer leaves on the heap under churn, and that what it reuses stays each connection's own: the
// table's entries and closed records, the HTTP/1 sniffers and their exchanges, and the events of the
// recent-events ring (a marker and the request, built into objects only when read).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { CloseReason } from '../../../src/relay/close-reason.ts';
import type { ConnectionInfo } from '../../../src/relay/observer.ts';
import type { ServicePortName } from '../../../src/state/service-port.ts';
import { ConnectionTable } from '../../../src/trace/connection-table.ts';
import { createSniffer } from '../../../src/trace/sniff/classify.ts';
import type { Http1Info, SniffEvent } from '../../../src/trace/sniff/types.ts';
import { createTracer, type TraceEvent } from '../../../src/trace/tracer.ts';
import { ep } from '../../helpers/endpoints.ts';
import { promotedPerStep } from '../../helpers/heap.ts';

type Conn = { -readonly [K in keyof ConnectionInfo]: ConnectionInfo[K] };

const endpoint = ep('10.1.0.1', 8080);

/** A connection as the relay makes one: its own client address string and start time. */
function conn(n: number, startMs = Date.now()): Conn {
  return {
    id: n + 1,
    service: 'prod/shop:web' as ServicePortName,
    protocol: 'TCP',
    clientAddress: `fd00:10:244:1::${(n % 4) + 10}`,
    clientPort: 20_000 + (n % 40_000),
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

function request(n: number): Buffer {
  return Buffer.from(`GET /cart/${n % 8} HTTP/1.1\r\nHost: shop\r\nUser-Agent: t\r\n\r\n`);
}
const RESPONSE = Buffer.from('HTTP/1.1 200 OK\r\nServer: t\r\nContent-Length: 2\r\n\r\nok');

function close(c: Conn, reason: CloseReason, endMs: number): void {
  c.endMs = endMs;
  c.closeReason = reason;
}

test('a closed traced HTTP/1 connection promotes < 40 B under churn (~900 B when each kept its own record, app copy and event objects)', () => {
  const table = new ConnectionTable();
  const tracer = createTracer({ mode: 'protocols', table });
  const observer = tracer.observerFor({ trace: undefined });
  let last: Conn | undefined;
  // A scavenge every 100 connections: each closed one is in the rings (1,000 connections; 1,000 events, 250
  // connections' worth) through several, as in a proxy whose young generation fills every few hundred.
  const each = promotedPerStep(
    (n) => {
      const c = conn(n);
      const req = request(n);
      observer.opened(c);
      observer.clientData!(c, req);
      observer.endpointData!(c, RESPONSE);
      c.bytesFromClient = req.length;
      c.bytesToClient = RESPONSE.length;
      close(c, 'endpoint-fin', c.startMs + 3);
      observer.closed(c);
      last = c;
    },
    { scavengeEvery: 100 },
  );
  // What is left (~20-30 B): its request's times, the heap numbers a reused exchange points to. Each of
  // these alone would fail it: entries not reused (~460 B), sniffers not reused (~140), events as objects
  // (~220), the record's times in fields (~50), each record its own client address (~55).
  assert.ok(each < 40, `${each.toFixed(0)} B a connection`);
  // What reads it back is as it was: the last connection's record, and its four events.
  const r = table.list({ limit: 1 }).recent[0]!;
  assert.deepEqual(
    [r.id, r.client, r.endpoint, r.startMs, r.endMs, r.bytesFromClient, r.closeReason],
    [
      last!.id,
      `[${last!.clientAddress}]:${last!.clientPort}`,
      '10.1.0.1:8080',
      last!.startMs,
      last!.startMs + 3,
      last!.bytesFromClient,
      'endpoint-fin',
    ],
  );
  const app = r.app as Http1Info;
  assert.deepEqual(
    [app.requests, app.responses, app.exchanges.length, app.exchanges[0]!.path, app.exchanges[0]!.status],
    [1, 1, 1, `/cart/${(last!.id - 1) % 8}`, 200],
  );
  const events = tracer.recentEvents({ id: last!.id });
  assert.deepEqual(
    events.map((e) => e.type),
    ['opened', 'http-request', 'http-response', 'closed'],
  );
});

/** Opens, feeds (request, then response) and closes connection `n` at its own times; its sniffer alone's events. */
function traceOne(
  observer: ReturnType<ReturnType<typeof createTracer>['observerFor']>,
  clock: { ms: number },
  n: number,
): { conn: Conn; events: SniffEvent[] } {
  const c = conn(n, 1_800_000_000_000 + n * 10);
  const req = request(n);
  const events: SniffEvent[] = [];
  const alone = createSniffer({ protocol: 'tcp', onEvent: (e) => events.push(e) });
  const reqMs = c.startMs + 1;
  const resMs = c.startMs + 2 + (n % 3);
  alone.onClientData(req, reqMs);
  alone.onEndpointData(RESPONSE, resMs);
  observer.opened(c);
  clock.ms = reqMs;
  observer.clientData!(c, req);
  clock.ms = resMs;
  observer.endpointData!(c, RESPONSE);
  close(c, 'client-fin', c.startMs + 5);
  observer.closed(c);
  return { conn: c, events };
}

/** Checks that every event of `events` is about its own connection, as the sniffer alone saw it. */
function assertOwn(events: TraceEvent[], traced: { conn: Conn; events: SniffEvent[] }[]): void {
  for (const e of events) {
    const { conn: c, events: own } = traced[e.id - 1]!;
    assert.deepEqual([e.client, e.endpoint], [`[${c.clientAddress}]:${c.clientPort}`, '10.1.0.1:8080']);
    if (e.type === 'opened') assert.equal(e.atMs, c.startMs);
    else if (e.type === 'closed') {
      assert.deepEqual([e.atMs, e.closeReason], [c.startMs + 5, 'client-fin']);
      const app = e.app as Http1Info;
      assert.deepEqual(
        [app.requests, app.responses, app.exchanges.map((x) => [x.path, x.startMs, x.status])],
        [1, 1, [[`/cart/${(c.id - 1) % 8}`, c.startMs + 1, 200]]],
      );
    } else {
      const { id: _i, service: _s, protocol: _p, client: _c, endpoint: _e, ...sniffed } = e;
      assert.deepEqual(
        sniffed,
        own.find((o) => o.type === e.type),
      );
    }
  }
}

test('reused entries, sniffers and exchanges belong to one connection at a time: every kept event reads its own', async () => {
  // Two closed connections kept and a hundred events: most events outlive their connection's record.
  const table = new ConnectionTable({ maxRecent: 2 });
  const clock = { ms: 0 };
  const tracer = createTracer({
    mode: 'protocols',
    table,
    recentEvents: 100,
    flushIntervalMs: 0,
    now: () => clock.ms,
  });
  const observer = tracer.observerFor({ trace: undefined });
  const traced = Array.from({ length: 300 }, (_, n) => traceOne(observer, clock, n));
  const recent = tracer.recentEvents();
  assert.equal(recent.length, 100);
  assertOwn(recent, traced);
  assert.equal(tracer.recentLines(), recent.map((e) => `${JSON.stringify(e)}\n`).join(''));

  // A follower's events are built at the flush, from entries held until then; later connections that
  // reuse them change none of them.
  const got: TraceEvent[] = [];
  const sub = tracer.subscribe({}, (e) => got.push(e))!;
  // (200 connections: 800 events, under a subscriber's 1,024 queued at most.)
  for (let n = 300; n < 500; n++) traced.push(traceOne(observer, clock, n));
  await new Promise((resolve) => setTimeout(resolve, 20));
  for (let n = 500; n < 800; n++) traced.push(traceOne(observer, clock, n));
  sub.close();
  assert.equal(got.length, 200 * 4);
  assertOwn(got, traced);
  assertOwn(tracer.recentEvents(), traced);
});
