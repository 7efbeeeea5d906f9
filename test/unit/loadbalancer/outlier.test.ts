import assert from 'node:assert/strict';
import { test } from 'node:test';
import { OutlierDetector } from '../../../src/loadbalancer/outlier.ts';
import { RoundRobinBalancer } from '../../../src/loadbalancer/round-robin.ts';
import { ep } from '../../helpers/endpoints.ts';

const options = { consecutiveFailures: 3, baseEjectionMs: 1000, maxEjectionMs: 8000, maxEjectionPercent: 50 };

test('ejects after consecutive failures, for a back-off that doubles while it keeps failing', () => {
  const d = new OutlierDetector(options);
  assert.equal(d.failed('a', 0, 4), undefined); // t=0
  assert.equal(d.failed('a', 0, 4), undefined);
  const first = d.failed('a', 0, 4);
  assert.deepEqual(first, { endpoint: 'a', untilMs: 1000, ejections: 1, failures: 3 });
  assert.ok(d.isEjected('a', 999));
  assert.ok(!d.isEjected('a', 1000)); // back on probation at t=1s
  // One more failure on probation ejects it again, for twice as long.
  assert.deepEqual(d.failed('a', 1000, 4)?.untilMs, 3000);
  assert.ok(!d.isEjected('a', 3000));
  assert.deepEqual(d.failed('a', 3000, 4)?.untilMs, 7000);
  assert.ok(!d.isEjected('a', 7000));
  assert.deepEqual(d.failed('a', 7000, 4)?.untilMs, 15000); // capped at 8 s
});

test('a success forgets the streak and the back-off', () => {
  const d = new OutlierDetector(options);
  d.failed('a', 0, 4);
  d.failed('a', 0, 4);
  d.succeeded('a');
  assert.equal(d.failed('a', 0, 4), undefined);
  d.failed('a', 0, 4);
  assert.equal(d.failed('a', 0, 4)?.untilMs, 1000);
  d.succeeded('a');
  assert.equal(d.ejectedCount, 0);
});

test('never ejects past the cap, nor the last endpoint', () => {
  const d = new OutlierDetector(options);
  for (let i = 0; i < 3; i++) d.failed('only', 0, 1);
  assert.equal(d.ejectedCount, 0, 'a single endpoint is never ejected');
  const e = new OutlierDetector(options);
  for (const k of ['a', 'b', 'c', 'd']) for (let i = 0; i < 3; i++) e.failed(k, 0, 4);
  assert.equal(e.ejectedCount, 2, '50% of 4');
  const f = new OutlierDetector({ ...options, maxEjectionPercent: 10 });
  for (const k of ['a', 'b']) for (let i = 0; i < 3; i++) f.failed(k, 0, 2);
  assert.equal(f.ejectedCount, 1, 'at least one of two, even under a small percentage');
});

test('the balancer skips ejected endpoints and takes them back when their time is up', () => {
  const A = ep('10.0.0.1', 80);
  const B = ep('10.0.0.2', 80);
  const C = ep('10.0.0.3', 80);
  const lb = new RoundRobinBalancer(Math.random, options);
  lb.setEndpoints([A, B, C]);
  for (let i = 0; i < 3; i++) lb.reportFailure(B, 0);
  const picks = new Set<string>();
  for (let i = 0; i < 30; i++) picks.add(lb.pick('c', 500)!.key);
  assert.deepEqual([...picks].sort(), [A.key, C.key]);
  const later = new Set<string>();
  for (let i = 0; i < 30; i++) later.add(lb.pick('c', 1500)!.key);
  assert.ok(later.has(B.key), 'B is back after its ejection time');
});

test('affinity to an ejected endpoint moves the client', () => {
  const A = ep('10.0.0.1', 80);
  const B = ep('10.0.0.2', 80);
  const lb = new RoundRobinBalancer(Math.random, options);
  lb.setEndpoints([A, B]);
  lb.setAffinity('ClientIP', 10800);
  const first = lb.pick('client', 0)!;
  for (let i = 0; i < 3; i++) lb.reportFailure(first, 0);
  assert.notEqual(lb.pick('client', 10)!.key, first.key);
});

