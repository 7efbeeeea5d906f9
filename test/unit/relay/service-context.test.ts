import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  countConnectFailure,
  countPick,
  countRejected,
  newServicePortStats,
  retainPicks,
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
