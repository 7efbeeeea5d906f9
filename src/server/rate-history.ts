// Rates over the last minutes for the console (/ui), per service port and in total: connections/s, bytes/s
// each way and no-endpoint closes/s, from the cumulative counters the relays already keep. Samples are
// taken when the console asks (at most one an interval), so nothing runs while nobody looks; a service
// port gets a ring only once its counters move, and loses it after a window without movement.
// Pure: time and readings come in.

/** The series, in the order of every reading and every ring. */
export const RATE_SERIES = ['connections', 'bytesFromClients', 'bytesToClients', 'noEndpoints'] as const;
const N = RATE_SERIES.length;

export type RateHistoryOptions = {
  /** Samples closer together than this are not taken (default 2 s). */
  intervalMs?: number;
  /** Samples kept (default 150: five minutes at 2 s). */
  slots?: number;
  /** A sample further than this from the previous one has no rates (nobody watched in between). */
  maxGapMs?: number;
};

/** Hands every service port's cumulative counters to `visit`, in RATE_SERIES order. */
export type ReadCounters = (
  visit: (key: string, connections: number, bytesIn: number, bytesOut: number, noEndpoints: number) => void,
) => void;

/** Rates per second of each series, oldest sample first; null where there was no rate (a gap). */
export type RateSeries = (number | null)[][];

type Track = {
  /** The counters at the previous sample (plain fields: 10,000 typed arrays would weigh 3 MB). */
  c0: number;
  c1: number;
  c2: number;
  c3: number;
  /** Rates, N per slot (Float32: a rate does not need more); undefined while the port has been idle. */
  ring: Float32Array | undefined;
  /** The sample in which a counter last moved. */
  activeSeq: number;
  seenSeq: number;
};

export class RateHistory {
  readonly intervalMs: number;
  readonly slots: number;
  readonly maxGapMs: number;
  readonly #times: Float64Array;
  readonly #totals: Float64Array;
  readonly #tracks = new Map<string, Track>();
  #next = 0;
  #count = 0;
  #seq = 0;
  #lastMs = 0;
  /** Scratch for one port's deltas (sample() is synchronous). */
  readonly #delta = new Float64Array(N);

  constructor(options: RateHistoryOptions = {}) {
    this.intervalMs = options.intervalMs ?? 2000;
    this.slots = Math.max(2, options.slots ?? 150);
    this.maxGapMs = options.maxGapMs ?? 5 * this.intervalMs;
    this.#times = new Float64Array(this.slots);
    this.#totals = new Float64Array(this.slots * N);
  }

