// Proxy ports for service port listeners, from --proxy-port-range (kube-proxy's PortRange forms).
// Pure bookkeeping: the caller binds; a port that fails to bind is reported back and skipped.
import { ProxyError } from '../lib/errors.ts';
import { formatPortRange, type PortRange } from '../lib/port-range.ts';

/**
 * Hands out ports from a range: a random start, then a scan for a free one (as the legacy allocator,
 * without its background fill goroutine). With an empty range `allocateNext()` returns 0: bind to port
 * 0 and let the kernel choose.
 */
export class PortAllocator {
  readonly range: PortRange;
  readonly #used: Uint8Array;
  readonly #random: () => number;
  #inUse = 0;

  constructor(range: PortRange, random: () => number = Math.random) {
    this.range = range;
    this.#used = new Uint8Array(range.size);
    this.#random = random;
  }

  /** True when ports come from the kernel (no --proxy-port-range). */
  get isKernelChosen(): boolean {
    return this.range.size === 0;
  }

  get free(): number {
    return this.range.size - this.#inUse;
  }

  /**
   * A free port, marked used; 0 for a kernel-chosen port. `avoid` lists ports the caller knows it cannot
   * bind right now. Throws KUP_ERR_PORT_RANGE_EXHAUSTED when none is left.
   */
  allocateNext(avoid?: ReadonlySet<number>): number {
    const { base, size } = this.range;
    if (size === 0) return 0;
    const start = Math.floor(this.#random() * size);
    for (let i = 0; i < size; i++) {
      const offset = (start + i) % size;
      if (this.#used[offset] === 0 && !avoid?.has(base + offset)) {
        this.#used[offset] = 1;
        this.#inUse++;
        return base + offset;
      }
    }
    throw new ProxyError(
      'KUP_ERR_PORT_RANGE_EXHAUSTED',
      `no free port left in --proxy-port-range ${formatPortRange(this.range)} (${this.#inUse} in use)`,
    );
  }

  /** Marks a specific port used (e.g. one remembered from a previous run). False if taken or out of range. */
  allocate(port: number): boolean {
    const offset = port - this.range.base;
    if (this.range.size === 0 || offset < 0 || offset >= this.range.size || this.#used[offset] === 1)
      return false;
    this.#used[offset] = 1;
    this.#inUse++;
    return true;
  }

  /** Returns a port to the pool. Ports outside the range (kernel-chosen ones) are ignored. */
  release(port: number): void {
    const offset = port - this.range.base;
    if (offset < 0 || offset >= this.range.size || this.#used[offset] === 0) return;
    this.#used[offset] = 0;
    this.#inUse--;
  }
}
