// A small direct-mapped cache of latin1 strings read from bytes: the Host and paths of a busy Service repeat,
// so each connection's exchanges share one string instead of each holding its own copy (and the data path
// decodes none). Pure: no I/O; bounded (one string a slot).

const SLOTS = 64;

export class Latin1Cache {
  readonly #strings: (string | undefined)[] = new Array(SLOTS);

  /** buf[s, e) as latin1, at most `max` characters: the cached string when it has the same characters. */
  get(buf: Buffer, s: number, e: number, max: number): string {
    if (e - s > max) e = s + max;
    const n = e - s;
    if (n === 0) return '';
    const slot = (n * 31 + buf[s]! + buf[e - 1]! * 7 + buf[s + (n >> 1)]! * 13) & (SLOTS - 1);
    const cached = this.#strings[slot];
    if (cached !== undefined && cached.length === n) {
      let i = 0;
      while (i < n && cached.charCodeAt(i) === buf[s + i]) i++;
      if (i === n) return cached;
    }
    const str = buf.toString('latin1', s, e);
    this.#strings[slot] = str;
    return str;
  }
}
