// http-guard's pure parts: the limits a server gets from the descriptor limit, and the throttle of its
// log lines (a script against a manual clock).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { httpLimits, Throttled } from '../../../src/server/http-guard.ts';

const capCases = [
  { name: 'no /proc: as for 65536', soft: undefined, want: 1024 },
  { name: 'a large limit: at most 1024', soft: 1_048_576, want: 1024 },
  { name: '1/16 of the limit', soft: 4096, want: 256 },
  { name: 'a small limit: at least 64', soft: 512, want: 64 },
];
for (const c of capCases) {
  test(`connection cap: ${c.name}`, () => {
    const limits = httpLimits(c.soft === undefined ? undefined : { soft: c.soft, hard: c.soft });
    assert.equal(limits.maxConnections, c.want);
    assert.equal(limits.maxConnectionsPerClient, 0);
  });
}

test('timeouts in seconds, not Node’s minutes; overrides win', () => {
  const limits = httpLimits(undefined, { maxConnectionsPerClient: 32, headersTimeoutMs: 2000 });
  assert.equal(limits.headersTimeoutMs, 2000);
  assert.equal(limits.maxConnectionsPerClient, 32);
  const d = httpLimits(undefined);
  assert.ok(d.headersTimeoutMs <= 5000 && d.requestTimeoutMs <= 10_000 && d.keepAliveTimeoutMs <= 5000);
  assert.ok(d.headersTimeoutMs <= d.requestTimeoutMs, 'Node requires headers ≤ request');
  assert.ok(d.checkIntervalMs <= 1000);
});

test('Throttled: the first line at once, then one per interval with the count', () => {
  let now = 0;
  const written: number[] = [];
  const t = new Throttled(10_000, () => now);
  const note = () => t.note((n) => written.push(n));
  note(); // t=0: written, 1 event
  now = 1000;
  note(); // held
  now = 9999;
  note(); // held
  now = 10_000;
  note(); // written: the 3 since the last line
  now = 25_000;
  note(); // written: 1
  assert.deepEqual(written, [1, 3, 1]);
});
