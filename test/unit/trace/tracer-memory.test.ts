// What tracing a short HTTP/1 connection allocates, and that a closed record keeping its sniffer (in place
// of a copy of its info made at close) reads back as the copy did.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { ConnectionObserver } from '../../../src/relay/observer.ts';
import { noopObserver } from '../../../src/relay/observer.ts';
import { ConnectionTable } from '../../../src/trace/connection-table.ts';
import { createSniffer } from '../../../src/trace/sniff/classify.ts';
import type { Http1Info } from '../../../src/trace/sniff/types.ts';
import { createTracer } from '../../../src/trace/tracer.ts';
import { ep } from '../../helpers/endpoints.ts';
import { allocatedPerStep } from '../../helpers/heap.ts';
import { type HandMadeConnection, handMadeConnection } from '../../helpers/tracer.ts';

type Conn = HandMadeConnection;

const endpoint = ep('10.1.0.1', 8080);

/** A connection as the relay makes one. */
function conn(n: number, startMs = 1_800_000_000_000 + n * 10): Conn {
  return handMadeConnection(n + 1, `10.244.1.${(n % 200) + 10}`, 20_000 + (n % 40_000), endpoint, startMs);
}

const REQUESTS = Array.from({ length: 8 }, (_, i) =>
  Buffer.from(`GET /cart/${i} HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n`),
);
const RESPONSE = Buffer.from(
  'HTTP/1.1 200 OK\r\nServer: t\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok',
);

/** One short HTTP/1 connection through `observer`: opened, a request, its response (a `partial` one
 * without its body), closed. */
function oneConnection(observer: ConnectionObserver, n: number, partial = false): Conn {
  const c = conn(n);
  const req = REQUESTS[n % 8]!;
  const res = partial ? RESPONSE.subarray(0, RESPONSE.length - 1) : RESPONSE;
  observer.opened(c);
  if (observer.wantsData) {
    observer.clientData!(c, req);
    observer.endpointData!(c, res);
  }
  c.bytesFromClient = req.length;
  c.bytesToClient = res.length;
  c.endMs = c.startMs + 3;
  c.closeReason = 'endpoint-fin';
  observer.closed(c);
  return c;
}

test('a traced HTTP/1 connection allocates < 950 B in the tracer (~1,150 with a copy of its app info made at close)', () => {
  const tracer = createTracer({
    mode: 'protocols',
    table: new ConnectionTable(),
    now: () => 1_800_000_000_000,
  });
  const observer = tracer.observerFor({ trace: undefined });
  const traced = allocatedPerStep((n) => oneConnection(observer, n));
  const harness = allocatedPerStep((n) => oneConnection(noopObserver, n));
  const each = traced - harness;
  assert.ok(each < 950, `${each.toFixed(0)} B a connection`);
});

test("a closed HTTP/1 connection's record reads as its sniffer's info at close, also after others closed", () => {
  const table = new ConnectionTable({ maxRecent: 3 });
  const tracer = createTracer({ mode: 'protocols', table, now: () => 1_800_000_000_001 });
  const observer = tracer.observerFor({ trace: undefined });
  for (let n = 0; n < 6; n++) oneConnection(observer, n, n === 4);
  const alone = (n: number) => {
    const s = createSniffer({ protocol: 'tcp' });
    s.onClientData(REQUESTS[n % 8]!, 1_800_000_000_001);
    s.onEndpointData(n === 4 ? RESPONSE.subarray(0, RESPONSE.length - 1) : RESPONSE, 1_800_000_000_001);
    return s.info();
  };
  const recent = table.list().recent;
  assert.deepEqual(
    recent.map((r) => r.app),
    [5, 4, 3].map(alone),
  );
  // The one closed part-way through its answer: the exchange as it stood, no duration.
  const partial = recent[1]!.app as Http1Info;
  assert.deepEqual(
    [partial.requests, partial.responses, partial.exchanges[0]!.durationMs],
    [1, 1, undefined],
  );
  // Read twice, the same.
  assert.deepEqual(table.list().recent, recent);
});
