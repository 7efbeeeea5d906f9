// The connection table on hand-made ConnectionInfo objects: lifecycle, live byte counts, the ring of
// closed connections and its drop count, and the filters.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { CloseReason } from '../../../src/relay/close-reason.ts';
import type { ServicePortName } from '../../../src/state/service-port.ts';
import type { ListOptions } from '../../../src/trace/connection-table.ts';
import { ConnectionTable, matchesClient, matchesService } from '../../../src/trace/connection-table.ts';
import type { AppInfo, Sniffer } from '../../../src/trace/sniff/types.ts';
import { ep } from '../../helpers/endpoints.ts';
import { medianOf, usedHeap } from '../../helpers/heap.ts';
import { type HandMadeConnection, handMadeConnection } from '../../helpers/tracer.ts';

type FakeConn = HandMadeConnection;

let ids = 1;
function conn(over: Partial<FakeConn> = {}): FakeConn {
  return { ...handMadeConnection(ids++, '10.0.0.1', 40000, ep('10.1.0.1', 8080), 1000), ...over };
}

function close(c: FakeConn, reason: CloseReason, endMs = 1500): FakeConn {
  c.closeReason = reason;
  c.endMs = endMs;
  return c;
}

test('open → active with live byte counts → closed with the final record; the connection is let go', () => {
  let now = 1200;
  const table = new ConnectionTable({ now: () => now });
  const c = conn();
  const entry = table.open(c);
  c.bytesFromClient = 10;
  c.bytesToClient = 20;
  let l = table.list();
  assert.equal(l.active.length, 1);
  assert.deepEqual(l.active[0], {
    id: c.id,
    service: 'prod/shop:web',
    protocol: 'TCP',
    client: '10.0.0.1:40000',
    endpoint: '10.1.0.1:8080',
    state: 'active',
    startMs: 1000,
    endMs: null,
    durationMs: 200,
    bytesFromClient: 10,
    bytesToClient: 20,
    attempts: [],
    closeReason: null,
    app: null,
  });
  // Read live: no copy per chunk.
  c.bytesFromClient = 1000;
  assert.equal(table.list().active[0]!.bytesFromClient, 1000);

  c.failedAttempts.push({ endpoint: '10.1.0.9:8080', error: 'ECONNREFUSED' });
  close(c, 'endpoint-fin', 1700);
  now = 5000;
  table.close(c);
  c.bytesFromClient = 99_999; // later changes to the relay object do not leak into the record
  l = table.list();
  assert.equal(l.active.length, 0);
  assert.deepEqual(l.recent[0], {
    id: c.id,
    service: 'prod/shop:web',
    protocol: 'TCP',
    client: '10.0.0.1:40000',
    endpoint: '10.1.0.1:8080',
    state: 'closed',
    startMs: 1000,
    endMs: 1700,
    durationMs: 700,
    bytesFromClient: 1000,
    bytesToClient: 20,
    attempts: [{ endpoint: '10.1.0.9:8080', error: 'ECONNREFUSED' }],
    closeReason: 'endpoint-fin',
    app: null,
  });
  assert.equal(entry.info, undefined, 'the relay object is released at close');
  assert.equal(table.activeCount, 0);
  assert.equal(table.recentCount, 1);
});

test('a connection closed without having opened (no endpoints, connect failure) goes to the ring', () => {
  const table = new ConnectionTable();
  const c = close(
    conn({
      endpoint: undefined,
      failedAttempts: [
        { endpoint: '10.1.0.1:8080', error: 'ECONNREFUSED' },
        { endpoint: '10.1.0.2:8080', error: 'KUP_CONNECT_TIMEOUT' },
      ],
    }),
    'connect-failed',
  );
  table.close(c);
  const [r] = table.list().recent;
  assert.equal(r!.endpoint, null);
  assert.equal(r!.closeReason, 'connect-failed');
  assert.equal(r!.attempts.length, 2);
});

