// A set that counts how often each member was added: a member stays until it was deleted as often.
// For pictures several owners add to (ports, addresses); it also tells which members came or went
// since it was last asked. Pure; imports nothing of the project.

/** Where a CountedSet keeps its members: a Set, or for port numbers PortBits. */
export interface Members<T> {
  readonly size: number;
  has(value: T): boolean;
  add(value: T): void;
  delete(value: T): void;
}

export class CountedSet<T> {
  /** The members; most are counted once, and cost only their place here. */
  readonly #members: Members<T>;
  /** How often the members counted more than once were added (a service port's ports are its own). */
  readonly #counts = new Map<T, number>();
  /** Members whose presence differs from when takeChanged() was last called. */
  #changed = new Set<T>();

  constructor(members: Members<T> = new Set<T>()) {
    this.#members = members;
  }

  /** Distinct members. */
  get size(): number {
    return this.#members.size;
  }

  has(value: T): boolean {
    return this.#members.has(value);
  }

  /** Counts `value` once more. True when it was not a member before. */
  add(value: T): boolean {
    if (this.#members.has(value)) {
      this.#counts.set(value, (this.#counts.get(value) ?? 1) + 1);
      return false;
    }
    this.#members.add(value);
    this.#flip(value);
    return true;
  }

  /** Counts `value` once less. True when it is no member any more (false also when it was none). */
  delete(value: T): boolean {
    if (!this.#members.has(value)) return false;
    const n = this.#counts.get(value);
    if (n !== undefined) {
      if (n > 2) this.#counts.set(value, n - 1);
      else this.#counts.delete(value);
      return false;
    }
    this.#members.delete(value);
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

/**
 * Port numbers (0-65535) as a bit each: 8 KiB whatever the count, where a Set's entry costs ~33 bytes
 * (10,000 service ports' proxy ports: 330 KB).
 */
export class PortBits implements Members<number> {
  readonly #bits = new Uint8Array(65536 / 8);
  #size = 0;

  get size(): number {
    return this.#size;
  }

  has(port: number): boolean {
    return (this.#bits[port >> 3]! & (1 << (port & 7))) !== 0;
  }

  add(port: number): void {
    if (this.has(port)) return;
    this.#bits[port >> 3]! |= 1 << (port & 7);
    this.#size++;
  }

  delete(port: number): void {
    if (!this.has(port)) return;
    this.#bits[port >> 3]! &= ~(1 << (port & 7));
    this.#size--;
  }
}
