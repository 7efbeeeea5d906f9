// Byte helpers shared by the sniffers: a bounded collector that gathers a message across chunks (no copy
// when one chunk holds it all), and bounds-checked field readers. Pure: no I/O.

/**
 * Gathers exactly `need` bytes from a stream of chunks. When a single chunk holds them all, take() returns a
 * view of that chunk (valid only until the caller returns: never keep it); otherwise they are copied into an
 * internal buffer of `need` bytes, so callers must cap `need`.
 */
export class ByteCollector {
  #buf: Buffer | undefined = undefined;
  #view: Buffer | undefined = undefined;
  #have = 0;
  #need = 0;

  /** Starts a new message of `need` bytes, dropping anything collected. */
  reset(need: number): void {
    this.#have = 0;
    this.#need = need;
    this.#view = undefined;
  }

  get full(): boolean {
    return this.#have === this.#need;
  }

  get have(): number {
    return this.#have;
  }

  /** Takes bytes from buf[off, end) towards `need`; returns the offset after what it took. */
  push(buf: Buffer, off: number, end: number): number {
    const want = this.#need - this.#have;
    if (want <= 0 || off >= end) return off;
    const avail = end - off;
    if (this.#have === 0 && avail >= want) {
      this.#view = buf.subarray(off, off + want);
      this.#have = want;
      return off + want;
    }
    if (this.#buf === undefined || this.#buf.length < this.#need) this.#buf = Buffer.allocUnsafe(this.#need);
    const take = Math.min(want, avail);
    buf.copy(this.#buf, this.#have, off, off + take);
    this.#have += take;
    if (this.#have === this.#need) this.#view = this.#buf.subarray(0, this.#need);
    return off + take;
  }

  /** The complete message; then the collector is empty. */
  take(): Buffer {
    const v = this.#view ?? Buffer.alloc(0);
    this.#view = undefined;
    this.#have = 0;
    this.#need = 0;
    return v;
  }

  /** What has been copied so far of an incomplete message (for best-effort parsing of truncated input). */
  partial(): Buffer {
    if (this.#have === 0 || this.#buf === undefined || this.#view !== undefined) return Buffer.alloc(0);
    return this.#buf.subarray(0, this.#have);
  }
}

/** Index of the first NUL in buf[off, end), or -1. */
export function indexOfNul(buf: Buffer, off: number, end: number): number {
  const i = buf.indexOf(0, off);
  return i === -1 || i >= end ? -1 : i;
}

/** buf[s, e) as latin1, at most `max` characters. */
export function latin1(buf: Buffer, s: number, e: number, max: number): string {
  return buf.toString('latin1', s, e - s > max ? s + max : e);
}

/** Does buf[s, e) equal `lower` (lower-case ASCII) ignoring ASCII case? */
export function equalsLower(buf: Buffer, s: number, e: number, lower: string): boolean {
  if (e - s !== lower.length) return false;
  for (let i = 0; i < lower.length; i++) {
    let c = buf[s + i]!;
    if (c >= 0x41 && c <= 0x5a) c |= 0x20;
    if (c !== lower.charCodeAt(i)) return false;
  }
  return true;
}

/** Does buf at `off` start with the bytes of `ascii` (as far as buf goes up to `end`)? */
export function prefixState(buf: Buffer, off: number, end: number, ascii: string): 'yes' | 'no' | 'more' {
  const n = ascii.length;
  for (let i = 0; i < n; i++) {
    if (off + i >= end) return 'more';
    if (buf[off + i] !== ascii.charCodeAt(i)) return 'no';
  }
  return 'yes';
}
