// Splits a watch response into its lines (one JSON event each), looking at every byte once and holding at
// most one bounded line. Rescanning a growing string for each chunk made an endless line cost quadratic
// time (relaying stalled after 25 s); holding it whole made it cost unbounded memory. Pure: no I/O.

const NEWLINE = 0x0a;

export class LineSplitter {
  readonly #maxLineBytes: number;
  /** The bytes of the line in progress (no newline yet). */
  #parts: Buffer[] = [];
  #pendingBytes = 0;

  constructor(maxLineBytes: number) {
    this.#maxLineBytes = maxLineBytes;
  }

  /** Bytes held for the line in progress. */
  get pendingBytes(): number {
    return this.#pendingBytes;
  }

  /**
   * Hands each line that `bytes` completes to `onLine` (UTF-8 decoded, without the newline), in order.
   * False when a line passes `maxLineBytes`: the stream must be dropped (nothing more is held for it).
   * A throw from `onLine` propagates. The tail of `bytes` is kept, not copied: the caller must not reuse
   * its memory (fetch's body chunks are fresh copies).
   */
  push(bytes: Uint8Array, onLine: (line: string) => void): boolean {
    // A Buffer view for its memchr-based indexOf; no copy.
    const chunk = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    let start = 0;
    for (let nl = chunk.indexOf(NEWLINE); nl !== -1; nl = chunk.indexOf(NEWLINE, start)) {
      if (this.#pendingBytes + (nl - start) > this.#maxLineBytes) return this.#overflow();
      onLine(this.#take(chunk.subarray(start, nl)));
      start = nl + 1;
    }
    if (start < chunk.length) {
      this.#pendingBytes += chunk.length - start;
      if (this.#pendingBytes > this.#maxLineBytes) return this.#overflow();
      this.#parts.push(chunk.subarray(start));
    }
    return true;
  }

  /** The last line, which had no newline ('' when none). */
  end(): string {
    return this.#take(Buffer.alloc(0));
  }

  #take(tail: Buffer): string {
    if (this.#parts.length === 0) return tail.toString('utf8');
    this.#parts.push(tail);
    const line = Buffer.concat(this.#parts, this.#pendingBytes + tail.length).toString('utf8');
    this.#parts = [];
    this.#pendingBytes = 0;
    return line;
  }

  #overflow(): false {
    this.#parts = [];
    this.#pendingBytes = 0;
    return false;
  }
}
