import assert from 'node:assert/strict';
import { test } from 'node:test';
import { BoundedFrequencyRunner } from '../../../src/proxier/bounded-frequency-runner.ts';
import { FakeClock } from '../../helpers/fake-clock.ts';

function setup(options: { min?: number; max?: number; fn?: () => unknown } = {}) {
  const clock = new FakeClock();
  const runs: number[] = [];
  const errors: unknown[] = [];
  const fn = options.fn ?? (() => {});
  const runner = new BoundedFrequencyRunner(
    'test',
    () => {
      runs.push(clock.now() - 1_000_000);
      return fn();
    },
    options.min ?? 1000,
    options.max ?? 30000,
    { clock, onError: (e) => errors.push(e) },
  );
  return { clock, runs, errors, runner };
}

test('first run at start, then one per maxInterval', async () => {
  const { clock, runs, runner } = setup();
  runner.start(); // t=0
  await clock.advance(0);
  assert.deepEqual(runs, [0]);
  await clock.advance(30000); // t=30s
  assert.deepEqual(runs, [0, 30000]);
  await clock.advance(30000); // t=60s
  assert.deepEqual(runs, [0, 30000, 60000]);
  await runner.stop();
});

test('requests are rate limited to minInterval with a burst of 2, and coalesce', async () => {
  const { clock, runs, runner } = setup();
  runner.start(); // t=0: run 1 (burst token 1)
  await clock.advance(0);
  runner.run(); // t=0: run 2 (burst token 2)
  await clock.advance(0);
  runner.run(); // t=0: no token left: waits until t=1000 (one token refilled since t=0)
  runner.run(); // coalesced
  runner.run();
  await clock.advance(999);
  assert.deepEqual(runs, [0, 0]);
  await clock.advance(1); // t=1000
  assert.deepEqual(runs, [0, 0, 1000]);
  await clock.advance(5000); // t=6000: nothing asked, nothing runs
  assert.equal(runs.length, 3);
  runner.run(); // t=6000: tokens refilled, runs at once
  await clock.advance(0);
  assert.deepEqual(runs, [0, 0, 1000, 6000]);
  await runner.stop();
});

test('a request during a run waits for it and then runs again; runs never overlap', async () => {
  let release: () => void = () => {};
  let active = 0;
  let maxActive = 0;
  const { clock, runs, runner } = setup({
    min: 0,
    fn: async () => {
      active++;
      maxActive = Math.max(maxActive, active);
      await new Promise<void>((r) => {
        release = r;
      });
      active--;
    },
  });
  runner.start(); // t=0
  await clock.advance(0);
  runner.run();
  runner.run();
  await clock.advance(100);
  assert.equal(runs.length, 1);
  release();
  await clock.advance(0);
  assert.equal(runs.length, 2);
  release();
  await clock.advance(0);
  assert.equal(runs.length, 2);
  assert.equal(maxActive, 1);
  await runner.stop();
});

test('a failed run is retried after the retry interval', async () => {
  let fail = true;
  const { clock, runs, errors, runner } = setup({
    fn: () => {
      if (fail) throw new Error('restore failed');
    },
  });
  runner.start(); // t=0 fails
  await clock.advance(0);
  assert.equal(errors.length, 1);
  fail = false;
  await clock.advance(999);
  assert.equal(runs.length, 1);
  await clock.advance(1); // t=1000: retried
  assert.deepEqual(runs, [0, 1000]);
  assert.equal(errors.length, 1);
  await runner.stop();
});

test('stop() prevents further runs and clears timers', async () => {
  const { clock, runs, runner } = setup();
  runner.start();
  await clock.advance(0);
  await runner.stop();
  runner.run();
  await clock.advance(60000);
  assert.equal(runs.length, 1);
  assert.equal(clock.pendingTimers, 0);
});

test('maxInterval below minInterval is rejected', () => {
  assert.throws(() => new BoundedFrequencyRunner('x', () => {}, 10, 5));
});
