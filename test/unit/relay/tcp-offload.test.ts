// The native relay's loader, its reason codes and how a tapped chunk reaches JavaScript (the relay itself:
// test/integration/tcp-offload.test.ts).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  closeReasonOf,
  loadTcpOffload,
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

test('a tapped chunk is a view of the read buffer, one per length and reused: no Buffer made per chunk', () => {
  const read = Buffer.from('GET / HTTP/1.1\r\nHost: a\r\n\r\n'.padEnd(200, 'x'));
  let onTap: ((owner: object, side: number, length: number) => boolean) | undefined;
  const calls = {
    setup: () => 0,
    setupTap: (fn: typeof onTap) => {
      onTap = fn;
      return read;
    },
  } as unknown as TcpRelayCalls;
  const offload = new TcpOffload(calls, true, { KUP_TCP_DIAL: 'off' });
  assert.equal(offload.tap, true);
  const chunks: [number, Buffer, string][] = [];
  const owner = {
    relayTapped(side: number, chunk: Buffer): boolean {
      chunks.push([side, chunk, chunk.toString('latin1')]);
      return true;
    },
  };
  for (const [side, length] of [
    [0, 27],
    [1, 27],
    [0, 5],
    [0, 27 + 64], // the slot of 27, another length
    [1, 27],
  ] as const)
    onTap!(owner, side, length);
  const text = read.toString('latin1');
  assert.deepEqual(
    chunks.map(([side, c, s]) => [side, c.length, s]),
    [27, 27, 5, 91, 27].map((n, i) => [[0, 1, 0, 0, 1][i], n, text.slice(0, n)]),
  );
  assert.equal(chunks[1]![1], chunks[0]![1], 'the same view for the same length');
  assert.equal(chunks[0]![1].buffer, read.buffer);
});
