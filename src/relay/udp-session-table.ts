// The UDP sessions of one listener, by client address and port, and when each goes idle. On every
// datagram the lookup builds no string (an address map of port maps: the `${address}|${port}` key it
// replaces cost ~0.5 µs a datagram to build and hash), and the only write is the session's
// lastActivityMs. Idle expiry is a hashed timing wheel: a session is looked at when its deadline's slot
// comes round, not on every sweep, so a sweep costs what is due rather than every session. A table
// without sessions holds no collection: the maps come with the first session, a wheel slot's set with
// its first session and goes when a sweep leaves it empty (256 empty sets were 40 KB per UDP port).

/** What the table needs of a session. */
export interface UdpSessionEntry {
  readonly replyAddress: string;
  readonly clientPort: number;
  lastActivityMs: number;
  /** The wheel slot it sits in; the table's to write. */
  expirySlot: number;
}

/** Slots of the wheel: with 25 ms sweeps, 256 slots cover 6.4 s before a slot comes round again. */
const WHEEL_SLOTS = 256;

const NO_SESSIONS: ReadonlySet<never> = new Set();

export class UdpSessionTable<S extends UdpSessionEntry> {
  #byAddress: Map<string, Map<number, S>> | undefined;
  /** Every session, oldest first (eviction looks at the oldest). */
  #all: Set<S> | undefined;
  /** The slots, each a set while it holds sessions. */
  #wheel: (Set<S> | undefined)[] | undefined;
  /** The wheel's granularity: the sweep interval. */
  readonly #tickMs: number;
  /** The last tick whose slot was swept; -1 before the first session. */
  #sweptTick = -1;

  constructor(tickMs: number) {
    this.#tickMs = tickMs;
  }

  get size(): number {
    return this.#all?.size ?? 0;
  }

  get(address: string, port: number): S | undefined {
    return this.#byAddress?.get(address)?.get(port);
  }

  /** Adds a session that expires `timeoutMs` after its lastActivityMs unless it is used again. */
  add(session: S, timeoutMs: number): void {
    this.#byAddress ??= new Map();
    this.#all ??= new Set();
    let ports = this.#byAddress.get(session.replyAddress);
    if (ports === undefined) {
      ports = new Map();
      this.#byAddress.set(session.replyAddress, ports);
    }
    ports.set(session.clientPort, session);
    this.#all.add(session);
    // The wheel starts turning with its first session: nothing before it is due.
    if (this.#sweptTick < 0) this.#sweptTick = Math.floor(session.lastActivityMs / this.#tickMs) - 1;
    this.#place(session, session.lastActivityMs + timeoutMs);
  }

  delete(session: S): void {
    if (this.#all?.delete(session) !== true) return;
    const ports = this.#byAddress!.get(session.replyAddress);
    if (ports !== undefined && ports.get(session.clientPort) === session) {
      ports.delete(session.clientPort);
      if (ports.size === 0) this.#byAddress!.delete(session.replyAddress);
    }
    this.#wheel?.[session.expirySlot]?.delete(session);
  }

  /** Oldest first; deleting the visited session while iterating is allowed. */
  values(): IterableIterator<S> {
    return (this.#all ?? NO_SESSIONS).values();
  }

  /**
   * Calls `expire` for every session idle `timeoutMs` or more at `nowMs` (which must delete it from
   * the table), looking only at the slots whose time came since the last call: a session still in use
   * moves to the slot of its new deadline.
   */
  sweep(nowMs: number, timeoutMs: number, expire: (session: S) => void): void {
    const tick = Math.floor(nowMs / this.#tickMs);
    // Once round the wheel at most: more would look at the same slots again.
    const from = Math.max(this.#sweptTick + 1, tick - WHEEL_SLOTS + 1);
    const wheel = this.#wheel;
    for (let t = from; wheel !== undefined && t <= tick; t++) {
      const index = slotOf(t);
      const slot = wheel[index];
      if (slot === undefined) continue;
      for (const s of slot) {
        const due = s.lastActivityMs + timeoutMs;
        if (nowMs >= due) expire(s);
        else if (Math.floor(due / this.#tickMs) !== t) this.#move(s, slot, due);
        // Due later within this very tick: the next tick's slot, not this one a whole wheel later.
        else this.#move(s, slot, (t + 1) * this.#tickMs);
      }
      if (slot.size === 0) wheel[index] = undefined;
    }
    this.#sweptTick = tick;
  }

  #place(session: S, dueMs: number): void {
    const slot = slotOf(Math.floor(dueMs / this.#tickMs));
    session.expirySlot = slot;
    this.#slot(slot).add(session);
  }

  #move(session: S, from: Set<S>, dueMs: number): void {
    const slot = slotOf(Math.floor(dueMs / this.#tickMs));
    if (this.#wheel![slot] === from) return;
    from.delete(session);
    session.expirySlot = slot;
    this.#slot(slot).add(session);
  }

  /** The set of wheel slot `index`, made when it is first needed. */
  #slot(index: number): Set<S> {
    this.#wheel ??= new Array<Set<S> | undefined>(WHEEL_SLOTS).fill(undefined);
    let slot = this.#wheel[index];
    if (slot === undefined) {
      slot = new Set();
      this.#wheel[index] = slot;
    }
    return slot;
  }
}

function slotOf(tick: number): number {
  return ((tick % WHEEL_SLOTS) + WHEEL_SLOTS) % WHEEL_SLOTS;
}
