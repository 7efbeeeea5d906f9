// A listener's open connections: each added and removed in O(1) with no allocation (a swap with the last
// one, its position kept in the item), walked over a copy so that the walk may remove what it visits.
//
// Not a Set: V8 replaces a Set's table as entries come and go (a new one every few dozen adds), and a
// replaced table keeps its entries and a link to its successor (for iterators). Once one table was promoted
// to the old generation, every connection added since is reachable from it at each scavenge: under
// Connection: close load each connection's objects were copied (~550 bytes), V8 grew the young generation
// to 32 MB for it, and the scavenges took 3-10 ms, the new connections' p99. An array drops what leaves it.

/** An item that knows its place in the list (-1: in none). */
export interface Listed {
  listIndex: number;
}

/** What a reader of the list may do: count and walk. */
export interface ReadonlyActiveList<T> extends Iterable<T> {
  readonly size: number;
}

export class ActiveList<T extends Listed> implements ReadonlyActiveList<T> {
  readonly #items: T[] = [];

  get size(): number {
    return this.#items.length;
  }

  add(item: T): void {
    if (this.has(item)) return;
    item.listIndex = this.#items.length;
    this.#items.push(item);
  }

  has(item: T): boolean {
    return item.listIndex >= 0 && this.#items[item.listIndex] === item;
  }

  /** Removes `item`; false when it was not in the list. */
  delete(item: T): boolean {
    if (!this.has(item)) return false;
    const items = this.#items;
    const last = items.pop()!;
    if (last !== item) {
      items[item.listIndex] = last;
      last.listIndex = item.listIndex;
    }
    item.listIndex = -1;
    return true;
  }

  /** The items as they are now: removing one during the walk changes neither the walk nor its order. */
  [Symbol.iterator](): Iterator<T> {
    return this.#items.slice()[Symbol.iterator]();
  }
}
