import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  countConnectFailure,
  countPick,
  countRejected,
  IDLE_STATS,
  liveStats,
  newServicePortStats,
  retainPicks,
  type ServicePortContext,
} from '../../../src/relay/service-context.ts';
import { liveObjects } from '../../helpers/heap.ts';

test('new stats hold no collection of their own until the first count; each then counts alone', () => {
  const N = 100;
  const maps = liveObjects(Map);
  const all = Array.from({ length: N }, () => newServicePortStats());
  assert.equal(liveObjects(Map) - maps, 0, 'no picks Map per idle service port');
  for (const s of all) retainPicks(s, new Set());
  assert.equal(liveObjects(Map) - maps, 0);

  const [a, b] = all as [(typeof all)[0], (typeof all)[0]];
  countPick(a, '10.0.0.1:80');
  countPick(a, '10.0.0.1:80');
  countRejected(a, 'limit');
  countConnectFailure(a, 'refused');
  countConnectFailure(a, 'refused');
  assert.deepEqual([...a.picks], [['10.0.0.1:80', 2]]);
  assert.deepEqual(a.rejected, { limit: 1 });
  assert.deepEqual(a.connectFailures, { refused: 2 });
  assert.deepEqual([...b.picks], [], 'the other stats still count nothing');
  assert.deepEqual(b.rejected, {});
  assert.deepEqual(b.connectFailures, {});
  assert.equal(liveObjects(Map) - maps, 1);
  retainPicks(a, new Set());
  assert.deepEqual([...a.picks], []);
});

test('idle counters are shared and frozen; the first count gives a context, and the one it shares with, their own', () => {
  const ctx = (statsOwner?: ServicePortContext) =>
    ({
      name: 'default/web:http',
      protocol: 'TCP',
      stats: statsOwner?.stats ?? IDLE_STATS,
      statsOwner,
    }) as ServicePortContext;
  const primary = ctx();
  const second = ctx(primary);
  const other = ctx();
  assert.ok(Object.isFrozen(IDLE_STATS));
  assert.deepEqual({ ...IDLE_STATS }, { ...newServicePortStats() }, 'the zeros a new one has');
  retainPicks(primary.stats, new Set()); // an endpoint change on an idle service port writes nothing
  // A connection on the second listener counts where the primary's readers (metrics, debug) look.
  liveStats(second).accepted++;
  assert.notEqual(primary.stats, IDLE_STATS);
  assert.equal(second.stats, primary.stats);
  assert.equal(primary.stats.accepted, 1);
  assert.equal(liveStats(primary), primary.stats, 'made once');
  // The primary first, then the second listener: the same counters again.
  const p2 = ctx();
  const s2 = ctx(p2);
  liveStats(p2).accepted++;
  assert.equal(liveStats(s2), p2.stats);
  assert.equal(other.stats, IDLE_STATS, 'the other service ports are still idle');
  assert.equal(IDLE_STATS.accepted, 0);
});
