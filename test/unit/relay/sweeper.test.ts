// The process's one sweep timer, driven by a fake clock: each item at its own period, the timer armed
// for the earliest due item, dropped items and an empty sweeper leave no timer behind.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { Sweepable } from '../../../src/relay/sweeper.ts';
import { Sweeper } from '../../../src/relay/sweeper.ts';
import { FakeClock } from '../../helpers/fake-clock.ts';

function recorder(name: string, log: string[], rounds = Number.POSITIVE_INFINITY): Sweepable {
  let left = rounds;
  return {
    sweep(nowMs) {
      log.push(`${name}@${nowMs}`);
      return --left > 0;
    },
  };
}

test('one timer sweeps each item at its own period, with the clock’s time', async () => {
  const clock = new FakeClock(0);
  const sweeper = new Sweeper(25, clock);
  const log: string[] = [];
  sweeper.add(recorder('udp', log)); // every 25 ms (the sweeper's period)
  sweeper.add(recorder('keepalive', log), 100);
  assert.equal(clock.pendingTimers, 1, 'one timer for both');
  await clock.advance(100); // t=100
  assert.deepEqual(log, ['udp@25', 'udp@50', 'udp@75', 'udp@100', 'keepalive@100']);
  assert.equal(clock.pendingTimers, 1);
  sweeper.stop();
  assert.equal(clock.pendingTimers, 0);
});

test('an item that returns false is dropped; with none left the timer is gone, and add arms it again', async () => {
  const clock = new FakeClock(0);
  const sweeper = new Sweeper(10, clock);
  const log: string[] = [];
  sweeper.add(recorder('a', log, 2));
  await clock.advance(50); // t=50
  assert.deepEqual(log, ['a@10', 'a@20']);
  assert.equal(sweeper.size, 0);
  assert.equal(clock.pendingTimers, 0, 'no timer while nothing is registered');
  const b = recorder('b', log);
  sweeper.add(b, 30);
  sweeper.add(b, 5); // already registered: keeps its period
  await clock.advance(60); // t=110
  assert.deepEqual(log.slice(2), ['b@80', 'b@110']);
  sweeper.delete(b);
  assert.equal(clock.pendingTimers, 0);
});

test('an item due earlier than the armed timer re-arms it', async () => {
  const clock = new FakeClock(0);
  const sweeper = new Sweeper(25, clock);
  const log: string[] = [];
  sweeper.add(recorder('slow', log), 1000);
  sweeper.add(recorder('fast', log), 10);
  await clock.advance(20); // t=20
  assert.deepEqual(log, ['fast@10', 'fast@20']);
  sweeper.stop();
});
