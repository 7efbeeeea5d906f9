import assert from 'node:assert/strict';
import { test } from 'node:test';
import { newServicePortStats } from '../../../src/relay/service-context.ts';
import type { ConnectionListing, ConnectionRecord } from '../../../src/trace/connection-table.ts';
import { mergeListings, mergeStats } from '../../../src/workers/merge.ts';

test('mergeStats: every counter summed, maps and records by key; the own object untouched', () => {
  const own = newServicePortStats();
  own.accepted = 5;
  own.active = 2;
  own.bytesFromClients = 100;
  own.connectFailures = { refused: 1 };
  own.picks = new Map([['10.0.0.1:80', 5]]);
  own.rejected = { limit: 2 };
  const w = newServicePortStats();
  w.accepted = 7;
  w.active = 1;
  w.bytesToClients = 50;
  w.noEndpoints = 3;
  w.connectFailures = { refused: 2, timeout: 1 };
  w.picks = new Map([
    ['10.0.0.1:80', 4],
    ['10.0.0.2:80', 3],
  ]);
  w.udpSessionsEvicted = 9;
  w.ejections = 1;
  const m = mergeStats(own, [w, w]);
  assert.equal(m.accepted, 19);
  assert.equal(m.active, 4);
  assert.equal(m.bytesFromClients, 100);
  assert.equal(m.bytesToClients, 100);
  assert.equal(m.noEndpoints, 6);
  assert.deepEqual(m.connectFailures, { refused: 5, timeout: 2 });
  assert.deepEqual(
    [...m.picks],
    [
      ['10.0.0.1:80', 13],
      ['10.0.0.2:80', 6],
    ],
  );
  assert.deepEqual(m.rejected, { limit: 2 });
  assert.equal(m.udpSessionsEvicted, 18);
  assert.equal(m.ejections, 2);
  assert.equal(own.accepted, 5);
  assert.equal(own.picks.get('10.0.0.1:80'), 5);
  assert.equal(mergeStats(own, []), own);
});

const rec = (id: number, startMs: number, endMs: number | null): ConnectionRecord =>
  ({ id, startMs, endMs, state: endMs === null ? 'active' : 'closed' }) as ConnectionRecord;
const listing = (active: ConnectionRecord[], recent: ConnectionRecord[], dropped = 0): ConnectionListing => ({
  active,
  recent,
  totals: { active: active.length, recent: recent.length },
  dropped,
});

test('mergeListings: newest first across processes, limited, totals summed', () => {
  const main = listing([rec(3, 300, null), rec(1, 100, null)], [rec(2, 50, 200)], 1);
  const worker = listing([rec(2 ** 40 + 2, 250, null)], [rec(2 ** 40 + 1, 60, 400)], 2);
  const m = mergeListings([main, worker], 2);
  assert.deepEqual(
    m.active.map((r) => r.id),
    [3, 2 ** 40 + 2],
  );
  assert.deepEqual(
    m.recent.map((r) => r.id),
    [2 ** 40 + 1, 2],
    'closed: the latest close first',
  );
  assert.deepEqual(m.totals, { active: 3, recent: 2 });
  assert.equal(m.dropped, 3);
  assert.equal(mergeListings([main]), main);
});
