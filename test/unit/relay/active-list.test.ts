import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ActiveList } from '../../../src/relay/active-list.ts';
import { promotedPerItem } from '../../helpers/heap.ts';

class Item {
  listIndex = -1;
  readonly name: string;
  constructor(name: string) {
    this.name = name;
  }
}

test('add, has, delete: a swap with the last item, each item knowing its place; -1 once out', () => {
  const list = new ActiveList<Item>();
  const [a, b, c] = [new Item('a'), new Item('b'), new Item('c')];
  list.add(a);
  list.add(b);
  list.add(c);
  list.add(b);
  assert.equal(list.size, 3, 'adding twice adds once');
  assert.ok(list.delete(a));
  assert.equal(a.listIndex, -1);
  assert.equal(c.listIndex, 0, 'the last item took its place');
  assert.deepEqual(
    [...list].map((i) => i.name),
    ['c', 'b'],
  );
  assert.equal(list.delete(a), false, 'not in it any more');
  assert.equal(list.has(a), false);
  const other = new ActiveList<Item>();
  other.add(new Item('x'));
  assert.equal(list.delete(other[Symbol.iterator]().next().value!), false, "another list's item");
  assert.ok(list.delete(b) && list.delete(c));
  assert.equal(list.size, 0);
  assert.deepEqual([...list], []);
});

test('a walk sees the items as they were when it began, also when it removes them', () => {
  const list = new ActiveList<Item>();
  const items = ['a', 'b', 'c', 'd'].map((n) => new Item(n));
  for (const i of items) list.add(i);
  const seen: string[] = [];
  for (const i of list) {
    seen.push(i.name);
    list.delete(i);
    if (i.name === 'b') list.add(new Item('e'));
  }
  assert.deepEqual(seen, ['a', 'b', 'c', 'd']);
  assert.deepEqual(
    [...list].map((i) => i.name),
    ['e'],
  );
});

test('items that left are not kept alive through a scavenge (a Set keeps every item since its table was promoted)', (t) => {
  const list = new ActiveList<Item>();
  const make = (n: number) => new Item(`${n}`.padEnd(400, '.'));
  const listed = promotedPerItem(
    make,
    (i) => list.add(i),
    (i) => list.delete(i),
  );
  const set = new Set<Item>();
  const inSet = promotedPerItem(
    make,
    (i) => set.add(i),
    (i) => set.delete(i),
  );
  t.diagnostic(
    `promoted per item (~450 bytes each): ActiveList ${listed.toFixed(0)} B, Set ${inSet.toFixed(0)} B`,
  );
  assert.ok(listed < 100, `${listed.toFixed(0)} bytes promoted per item that left the list`);
});
