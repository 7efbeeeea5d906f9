import assert from 'node:assert/strict';
import { test } from 'node:test';
import { fnv1a, rendezvousPick } from '../../../src/loadbalancer/rendezvous.ts';
import { RoundRobinBalancer } from '../../../src/loadbalancer/round-robin.ts';
import { ep } from '../../helpers/endpoints.ts';

const eps = (n: number) => Array.from({ length: n }, (_, i) => ep(`10.244.0.${10 + i}`, 8080));
const clients = Array.from({ length: 2000 }, (_, i) => `10.1.${i >> 8}.${i & 255}`);

test('fnv1a: the reference values', () => {
  assert.equal(fnv1a(''), 0x811c9dc5);
  assert.equal(fnv1a('a'), 0xe40c292c);
  assert.equal(fnv1a('foobar'), 0xbf9cf968);
});

test('rendezvous: the same pick whatever the order of the endpoints, spread evenly', () => {
  const list = eps(4);
  const reversed = [...list].reverse();
  const counts = new Map<string, number>();
  for (const c of clients) {
    const a = rendezvousPick(c, list)!;
    assert.equal(rendezvousPick(c, reversed)!.key, a.key);
    counts.set(a.key, (counts.get(a.key) ?? 0) + 1);
  }
  for (const [key, n] of counts) assert.ok(n > 400 && n < 600, `${key}: ${n} of 2000`);
});

test('rendezvous: an endpoint that leaves moves only its clients; one that joins takes only its own', () => {
  const four = eps(4);
  const three = four.slice(0, 3);
  const five = eps(5);
  let moved = 0;
  for (const c of clients) {
    const before = rendezvousPick(c, four)!;
    const after = rendezvousPick(c, three)!;
    if (before.key !== four[3]!.key) assert.equal(after.key, before.key, c);
    const joined = rendezvousPick(c, five)!;
    if (joined.key !== before.key) {
      assert.equal(joined.key, five[4]!.key, 'a client moves only to the new endpoint');
      moved++;
    }
  }
  assert.ok(moved > 300 && moved < 500, `about a fifth move to the new endpoint: ${moved}`);
  // Skipped (ejected) endpoints: the next-highest weight.
  const c = clients[0]!;
  const top = rendezvousPick(c, four)!;
  const second = rendezvousPick(c, four, (e) => e.key === top.key)!;
  assert.notEqual(second.key, top.key);
  assert.equal(
    rendezvousPick(
      c,
      four.filter((e) => e.key !== top.key),
    )!.key,
    second.key,
  );
  assert.equal(
    rendezvousPick(c, four, () => true),
    undefined,
  );
});

test('ClientIP affinity by hash: separate balancers (processes) send one client to one endpoint', () => {
  const list = eps(5);
  // Different shuffles and different histories: the rounds differ, the sticky picks do not.
  const a = new RoundRobinBalancer(() => 0.1, undefined, true);
  const b = new RoundRobinBalancer(() => 0.9, undefined, true);
  for (const lb of [a, b]) {
    lb.setEndpoints(list);
    lb.setAffinity('ClientIP', 10800);
  }
  for (let i = 0; i < 7; i++) b.pick(`10.9.9.${i}`, 0);
  for (const c of clients.slice(0, 200)) {
    const pa = a.pick(c, 1000)!;
    assert.equal(b.pick(c, 2000)!.key, pa.key, c);
    assert.equal(a.pick(c, 3000)!.key, pa.key, 'and it sticks');
  }
  // Without hashing two processes disagree for some client (the legacy per-process table).
  const x = new RoundRobinBalancer(() => 0.1);
  const y = new RoundRobinBalancer(() => 0.9);
  for (const lb of [x, y]) {
    lb.setEndpoints(list);
    lb.setAffinity('ClientIP', 10800);
  }
  assert.ok(clients.slice(0, 50).some((c) => x.pick(c, 0)!.key !== y.pick(c, 0)!.key));
});