test('the sniffer info becomes app, live while active and frozen at close', () => {
  const table = new ConnectionTable();
  let info: AppInfo = { protocol: 'unknown', reason: 'no-data' };
  const sniffer: Sniffer = {
    onClientData() {},
    onEndpointData() {},
    done: false,
    info: () => info,
  };
  const c = conn();
  const entry = table.open(c);
  entry.sniff();
  assert.equal(entry.sniffing, true);
  assert.equal(entry.sniffer, undefined, 'the first bytes start the sniffer');
  assert.deepEqual(table.list().active[0]!.app, { protocol: 'unknown', reason: 'no-data' });
  entry.sniffer = sniffer;
  info = { protocol: 'h2c' };
  assert.deepEqual(table.list().active[0]!.app, { protocol: 'h2c' });
  table.close(close(c, 'client-fin'));
  info = { protocol: 'unknown', reason: 'unrecognized' };
  assert.deepEqual(table.list().recent[0]!.app, { protocol: 'h2c' });
  assert.equal(entry.sniffer, undefined);
  assert.equal(entry.sniffing, false);
});

test('a sniffed connection that closes before any byte is no-data; one not sniffed has no app', () => {
  const table = new ConnectionTable();
  const sniffed = conn();
  table.open(sniffed).sniff();
  const plain = conn();
  table.open(plain);
  table.close(close(sniffed, 'client-fin'));
  table.close(close(plain, 'client-fin'));
  const [second, first] = table.list().recent;
  assert.deepEqual(first!.app, { protocol: 'unknown', reason: 'no-data' });
  assert.equal(second!.app, null);
});

test('an active entry copies nothing of its connection (< 100 B each; 184 when it kept its own id, service, client, endpoint and start)', async () => {
  // Enough entries, and the median of three tables, that the heap's own movement between two readings (up
  // to ~500 KB: fragments of pages too small to reuse count as used) does not decide.
  const n = 40_000;
  const conns = Array.from({ length: n }, () => conn({ startMs: 1_800_000_000_000 }));
  let table = new ConnectionTable();
  const each = await medianOf(3, async () => {
    // The last table's entries let go first (the connections' observerData still names them).
    table.clear();
    table = new ConnectionTable();
    const before = await usedHeap();
    for (const c of conns) table.open(c).sniff();
    assert.equal(table.activeCount, n);
    return ((await usedHeap()) - before) / n;
  });
  assert.ok(each < 100, `${each.toFixed(0)} B an entry`);
  // What is read from the connection is what it was opened with.
  const last = conns[n - 1]!;
  const r = table.list({ id: last.id }).active[0]!;
  assert.deepEqual(
    [r.id, r.service, r.client, r.endpoint, r.startMs],
    [last.id, 'prod/shop:web', '10.0.0.1:40000', '10.1.0.1:8080', 1_800_000_000_000],
  );
});

test('active connections are listed newest first and leave the list from anywhere in it', () => {
  const table = new ConnectionTable();
  const all = [conn(), conn(), conn(), conn()];
  for (const c of all) table.open(c);
  const ids = () => table.list({ state: 'active' }).active.map((r) => r.id);
  assert.deepEqual(ids(), all.map((c) => c.id).reverse());
  table.close(close(all[1]!, 'client-fin')); // the middle
  table.close(close(all[3]!, 'client-fin')); // the newest
  table.close(close(all[0]!, 'client-fin')); // the oldest
  assert.deepEqual(ids(), [all[2]!.id]);
  assert.equal(table.activeCount, 1);
  assert.equal(all[0]!.observerData, undefined, 'a closed connection keeps no entry');
  assert.equal(table.get(all[2]!)?.id, all[2]!.id);
  const later = conn();
  table.open(later);
  assert.deepEqual(ids(), [later.id, all[2]!.id]);
  table.clear();
  assert.equal(table.activeCount, 0);
  assert.deepEqual(ids(), []);
  assert.equal(later.observerData, undefined);
});

test('the ring keeps the newest maxRecent closed connections and counts the rest as dropped', () => {
  const table = new ConnectionTable({ maxRecent: 3 });
  const all = Array.from({ length: 7 }, () => conn());
  for (const c of all) table.open(c);
  for (const c of all) table.close(close(c, 'client-fin'));
  const l = table.list();
  assert.deepEqual(
    l.recent.map((r) => r.id),
    all
      .slice(4)
      .reverse()
      .map((c) => c.id),
  );
  assert.equal(l.dropped, 4);
  assert.equal(table.recentCount, 3);

  const none = new ConnectionTable({ maxRecent: 0 });
  none.close(close(conn(), 'no-endpoints'));
  assert.deepEqual([none.list().recent.length, none.dropped], [0, 1]);
});

