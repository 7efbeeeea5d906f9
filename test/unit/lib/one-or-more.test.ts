import assert from 'node:assert/strict';
import { test } from 'node:test';
import { itemsOf, keptAs } from '../../../src/lib/one-or-more.ts';

test('a list of one is kept as its item; other lengths as the list; items read back the same', () => {
  const a = { n: 1 };
  const b = { n: 2 };
  assert.equal(keptAs([a]), a);
  const two = [a, b];
  assert.equal(keptAs(two), two);
  const none: { n: number }[] = [];
  assert.equal(keptAs(none), none);
  assert.deepEqual(itemsOf(keptAs([a])), [a]);
  assert.equal(itemsOf(keptAs(two)), two);
  assert.equal(itemsOf(keptAs(none)).length, 0);
});
