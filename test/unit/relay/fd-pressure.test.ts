import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { test } from 'node:test';
import { createLogger } from '../../../src/lib/log.ts';
import { FdPressure, isFdExhausted } from '../../../src/relay/fd-pressure.ts';

function recording() {
  const lines: string[] = [];
  const log = createLogger({
    destination: new Writable({
      write(chunk, _e, cb) {
        lines.push(String(chunk));
        cb();
      },
    }),
  });
  return { lines, log };
}

const emfile = Object.assign(new Error('too many open files'), { code: 'EMFILE' });

test('isFdExhausted: EMFILE and ENFILE only', () => {
  assert.ok(isFdExhausted(emfile));
  assert.ok(isFdExhausted(Object.assign(new Error(), { code: 'ENFILE' })));
  assert.ok(!isFdExhausted(Object.assign(new Error(), { code: 'ECONNREFUSED' })));
  assert.ok(!isFdExhausted(undefined));
});

test('sheds for a back-off that doubles up to 1 s while it lasts, and starts over once relieved', () => {
  const p = new FdPressure();
  assert.equal(p.shedding(0), false, 'not before any exhaustion');
  p.exhausted('connect', 1000, emfile); // shed until 1100
  assert.equal(p.shedding(1050), true);
  p.exhausted('connect', 1060, emfile); // within the period: no longer
  assert.equal(p.shedding(1100), false);
  p.exhausted('connect', 1100, emfile); // 200 ms
  assert.equal(p.shedding(1299), true);
  assert.equal(p.shedding(1300), false);
  for (const t of [1300, 1700, 2500, 4000, 6000]) p.exhausted('connect', t, emfile); // 400, 800, 1000, 1000...
  assert.equal(p.shedding(6999), true);
  assert.equal(p.shedding(7000), false, 'capped at 1 s');
  p.relieved();
  p.exhausted('udp-session', 8000, emfile);
  assert.equal(p.shedding(8100), false, 'back to 100 ms');
  assert.deepEqual(p.counts, { accept: 0, connect: 8, 'udp-session': 1 });
  assert.equal(p.shed, 3);
});

test('logs at most once per interval, with how many events the line stands for', () => {
  const { lines, log } = recording();
  const p = new FdPressure(log);
  for (let t = 0; t < 12_000; t += 10) p.exhausted('connect', t, emfile);
  assert.equal(lines.length, 3, lines.join(''));
  const second = JSON.parse(lines[1]!) as { events: number; msg: string; code: string };
  assert.equal(second.msg, 'Out of file descriptors, shedding new connections');
  assert.equal(second.code, 'EMFILE');
  assert.equal(second.events, 500);
});

test('each operation has its own log interval: accepts failing are said at once while connects were logged', () => {
  const { lines, log } = recording();
  const p = new FdPressure(log);
  p.exhausted('connect', 0, emfile);
  p.exhausted('connect', 100, emfile);
  p.exhausted('accept', 200, emfile);
  p.exhausted('accept', 300, emfile);
  const said = lines.map((l) => JSON.parse(l) as { operation: string; counts: Record<string, number> });
  assert.deepEqual(
    said.map((l) => l.operation),
    ['connect', 'accept'],
  );
  assert.equal(said[1]!.counts.accept, 1);
});

test('accept counts the seconds without descriptors, whether the probe or a failed accept said so (or both)', () => {
  let left = true;
  const p = new FdPressure(undefined, undefined, () => (left ? undefined : emfile));
  p.sweep(0);
  assert.equal(p.counts.accept, 0, 'descriptors left: nothing to count');
  left = false;
  // Three seconds without descriptors: the probe each second, and failed accepts in between.
  for (let t = 1000; t <= 3000; t += 1000) {
    p.sweep(t);
    for (const dt of [1, 120, 480]) p.exhausted('accept', t + dt, emfile);
  }
  assert.equal(p.counts.accept, 3);
  // Failed accepts alone (no probe) still count, once in each second they happen in.
  for (let t = 10_000; t < 12_000; t += 100) p.exhausted('accept', t, emfile);
  assert.equal(p.counts.accept, 5, 'two more: the seconds from 10 s and from 11 s');
  assert.ok(p.shedding(11_950), 'they still shed');
});