test('endpoints removed from the service are forgotten', () => {
  const A = ep('10.0.0.1', 80);
  const B = ep('10.0.0.2', 80);
  const lb = new RoundRobinBalancer(Math.random, options);
  lb.setEndpoints([A, B]);
  for (let i = 0; i < 3; i++) lb.reportFailure(B, 0);
  assert.equal(lb.outlier!.ejectedCount, 1);
  lb.setEndpoints([A]);
  assert.equal(lb.outlier!.ejectedCount, 0);
});

test('an ejection decided elsewhere (another worker): skipped until then, capped, and its next failure ejects longer', () => {
  const d = new OutlierDetector({ ...DEFAULTS_FOR_ELSEWHERE, consecutiveFailures: 3 });
  assert.equal(d.ejectedElsewhere('a', 10_000, 1, 3, 1000), true);
  assert.equal(d.isEjected('a', 5000), true);
  assert.equal(d.ejectedElsewhere('a', 20_000, 1, 3, 1000), false, 'already ejected');
  assert.equal(d.ejectedElsewhere('b', 10_000, 1, 3, 1000), false, 'the cap: never the last endpoint');
  assert.equal(d.ejectedElsewhere('c', 500, 1, 3, 1000), false, 'already over');
  assert.equal(d.isEjected('a', 10_000), false, 'back at its time');
  // On probation: a failure here ejects it again, for twice the base (its second ejection).
  const again = d.failed('a', 11_000, 3);
  assert.equal(again?.ejections, 2);
  assert.equal(again?.untilMs, 11_000 + 2 * DEFAULTS_FOR_ELSEWHERE.baseEjectionMs);
});

const DEFAULTS_FOR_ELSEWHERE = {
  consecutiveFailures: 3,
  baseEjectionMs: 5000,
  maxEjectionMs: 300_000,
  maxEjectionPercent: 50,
};

test('an idle balancer has no detector: the first failed connect makes it, and ejects as before', () => {
  const A = ep('10.0.0.1', 80);
  const B = ep('10.0.0.2', 80);
  const lb = new RoundRobinBalancer(Math.random, options);
  lb.setEndpoints([A, B]);
  lb.reportSuccess(A);
  for (let i = 0; i < 10; i++) lb.pick('c', 0);
  assert.equal(lb.outlier, undefined, 'picks and successes need none');
  assert.equal(lb.reportFailure(B, 0), undefined);
  assert.ok(lb.outlier !== undefined, 'made by the first failure');
  lb.reportFailure(B, 0);
  assert.equal(lb.reportFailure(B, 0)?.endpoint, B.key, 'ejected by the third in a row');
  for (let i = 0; i < 10; i++) assert.equal(lb.pick('c', 10)!.key, A.key);
  assert.equal(new RoundRobinBalancer(Math.random).ejectedElsewhere(B.key, 10_000, 1, 0), false, 'off');
});

test('an ejection from another worker reaches an idle balancer (its detector made then)', () => {
  const A = ep('10.0.0.1', 80);
  const B = ep('10.0.0.2', 80);
  const lb = new RoundRobinBalancer(Math.random, options);
  lb.setEndpoints([A, B]);
  assert.equal(lb.ejectedElsewhere(B.key, 500, 1, 1000), false, 'already over: nothing made');
  assert.equal(lb.outlier, undefined);
  assert.equal(lb.ejectedElsewhere(B.key, 5000, 1, 1000), true);
  assert.deepEqual(lb.outlier!.ejected(1000), [{ endpoint: B.key, untilMs: 5000 }]);
  for (let i = 0; i < 10; i++) assert.equal(lb.pick('c', 1000)!.key, A.key);
});
