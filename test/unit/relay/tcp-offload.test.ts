// The native relay's loader and its reason codes (the relay itself: test/integration/tcp-offload.test.ts).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  adoptRelay,
  closeReasonOf,
  loadTcpOffload,
  type OffloadOwner,
  ownedRelays,
  TAP_FIELDS,
  TcpOffload,
  type TcpRelayCalls,
} from '../../../src/relay/tcp-offload.ts';

test('KUP_TCP_OFFLOAD=off keeps the relay in JavaScript, and says so', () => {
  const support = loadTcpOffload({ KUP_TCP_OFFLOAD: 'off' });
  assert.equal(support.calls, undefined);
  assert.match(support.error ?? '', /KUP_TCP_OFFLOAD=off/);
});

test('the addon loads when built (npm run build; CI builds it before the tests)', () => {
  const support = loadTcpOffload({});
  assert.ok(support.calls, support.error);
  assert.equal(typeof support.calls.start, 'function');
});

test("native reason codes map to the JavaScript relay's close reasons", () => {
  assert.deepEqual([1, 2, 3, 4, 5, 6, 7, 8].map(closeReasonOf), [
    'client-fin',
    'endpoint-fin',
    'client-reset',
    'endpoint-reset',
    'error',
    'idle-timeout',
    'half-close-timeout',
    'stalled',
  ]);
  assert.equal(closeReasonOf(99), 'error');
});

/** A stand-in for the addon's tap: its callback, the entries' array, and a Buffer laid out as the addon's. */
function fakeTap() {
  const tap: { onTap?: (count: number) => void; info?: Float64Array } = {};
  // The read buffer (64 KiB), the queue's area (16 KiB), JavaScript's stage (4 KiB).
  const buffer = Buffer.alloc(65536 + 16384 + 4096);
  // Slots far above what a real relay of this process takes (the owners' table is the process's).
  let nextSlot = 900;
  const calls = {
    setup: () => 0,
    start: () => nextSlot++,
    abort: () => 0,
    setupTap: (fn: (count: number) => void, info: Float64Array) => {
      tap.onTap = fn;
      tap.info = info;
      return buffer;
    },
  } as unknown as TcpRelayCalls;
  const offload = new TcpOffload(calls, true, { KUP_TCP_DIAL: 'off' });
  assert.equal(offload.tap, true);
  let count = 0;
  /** A relay started for `owner`: its slot. */
  const own = (owner: object) => adoptRelay(calls.start(0, 0, 0, 0, 0, 0), owner as OffloadOwner);
  /** Queues a chunk of `text` at `offset` of the Buffer, for the relay in `slot`. */
  const chunk = (slot: number, side: number, offset: number, text: string) => {
    buffer.write(text, offset, 'latin1');
    tap.info!.set([0, side, offset, text.length, 0, slot], TAP_FIELDS * count++);
  };
  const entry = (slot: number, fields: number[]) =>
    tap.info!.set([...fields, 0, 0, 0, 0].slice(0, TAP_FIELDS - 1).concat(slot), TAP_FIELDS * count++);
  const flush = () => {
    tap.onTap!(count);
    count = 0;
  };
  return { tap, offload, own, chunk, entry, flush };
}

test("a batch's queue reaches each relay's owner in order: its connect, its chunks (whether it wants more goes back), its end", () => {
  const { tap, offload, own, chunk, entry, flush } = fakeTap();
  const seen: string[] = [];
  const owner = (name: string, wants: boolean) => ({
    attemptEnded: (status: number) => seen.push(`${name} connected ${status}`),
    relayTapped(side: number, c: Buffer): boolean {
      seen.push(`${name} ${side} ${c.toString('latin1')}`);
      return wants;
    },
    relayEnded: (reason: string, from: number, to: number) =>
      seen.push(`${name} ended ${reason} ${from} ${to}`),
  });
  const a = own(owner('a', true));
  const b = own(owner('b', false));
  // c aborts its relay from its first chunk: what the batch still has of it is dropped.
  const c = own({
    ...owner('c', true),
    relayTapped(_side: number, chunk: Buffer) {
      seen.push(`c 0 ${chunk.toString('latin1')}, aborted`);
      offload.abort(c, 0);
      return true;
    },
  });
  const owned = ownedRelays();
  entry(a, [1]);
  chunk(a, 0, 65536, 'GET /a');
  entry(b, [1]);
  chunk(b, 0, 65536 + 6, 'GET /b');
  chunk(c, 0, 65536 + 12, 'GET /c');
  chunk(a, 1, 0, 'HTTP/1.1 200 OK'); // a large one, handed over from the read buffer
  chunk(c, 1, 0, 'HTTP/1.1 200 OK');
  entry(c, [2, 1, 6, 15]);
  entry(a, [2, 2, 6, 3_000_000_000]);
  flush();
  assert.deepEqual(seen, [
    'a connected 0',
    'a 0 GET /a',
    'b connected 0',
    'b 0 GET /b',
    'c 0 GET /c, aborted',
    'a 1 HTTP/1.1 200 OK',
    'a ended endpoint-fin 6 3000000000',
  ]);
  // Written back for the addon: a wants more, b does not (nor c, left out).
  assert.deepEqual(
    [1, 3, 5, 6].map((i) => tap.info![TAP_FIELDS * i + 4]),
    [1, 0, 1, 0],
  );
  // a's end and c's abort let go of their owners; b's relay runs on.
  assert.equal(ownedRelays(), owned - 2);
  offload.abort(b, 0);
});

test('a small tapped chunk is read through a view kept for its length: no Buffer made per chunk', () => {
  const { own, offload, chunk, flush } = fakeTap();
  const chunks: [Buffer, string][] = [];
  const owner = {
    relayTapped(_side: number, c: Buffer): boolean {
      chunks.push([c, c.toString('latin1')]);
      return true;
    },
  };
  const texts = [
    'GET /a HTTP/1.1',
    'GET /b HTTP/1.1',
    'HTTP/1.1 200',
    'GET /c HTTP/1.1'.padEnd(15 + 64, 'x'),
  ];
  const slot = own(owner);
  let offset = 65536;
  for (const text of texts) {
    chunk(slot, 0, offset, text);
    offset += text.length;
  }
  chunk(slot, 1, 0, 'y'.repeat(5000)); // larger than the stage: a view of where it is
  flush();
  offload.abort(slot, 0);
  assert.deepEqual(
    chunks.map(([, s]) => s),
    [...texts, 'y'.repeat(5000)],
  );
  assert.equal(chunks[1]![0], chunks[0]![0], 'the same view for the same length');
  assert.notEqual(chunks[3]![0], chunks[0]![0], 'another length in the same slot');
});
