import assert from 'node:assert/strict';
import { test } from 'node:test';
import { DEFAULT_CONFIG } from '../../../src/config/config.ts';
import { proxierOptions, workerCount } from '../../../src/proxier/proxier-options.ts';

test('workerCount: 0 is the cores, at most 8; an explicit number is taken up to 16; never below 1', () => {
  assert.equal(workerCount(0, 2), 2);
  assert.equal(workerCount(0, 1), 1);
  assert.equal(workerCount(0, 64), 8);
  assert.equal(workerCount(1, 64), 1);
  assert.equal(workerCount(12, 2), 12);
  assert.equal(workerCount(40, 2), 16);
  assert.equal(DEFAULT_CONFIG.workers, 0, 'the default is the cores');
});

test('proxierOptions: several processes share the ports (SO_REUSEPORT) and pick sticky endpoints by hash', () => {
  const one = proxierOptions(DEFAULT_CONFIG, { soft: 1024, hard: 1024 }, 1);
  const two = proxierOptions(DEFAULT_CONFIG, { soft: 1024, hard: 1024 }, 2);
  assert.deepEqual([one.tcp.reusePort, one.udp.reusePort, one.affinityByHash], [false, false, false]);
  assert.deepEqual([two.tcp.reusePort, two.udp.reusePort, two.affinityByHash], [true, true, true]);
  assert.equal(two.tcp.maxConnections, 128, 'each process derives its caps from its own descriptor limit');
});
