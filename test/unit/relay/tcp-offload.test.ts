// The native relay's loader and its reason codes (the relay itself: test/integration/tcp-offload.test.ts).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { closeReasonOf, loadTcpOffload } from '../../../src/relay/tcp-offload.ts';

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
