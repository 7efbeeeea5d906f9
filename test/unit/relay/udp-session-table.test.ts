import assert from 'node:assert/strict';
import { test } from 'node:test';
import { type UdpSessionEntry, UdpSessionTable } from '../../../src/relay/udp-session-table.ts';
import { liveObjects } from '../../helpers/heap.ts';

type S = UdpSessionEntry & { name: string };
const session = (name: string, port: number, now: number, address = '10.0.0.1'): S => ({
  name,
  replyAddress: address,
  clientPort: port,
  lastActivityMs: now,
  expirySlot: -1,
});

/** Sweeps every `tick` ms from `from` to `to`, recording when each session expired. */
function run(
  table: UdpSessionTable<S>,
  from: number,
  to: number,
  tick: number,
  timeout: number,
  use?: (now: number) => void,
) {
  const expired = new Map<string, number>();
  for (let now = from; now <= to; now += tick) {
    use?.(now);
    table.sweep(now, timeout, (s) => {
      expired.set(s.name, now);
      table.delete(s);
    });
  }
  return expired;
}

test('lookup by address and port, without a string key; delete and re-add', () => {
  const t = new UdpSessionTable<S>(25);
  const a = session('a', 5000, 0);
  const b = session('b', 5001, 0);
  const c = session('c', 5000, 0, '::ffff:10.0.0.2');
  for (const s of [a, b, c]) t.add(s, 250);
  assert.equal(t.size, 3);
  assert.equal(t.get('10.0.0.1', 5000), a);
  assert.equal(t.get('10.0.0.1', 5001), b);
  assert.equal(t.get('::ffff:10.0.0.2', 5000), c);
  assert.equal(t.get('10.0.0.2', 5000), undefined);
  t.delete(a);
  t.delete(a);
  assert.equal(t.get('10.0.0.1', 5000), undefined);
  assert.equal(t.size, 2);
  assert.deepEqual(
    [...t.values()].map((s) => s.name),
    ['b', 'c'],
    'oldest first',
  );
});

test('an idle session expires at the first sweep at or after its timeout; a used one lives on', () => {
  const t = new UdpSessionTable<S>(25);
  const idle = session('idle', 1, 0);
  const busy = session('busy', 2, 0);
  const late = session('late', 3, 100);
  t.add(idle, 250);
  t.add(busy, 250);
  const expired = run(t, 0, 1000, 25, 250, (now) => {
    if (now <= 600) busy.lastActivityMs = now;
    if (now === 100) t.add(late, 250);
  });
  assert.equal(expired.get('idle'), 250);
  assert.equal(expired.get('late'), 350);
  assert.equal(expired.get('busy'), 850, 'its last use at 600 + 250');
  assert.equal(t.size, 0);
});

test('timeouts longer than the wheel (256 slots) and sweeps that skip time still expire on time', () => {
  const t = new UdpSessionTable<S>(25);
  const long = session('long', 1, 0);
  t.add(long, 60_000);
  const expired = run(t, 0, 70_000, 25, 60_000);
  assert.equal(expired.get('long'), 60_000);
  // A sweeper that was off for a while (no sessions) and comes back late.
  const t2 = new UdpSessionTable<S>(25);
  t2.add(session('gap', 1, 0), 250);
  const e2 = run(t2, 10_000, 10_000, 25, 250);
  assert.equal(e2.get('gap'), 10_000);
});

test('a sweep looks at what is due, not at every session', () => {
  const t = new UdpSessionTable<S>(25);
  let reads = 0;
  let sweeping = false;
  const counted = (i: number): S => {
    let last = 0;
    return {
      name: `s${i}`,
      replyAddress: '10.0.0.1',
      clientPort: i,
      expirySlot: -1,
      get lastActivityMs() {
        if (sweeping) reads++;
        return last;
      },
      set lastActivityMs(v: number) {
        last = v;
      },
    };
  };
  const sessions = Array.from({ length: 10_000 }, (_, i) => counted(i));
  for (const s of sessions) t.add(s, 60_000);
  // Every session in use all the time: 80 sweeps (2 s at 25 ms) find nothing due and look at none; the
  // sweep of every session it replaces would have read 800,000 timestamps.
  for (let now = 25; now <= 2000; now += 25) {
    for (const s of sessions) s.lastActivityMs = now;
    sweeping = true;
    t.sweep(now, 60_000, () => assert.fail('nothing is due'));
    sweeping = false;
  }
  assert.equal(reads, 0);
  assert.equal(t.size, 10_000);
});

test('a table without sessions holds no collection; a wheel slot holds a set only while it has sessions', () => {
  const N = 50;
  const sets = liveObjects(Set);
  const maps = liveObjects(Map);
  const tables = Array.from({ length: N }, () => new UdpSessionTable<S>(25));
  assert.equal(liveObjects(Set) - sets, 0, 'no wheel of 256 empty sets per idle UDP service port');
  assert.equal(liveObjects(Map) - maps, 0);
  for (const [i, t] of tables.entries()) t.add(session(`s${i}`, 1000 + i, 0), 250);
  // Each: every session, and one wheel slot; by address, and the address's ports.
  assert.equal(liveObjects(Set) - sets, 2 * N);
  assert.equal(liveObjects(Map) - maps, 2 * N);
  for (const t of tables) run(t, 0, 1000, 25, 250);
  assert.ok(tables.every((t) => t.size === 0));
  assert.equal(liveObjects(Set) - sets, N, 'the swept slots let their sets go');
});
