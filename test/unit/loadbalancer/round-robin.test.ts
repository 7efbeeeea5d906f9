import assert from 'node:assert/strict';
import { test } from 'node:test';
import { DEFAULT_OUTLIER_OPTIONS } from '../../../src/loadbalancer/outlier.ts';
import { RoundRobinBalancer } from '../../../src/loadbalancer/round-robin.ts';
import { ep } from '../../helpers/endpoints.ts';
import { liveObjects, usedHeap } from '../../helpers/heap.ts';

const A = ep('10.0.0.1', 80);
const B = ep('10.0.0.2', 80);
const C = ep('10.0.0.3', 80);

function counts(lb: RoundRobinBalancer, n: number, client = (i: number) => `192.168.0.${i % 250}`) {
  const out = new Map<string, number>();
  for (let i = 0; i < n; i++) {
    const e = lb.pick(client(i), 0);
    assert.ok(e);
    out.set(e.key, (out.get(e.key) ?? 0) + 1);
  }
  return out;
}

test('no endpoints: pick returns undefined', () => {
  const lb = new RoundRobinBalancer();
  assert.equal(lb.pick('1.2.3.4', 0), undefined);
});

test('round robin is exactly even over 3 endpoints', () => {
  const lb = new RoundRobinBalancer();
  lb.setEndpoints([A, B, C]);
  assert.deepEqual([...counts(lb, 300).values()], [100, 100, 100]);
});

test('order is a shuffle of the endpoint list, visited cyclically', () => {
  const lb = new RoundRobinBalancer(() => 0);
  lb.setEndpoints([A, B, C]);
  const first = [0, 1, 2].map(() => lb.pick('x', 0)!.key);
  const second = [0, 1, 2].map(() => lb.pick('x', 0)!.key);
  assert.deepEqual(first, second);
  assert.deepEqual(new Set(first), new Set([A.key, B.key, C.key]));
});

test('ClientIP affinity keeps each client on one endpoint and spreads clients', () => {
  const lb = new RoundRobinBalancer();
  lb.setEndpoints([A, B, C]);
  lb.setAffinity('ClientIP', 10800);
  const chosen = new Map<string, string>();
  for (let round = 0; round < 20; round++) {
    for (let c = 0; c < 6; c++) {
      const ip = `192.168.0.${c}`;
      const e = lb.pick(ip, round * 1000)!;
      if (!chosen.has(ip)) chosen.set(ip, e.key);
      assert.equal(e.key, chosen.get(ip), `client ${ip} moved`);
    }
  }
  assert.equal(new Set(chosen.values()).size, 3);
});

test('affinity expires after timeoutSeconds without use, and use refreshes it', () => {
  const lb = new RoundRobinBalancer();
  lb.setEndpoints([A, B, C]);
  lb.setAffinity('ClientIP', 10);
  const first = lb.pick('c1', 0)!;
  lb.pick('other', 0); // advance the round robin
  assert.equal(lb.pick('c1', 9_000)!.key, first.key); // refreshed at 9 s
  assert.equal(lb.pick('c1', 18_999)!.key, first.key); // 9.999 s after last use
  const after = lb.pick('c1', 29_000)!; // 10 s idle: expired, new round-robin pick
  assert.notEqual(after.key, first.key);
});

test('a changed timeout applies to existing entries', () => {
  const lb = new RoundRobinBalancer();
  lb.setEndpoints([A, B, C]);
  lb.setAffinity('ClientIP', 10800);
  const first = lb.pick('c1', 0)!;
  lb.pick('other', 0);
  lb.setAffinity('ClientIP', 5);
  assert.notEqual(lb.pick('c1', 6_000)!.key, first.key);
});

test('affinity survives an endpoint update when its endpoint remains, and is reset when it goes', () => {
  const lb = new RoundRobinBalancer();
  lb.setEndpoints([A, B, C]);
  lb.setAffinity('ClientIP', 10800);
  const clients = ['c1', 'c2', 'c3'];
  const before = new Map(clients.map((c) => [c, lb.pick(c, 0)!.key]));
  const removed = before.get('c1')!;
  const remaining = [A, B, C].filter((e) => e.key !== removed);
  lb.setEndpoints([...remaining, ep('10.0.0.4', 80)]);
  for (const c of ['c2', 'c3']) assert.equal(lb.pick(c, 1)!.key, before.get(c));
  assert.notEqual(lb.pick('c1', 1)!.key, removed);
});

