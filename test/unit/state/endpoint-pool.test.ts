// EndpointPool: one object for an endpoint several lists hold alike, let go of with the last; an
// endpoint one list holds costs the pool its entry only.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { Endpoint } from '../../../src/state/endpoint.ts';
import { EndpointPool } from '../../../src/state/endpoint-pool.ts';
import { ep } from '../../helpers/endpoints.ts';
import { usedHeap } from '../../helpers/heap.ts';

test('EndpointPool: held alike by three lists, one object until the last lets go; another alike is its own', () => {
  const pool = new EndpointPool();
  const [a, b, c] = [ep('10.0.0.1', 80), ep('10.0.0.1', 80), ep('10.0.0.1', 80)];
  const terminating = ep('10.0.0.1', 80, { terminating: true });
  const steps: { name: string; run: () => Endpoint | undefined; want: Endpoint | undefined; size: number }[] =
    [
      { name: 'the first is pooled', run: () => pool.acquire(a), want: a, size: 1 },
      { name: 'an equal one gets the pooled one', run: () => pool.acquire(b), want: a, size: 1 },
      { name: 'a third too', run: () => pool.acquire(c), want: a, size: 1 },
      {
        name: 'other conditions: its own, not pooled',
        run: () => pool.acquire(terminating),
        want: terminating,
        size: 1,
      },
      {
        name: 'releasing what was not pooled changes nothing',
        run: () => {
          pool.release(terminating);
          return undefined;
        },
        want: undefined,
        size: 1,
      },
      {
        name: 'two of three holders let go',
        run: () => {
          pool.release(a);
          pool.release(a);
          return undefined;
        },
        want: undefined,
        size: 1,
      },
      { name: 'one holder left: still the pooled one', run: () => pool.acquire(b), want: a, size: 1 },
      {
        name: 'the last two let go',
        run: () => {
          pool.release(a);
          pool.release(a);
          return undefined;
        },
        want: undefined,
        size: 0,
      },
      { name: 'gone: an equal one is pooled anew', run: () => pool.acquire(c), want: c, size: 1 },
    ];
  for (const s of steps) {
    assert.equal(s.run(), s.want, s.name);
    assert.equal(pool.size, s.size, s.name);
  }
});

test('EndpointPool: an endpoint of one list costs its entry only (under 60 bytes; 86 with a count of its own)', async () => {
  const endpoints = Array.from({ length: 20_000 }, (_, i) =>
    ep(`10.${i >> 16}.${(i >> 8) & 255}.${i & 255}`, 8080),
  );
  const pool = new EndpointPool();
  const before = await usedHeap();
  for (const e of endpoints) pool.acquire(e);
  const perEndpoint = ((await usedHeap()) - before) / endpoints.length;
  assert.equal(pool.size, endpoints.length);
  assert.ok(perEndpoint < 60, `${perEndpoint.toFixed(1)} bytes an endpoint`);
});
