// A set that counts how often each member was added: a member stays until it was deleted as often.
// For pictures several owners add to (ports, addresses); it also tells which members came or went
// since it was last asked. Pure; imports nothing of the project.

export class CountedSet<T> {
  readonly #counts = new Map<T, number>();
  /** Members whose presence differs from when takeChanged() was last called. */
  #changed = new Set<T>();

  /** Distinct members. */
  get size(): number {
    return this.#counts.size;
  }

  has(value: T): boolean {
    return this.#counts.has(value);
  }

  /** Counts `value` once more. True when it was not a member before. */
  add(value: T): boolean {
    const n = this.#counts.get(value) ?? 0;
    this.#counts.set(value, n + 1);
    if (n === 0) this.#flip(value);
    return n === 0;
  }

  /** Counts `value` once less. True when it is no member any more (false also when it was none). */
  delete(value: T): boolean {
    const n = this.#counts.get(value);
    if (n === undefined) return false;
    if (n > 1) {
      this.#counts.set(value, n - 1);
      return false;
    }
    this.#counts.delete(value);
    this.#flip(value);
    return true;
  }

  /** The values that became members or stopped being members since the last call (gone and back: not). */
  takeChanged(): ReadonlySet<T> {
    const changed = this.#changed;
    this.#changed = new Set();
    return changed;
  }

  // Presence alternates, so a second flip undoes the first.
  #flip(value: T): void {
    if (!this.#changed.delete(value)) this.#changed.add(value);
  }
}