test('the same endpoint set keeps order, position and affinity', () => {
  const lb = new RoundRobinBalancer();
  lb.setEndpoints([A, B, C]);
  const first = lb.pick('x', 0)!;
  assert.equal(lb.setEndpoints([C, B, A]), false);
  const next = lb.pick('x', 0)!;
  assert.notEqual(next.key, first.key);
});

test('resetAffinity after a failed connect moves the client; resetAffinity pick overwrites the entry', () => {
  const lb = new RoundRobinBalancer();
  lb.setEndpoints([A, B, C]);
  lb.setAffinity('ClientIP', 10800);
  const first = lb.pick('c1', 0)!;
  const retry = lb.pick('c1', 0, true)!;
  assert.notEqual(retry.key, first.key);
  assert.equal(lb.pick('c1', 0)!.key, retry.key);
  lb.resetAffinity('c1', retry);
  assert.equal(lb.stickyEntries, 0);
});

test('cleanupStaleStickySessions removes only expired entries', () => {
  const lb = new RoundRobinBalancer();
  lb.setEndpoints([A, B]);
  lb.setAffinity('ClientIP', 10);
  lb.pick('old', 0);
  lb.pick('new', 5_000);
  assert.equal(lb.cleanupStaleStickySessions(10_000), 1);
  assert.equal(lb.stickyEntries, 1);
});

test('turning affinity off forgets entries', () => {
  const lb = new RoundRobinBalancer();
  lb.setEndpoints([A, B]);
  lb.setAffinity('ClientIP', 10);
  lb.pick('c', 0);
  lb.setAffinity('None', 0);
  assert.equal(lb.stickyEntries, 0);
  assert.deepEqual([...counts(lb, 10, () => 'same').values()], [5, 5]);
});

test('an idle balancer holds no collection: the first ClientIP pick makes the affinity table, the first failure the health table', () => {
  const N = 100;
  const maps = liveObjects(Map);
  const sets = liveObjects(Set);
  const lbs = Array.from({ length: N }, () => {
    const lb = new RoundRobinBalancer(Math.random, DEFAULT_OUTLIER_OPTIONS);
    lb.setAffinity('ClientIP', 60);
    lb.setEndpoints([A, B]);
    lb.setEndpoints([B, A]);
    lb.setEndpoints([A, B, C]);
    return lb;
  });
  assert.equal(liveObjects(Map) - maps, 0, 'no Map per idle balancer');
  assert.equal(liveObjects(Set) - sets, 0, 'no Set per idle balancer');
  for (const lb of lbs) lb.pick('192.168.0.1', 0);
  assert.equal(liveObjects(Map) - maps, N, 'one affinity table per balancer ClientIP affinity picked with');
  for (const lb of lbs) lb.reportFailure(A, 0);
  assert.equal(liveObjects(Map) - maps, 2 * N, 'and one health table per balancer with a failure');
  for (const lb of lbs) lb.setAffinity('None', 0);
  assert.equal(liveObjects(Map) - maps, N, 'affinity off: the table is let go');
  assert.equal(lbs[0]!.stickyEntries, 0);
});

test('balancers made alike share their settings: an idle one is under 90 bytes (104 with them as fields of its own)', async () => {
  const lbs: RoundRobinBalancer[] = [];
  const before = await usedHeap();
  for (let i = 0; i < 20_000; i++) {
    const lb = new RoundRobinBalancer(Math.random, DEFAULT_OUTLIER_OPTIONS);
    lb.setAffinity('None', 10800);
    lbs.push(lb);
  }
  // The array holding them: 8 bytes a balancer.
  const perBalancer = ((await usedHeap()) - before) / lbs.length - 8;
  assert.ok(perBalancer < 90, `${perBalancer.toFixed(1)} bytes a balancer`);
  const sticky = new RoundRobinBalancer(Math.random, DEFAULT_OUTLIER_OPTIONS);
  sticky.setAffinity('ClientIP', 60);
  assert.equal(sticky.sessionAffinity, 'ClientIP');
  assert.equal(lbs[0]!.sessionAffinity, 'None');
});
