import assert from 'node:assert/strict';
import { test } from 'node:test';
import { isProxyError } from '../../../src/lib/errors.ts';
import { closeParts, type Part, startParts } from '../../../src/lib/lifecycle.ts';
import { silentLogger } from '../../../src/lib/log.ts';

const log = silentLogger();

/** A part that records what happens to it in `events`. */
function part(
  events: string[],
  name: string,
  o: { failStart?: boolean; hang?: boolean; throwClose?: boolean } = {},
): Part {
  return {
    name,
    start: async () => {
      events.push(`start ${name}`);
      if (o.failStart) throw new Error(`${name} cannot start`);
    },
    close: async () => {
      events.push(`close ${name}`);
      if (o.throwClose) throw new Error(`${name} cannot close`);
      if (o.hang) await new Promise(() => {});
    },
    destroy: () => events.push(`destroy ${name}`),
  };
}

test('parts start in order and close in reverse', async () => {
  const events: string[] = [];
  const started: Part[] = [];
  await startParts([part(events, 'a'), part(events, 'b'), part(events, 'c')], {
    log,
    boundMs: 1000,
    started,
  });
  assert.deepEqual(await closeParts(started, log, 1000), []);
  assert.deepEqual(events, ['start a', 'start b', 'start c', 'close c', 'close b', 'close a']);
});

test('a part that fails to start closes the ones before it, and the error is thrown', async () => {
  const events: string[] = [];
  const started: Part[] = [];
  await assert.rejects(
    startParts(
      [part(events, 'a'), part(events, 'b'), part(events, 'c', { failStart: true }), part(events, 'd')],
      {
        log,
        boundMs: 1000,
        started,
      },
    ),
    /c cannot start/,
  );
  assert.deepEqual(events, ['start a', 'start b', 'start c', 'close b', 'close a']);
  assert.deepEqual(started, [], 'nothing left to close');
});

test('a close that takes longer than its bound: KUP_ERR_SHUTDOWN_TIMEOUT, destroyed, the rest still close', async () => {
  const events: string[] = [];
  const parts = [
    part(events, 'a'),
    { ...part(events, 'b', { hang: true }), closeBoundMs: 30 },
    part(events, 'c'),
  ];
  const timeouts = await closeParts(parts, log, 1000);
  assert.equal(timeouts.length, 1);
  assert.ok(isProxyError(timeouts[0], 'KUP_ERR_SHUTDOWN_TIMEOUT'));
  assert.match(timeouts[0]!.message, /^b did not close within 30 ms/);
  assert.deepEqual(events, ['close c', 'close b', 'destroy b', 'close a']);
});

test('a close that throws is destroyed and does not stop the others', async () => {
  const events: string[] = [];
  assert.deepEqual(
    await closeParts([part(events, 'a'), part(events, 'b', { throwClose: true })], log, 1000),
    [],
  );
  assert.deepEqual(events, ['close b', 'destroy b', 'close a']);
});

test('a shutdown that begins during the start stops it before the next part', async () => {
  const events: string[] = [];
  const started: Part[] = [];
  let stopping = false;
  const parts = [
    part(events, 'a'),
    {
      ...part(events, 'b'),
      start: async () => {
        events.push('start b');
        stopping = true;
      },
    },
    part(events, 'c'),
  ];
  await startParts(parts, { log, boundMs: 1000, started, stopped: () => stopping });
  assert.deepEqual(events, ['start a', 'start b']);
  assert.deepEqual(
    started.map((p) => p.name),
    ['a', 'b'],
  );
});