test('a connection reported closed to no one (observer swapped to noop) is reaped on the next query', () => {
  const table = new ConnectionTable();
  const c = conn();
  table.open(c);
  close(c, 'client-reset');
  const l = table.list();
  assert.deepEqual([l.active.length, l.recent.length, l.recent[0]!.closeReason], [0, 1, 'client-reset']);
});

test('matchesService: a service port, every port of a service, or a namespace', () => {
  const cases: { name: string; service: string; filter: string; want: boolean }[] = [
    { name: 'exact port', service: 'prod/shop:web', filter: 'prod/shop:web', want: true },
    { name: 'other port', service: 'prod/shop:metrics', filter: 'prod/shop:web', want: false },
    { name: 'service', service: 'prod/shop:web', filter: 'prod/shop', want: true },
    { name: 'service prefix is not a match', service: 'prod/shopping:web', filter: 'prod/shop', want: false },
    { name: 'empty port name', service: 'prod/shop:', filter: 'prod/shop:', want: true },
    { name: 'empty port name vs named', service: 'prod/shop:web', filter: 'prod/shop:', want: false },
    { name: 'namespace', service: 'prod/shop:web', filter: 'prod', want: true },
    { name: 'namespace prefix is not a match', service: 'production/shop:web', filter: 'prod', want: false },
  ];
  for (const c of cases) assert.equal(matchesService(c.service, c.filter), c.want, c.name);
  assert.equal(matchesClient('10.0.0.1', 5, '10.0.0.1'), true);
  assert.equal(matchesClient('10.0.0.1', 5, '10.0.0.1:5'), true);
  assert.equal(matchesClient('10.0.0.1', 5, '10.0.0.1:6'), false);
  assert.equal(matchesClient('fd00::1', 5, '[fd00::1]:5'), true);
});

test('list filters: service, client, id, state and limit (newest first)', () => {
  const table = new ConnectionTable();
  const a1 = conn({ service: 'prod/shop:web' as ServicePortName, clientAddress: '10.0.0.1' });
  const a2 = conn({ service: 'prod/shop:metrics' as ServicePortName, clientAddress: '10.0.0.2' });
  const b1 = conn({ service: 'dev/db:' as ServicePortName, clientAddress: 'fd00::7', clientPort: 5432 });
  const c1 = conn({ service: 'prod/shop:web' as ServicePortName, clientAddress: '10.0.0.2' });
  for (const c of [a1, a2, b1, c1]) table.open(c);
  table.close(close(a2, 'client-fin'));
  const ids = (o: ListOptions) => {
    const l = table.list(o);
    return [l.active.map((r) => r.id), l.recent.map((r) => r.id)];
  };
  const cases: { name: string; options: ListOptions; want: number[][] }[] = [
    { name: 'all', options: {}, want: [[c1.id, b1.id, a1.id], [a2.id]] },
    { name: 'service port', options: { service: 'prod/shop:web' }, want: [[c1.id, a1.id], []] },
    { name: 'service', options: { service: 'prod/shop' }, want: [[c1.id, a1.id], [a2.id]] },
    { name: 'namespace', options: { service: 'dev' }, want: [[b1.id], []] },
    { name: 'client ip', options: { client: '10.0.0.2' }, want: [[c1.id], [a2.id]] },
    { name: 'client [v6]:port', options: { client: '[fd00::7]:5432' }, want: [[b1.id], []] },
    { name: 'id', options: { id: a1.id }, want: [[a1.id], []] },
    { name: 'active only', options: { state: 'active' }, want: [[c1.id, b1.id, a1.id], []] },
    { name: 'closed only', options: { state: 'closed' }, want: [[], [a2.id]] },
    { name: 'limit keeps the newest', options: { limit: 2 }, want: [[c1.id, b1.id], [a2.id]] },
  ];
  for (const c of cases) assert.deepEqual(ids(c.options), c.want, c.name);
  const l = table.list({ limit: 1 });
  assert.deepEqual(l.totals, { active: 3, recent: 1 });
  assert.equal(table.list({ id: b1.id }).active[0]!.client, '[fd00::7]:5432');
});
