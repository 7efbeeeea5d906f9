// HTTP/2 with prior knowledge (h2c): the 24-byte client preface is all we look at; no HPACK, so no
// headers. Pure: no I/O.
import { prefixState } from './bytes.ts';
import type { H2cInfo, Sniffer } from './types.ts';

/** RFC 9113 §3.4 client connection preface. */
export const H2_PREFACE = 'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n';

/** Does buf[off, end) start the h2 preface? 'more' while it could still be. */
export function looksLikeH2c(buf: Buffer, off: number, end: number): 'yes' | 'no' | 'more' {
  return prefixState(buf, off, end, H2_PREFACE);
}

/** Classification already saw the preface: nothing more to learn. */
export class H2cSniffer implements Sniffer {
  get done(): boolean {
    return true;
  }

  onClientData(_buf: Buffer, _nowMs: number): void {}

  onEndpointData(_buf: Buffer, _nowMs: number): void {}

  info(): H2cInfo {
    return { protocol: 'h2c' };
  }
}
