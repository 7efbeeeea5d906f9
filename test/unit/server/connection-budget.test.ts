// ConnectionBudget: a total cap and a per-client cap, and admit/release that pair up.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ConnectionBudget } from '../../../src/server/connection-budget.ts';

test('the per-client cap refuses one client while others are admitted', () => {
  const b = new ConnectionBudget({ maxConnections: 4, maxConnectionsPerClient: 2 });
  assert.equal(b.admit('10.0.0.1'), undefined);
  assert.equal(b.admit('10.0.0.1'), undefined);
  assert.equal(b.admit('10.0.0.1'), 'client-full');
  assert.equal(b.admit('10.0.0.2'), undefined);
  assert.equal(b.admit('10.0.0.3'), undefined);
  assert.equal(b.open, 4);
  // Full: every client is refused, whatever it holds.
  assert.equal(b.admit('10.0.0.4'), 'server-full');
  b.release('10.0.0.1');
  assert.equal(b.open, 3);
  assert.equal(b.admit('10.0.0.1'), undefined);
  assert.equal(b.admit('10.0.0.1'), 'server-full');
});

test('0 = no per-client cap (the metrics server on loopback)', () => {
  const b = new ConnectionBudget({ maxConnections: 3, maxConnectionsPerClient: 0 });
  for (let i = 0; i < 3; i++) assert.equal(b.admit('127.0.0.1'), undefined);
  assert.equal(b.admit('127.0.0.1'), 'server-full');
});

test('a release without an admit changes nothing', () => {
  const b = new ConnectionBudget({ maxConnections: 1, maxConnectionsPerClient: 1 });
  b.release('10.0.0.9');
  assert.equal(b.open, 0);
  assert.equal(b.admit('10.0.0.1'), undefined);
  b.release('10.0.0.1');
  b.release('10.0.0.1');
  assert.equal(b.open, 0);
  assert.equal(b.admit('10.0.0.2'), undefined);
});
