// Line and column (both from 1) of an offset, for messages that say where in a file a problem is.
// Pure: no I/O.

export type Position = { readonly line: number; readonly col: number };

/** The position of a character offset in a string. */
export function linePosition(text: string, offset: number): Position {
  let line = 1;
  let lineStart = 0;
  for (let nl = text.indexOf('\n'); nl >= 0 && nl < offset; nl = text.indexOf('\n', nl + 1)) {
    line++;
    lineStart = nl + 1;
  }
  return { line, col: offset - lineStart + 1 };
}

/** The position of `offset` characters into `text`, where `text` starts at `base` in a larger file. */
export function positionWithin(base: Position, text: string, offset: number): Position {
  const at = linePosition(text, offset);
  return at.line === 1
    ? { line: base.line, col: base.col + at.col - 1 }
    : { line: base.line + at.line - 1, col: at.col };
}

/**
 * Positions of byte offsets in a UTF-8 text. Asking for offsets in increasing order costs one pass over the
 * text in all; the column counts characters, not bytes.
 */
export class BytePositions {
  readonly #buf: Uint8Array;
  #offset = 0;
  #line = 1;
  #col = 1;

  constructor(buf: Uint8Array) {
    this.#buf = buf;
  }

  at(offset: number): Position {
    if (offset < this.#offset) {
      this.#offset = 0;
      this.#line = 1;
      this.#col = 1;
    }
    const buf = this.#buf;
    let from = this.#offset;
    for (let nl = buf.indexOf(0x0a, from); nl >= 0 && nl < offset; nl = buf.indexOf(0x0a, nl + 1)) {
      this.#line++;
      this.#col = 1;
      from = nl + 1;
    }
    // UTF-8 continuation bytes (0b10xxxxxx) do not start a character.
    for (let i = from; i < offset; i++) if ((buf[i]! & 0xc0) !== 0x80) this.#col++;
    this.#offset = offset;
    return { line: this.#line, col: this.#col };
  }
}