  /** Service ports that hold a ring now (the rest have been idle for the whole window). */
  get rings(): number {
    let n = 0;
    for (const t of this.#tracks.values()) if (t.ring !== undefined) n++;
    return n;
  }

  /** When the last sample was taken (epoch ms; 0 = never). */
  get lastSampleMs(): number {
    return this.#lastMs;
  }

  /**
   * Takes a sample at `nowMs` unless the last one is less than an interval old (with a tenth of slack, for
   * a console that asks every interval). Returns whether it did.
   */
  /** True when maybeSample() at `nowMs` would take a sample. */
  due(nowMs: number): boolean {
    return this.#lastMs === 0 || nowMs - this.#lastMs >= this.intervalMs * 0.9;
  }

  maybeSample(nowMs: number, read: ReadCounters): boolean {
    if (!this.due(nowMs)) return false;
    this.sample(nowMs, read);
    return true;
  }

  /**
   * One sample: each counter's increase since the previous sample, per second. A port seen for the first
   * time counts from 0 (it opened since); a counter that went down was reset (a reopened port) and counts
   * from 0 too. The first sample, and one after a gap longer than maxGapMs, has no rates.
   */
  sample(nowMs: number, read: ReadCounters): void {
    const seq = ++this.#seq;
    const slot = this.#next;
    const gap = this.#lastMs === 0 || nowMs - this.#lastMs > this.maxGapMs || nowMs <= this.#lastMs;
    const perSecond = gap ? Number.NaN : 1000 / (nowMs - this.#lastMs);
    const base = slot * N;
    const totals = this.#totals;
    totals.fill(gap ? Number.NaN : 0, base, base + N);
    const slots = this.slots;
    const delta = this.#delta;
    read((key, c0, c1, c2, c3) => {
      let t = this.#tracks.get(key);
      if (t === undefined) {
        t = { c0: 0, c1: 0, c2: 0, c3: 0, ring: undefined, activeSeq: 0, seenSeq: 0 };
        this.#tracks.set(key, t);
      }
      t.seenSeq = seq;
      // A counter that went down was reset: it counts from 0.
      delta[0] = c0 >= t.c0 ? c0 - t.c0 : c0;
      delta[1] = c1 >= t.c1 ? c1 - t.c1 : c1;
      delta[2] = c2 >= t.c2 ? c2 - t.c2 : c2;
      delta[3] = c3 >= t.c3 ? c3 - t.c3 : c3;
      t.c0 = c0;
      t.c1 = c1;
      t.c2 = c2;
      t.c3 = c3;
      const moved = delta[0] !== 0 || delta[1] !== 0 || delta[2] !== 0 || delta[3] !== 0;
      if (moved) t.activeSeq = seq;
      if (t.ring === undefined && moved && !gap) t.ring = this.#newRing();
      const ring = t.ring;
      if (ring === undefined) return;
      for (let i = 0; i < N; i++) {
        const r = delta[i]! * perSecond;
        ring[base + i] = r;
        if (!gap) totals[base + i]! += r;
      }
    });
    for (const [key, t] of this.#tracks) {
      if (t.seenSeq !== seq) this.#tracks.delete(key);
      else if (t.ring !== undefined && seq - t.activeSeq >= slots) t.ring = undefined;
    }
    this.#times[slot] = nowMs;
    this.#lastMs = nowMs;
    this.#next = slot + 1 === slots ? 0 : slot + 1;
    if (this.#count < slots) this.#count++;
  }

  /** Earlier samples saw no movement: zeros, but gaps where the totals have them. */
  #newRing(): Float32Array {
    const ring = new Float32Array(this.slots * N);
    for (let at = 0; at < this.slots; at++)
      if (Number.isNaN(this.#totals[at * N]!)) ring.fill(Number.NaN, at * N, at * N + N);
    return ring;
  }

  /** Forgets every sample and port (nobody has looked for a while): the next sample starts afresh. */
  clear(): void {
    this.#tracks.clear();
    this.#totals.fill(Number.NaN);
    this.#next = 0;
    this.#count = 0;
    this.#lastMs = 0;
  }

  /** The sample times (epoch ms), oldest first. */
  times(): number[] {
    return this.#order().map((at) => this.#times[at]!);
  }

  /** The totals over every service port, one array per series, aligned with times(). */
  totals(): RateSeries {
    return this.#read(this.#totals);
  }

  /** One service port's rates aligned with times(); undefined when it has been idle for the whole window. */
  series(key: string): RateSeries | undefined {
    const ring = this.#tracks.get(key)?.ring;
    return ring === undefined ? undefined : this.#read(ring);
  }

  /** One series of one service port (e.g. connections/s for a sparkline); undefined when idle. */
  one(key: string, series: number): (number | null)[] | undefined {
    const ring = this.#tracks.get(key)?.ring;
    if (ring === undefined) return undefined;
    return this.#order().map((at) => rate(ring[at * N + series]!));
  }

  /** The rates of the newest sample (0 for an idle port or before the second sample). */
  latest(key: string): number[] {
    const ring = this.#tracks.get(key)?.ring;
    if (ring === undefined || this.#count === 0) return [0, 0, 0, 0];
    const at = (this.#next - 1 + this.slots) % this.slots;
    return RATE_SERIES.map((_, i) => rate(ring[at * N + i]!) ?? 0);
  }

  /** Ring positions, oldest first. */
  #order(): number[] {
    const out: number[] = [];
    for (let i = this.#count; i >= 1; i--) out.push((this.#next - i + this.slots) % this.slots);
    return out;
  }

  #read(ring: Float32Array | Float64Array): RateSeries {
    const order = this.#order();
    return RATE_SERIES.map((_, i) => order.map((at) => rate(ring[at * N + i]!)));
  }
}

/** Three significant digits are plenty for a chart and keep the JSON short; NaN (a gap) is null. */
function rate(v: number): number | null {
  if (Number.isNaN(v)) return null;
  return v === 0 ? 0 : Number(v.toPrecision(3));
}
