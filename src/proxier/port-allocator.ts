// Proxy ports for service port listeners, from --proxy-port-range (kube-proxy's PortRange forms).
// Pure bookkeeping: the caller binds; a port that fails to bind is reported back and skipped.
import { hash } from 'node:crypto';
import { ProxyError } from '../lib/errors.ts';
import type { Logger } from '../lib/log.ts';
import { formatPortRange, type PortRange } from '../lib/port-range.ts';
import { type EphemeralPorts, readEphemeralPorts } from './ephemeral-ports.ts';

/** Where the scan for `key` starts: an offset in [0, size). */
export type StartOffset = (key: string, size: number) => number;

/** A set of ports to pass over (only `has` is read). */
export type PortSet = { has(port: number): boolean };

/**
 * The preferred offset of a service port in a range of `size` ports: the first 32 bits of the SHA-1
 * of its key (`ns/name:port/PROTO`, or that plus `/local`), big-endian, modulo `size`. The same key
 * gives the same port on every start and on every node, whatever else the manifest holds. A small
 * integer (`| 0`): the remainder of a 32-bit unsigned is a double to V8, and so was every port made
 * from it, boxed (16 bytes) in each field that held one: a listener's port, the runtime's proxy port.
 */
export function proxyPortOffset(key: string, size: number): number {
  if (size <= 0) return 0;
  return (hash('sha1', key, 'buffer').readUInt32BE(0) % size) | 0;
}

export type PortAllocatorOptions = {
  /**
   * --proxy-port-range was empty (kube-proxy: "randomly chosen"): `range` is the kernel's ephemeral
   * range (empty when unknown), and a port it cannot give comes from the kernel (0) instead of an error.
   */
  kernelChosen?: boolean;
  /** Ports of the range never handed out (net.ipv4.ip_local_reserved_ports). */
  reserved?: readonly PortRange[];
};

const FREE = 0;
const USED = 1;
const RESERVED = 2;

/**
 * Hands out ports from a range: the scan for a service port starts at its hashed offset
 * (proxyPortOffset) and goes up, wrapping, to the first free port (the legacy allocator started at a
 * random one). Ports are not per protocol: a TCP and a UDP service port never share one.
 */
export class PortAllocator {
  readonly range: PortRange;
  /** True when --proxy-port-range was empty: ports the range cannot give are kernel-chosen (0). */
  readonly isKernelChosen: boolean;
  readonly #used: Uint8Array;
  readonly #startOffset: StartOffset;
  #inUse = 0;
  #reserved = 0;

  constructor(
    range: PortRange,
    startOffset: StartOffset = proxyPortOffset,
    options: PortAllocatorOptions = {},
  ) {
    this.range = range;
    this.isKernelChosen = options.kernelChosen ?? range.size === 0;
    this.#used = new Uint8Array(range.size);
    this.#startOffset = startOffset;
    for (const r of options.reserved ?? []) {
      const from = Math.max(r.base - range.base, 0);
      const to = Math.min(r.base + r.size - range.base, range.size);
      for (let offset = from; offset < to; offset++) {
        if (this.#used[offset] === FREE) {
          this.#used[offset] = RESERVED;
          this.#reserved++;
        }
      }
    }
  }

  get free(): number {
    return this.range.size - this.#inUse - this.#reserved;
  }

  /**
   * The first free port of the scan for `key` that `avoid` does not hold, marked used; undefined when
   * there is none (or the range is empty).
   */
  next(key: string, avoid?: PortSet): number | undefined {
    const { base, size } = this.range;
    if (size === 0) return undefined;
    const start = this.#startOffset(key, size);
    for (let i = 0; i < size; i++) {
      const offset = (start + i) % size;
      if (this.#used[offset] === FREE && !avoid?.has(base + offset)) {
        this.#used[offset] = USED;
        this.#inUse++;
        return base + offset;
      }
    }
    return undefined;
  }

  /**
   * next(), else 0 for a kernel-chosen port when --proxy-port-range was empty; else throws
   * KUP_ERR_PORT_RANGE_EXHAUSTED.
   */
  allocateNext(key: string, avoid?: PortSet): number {
    const port = this.next(key, avoid);
    if (port !== undefined) return port;
    if (this.isKernelChosen) return 0;
    throw this.exhausted();
  }

  /** The error for a range without a free port. */
  exhausted(): ProxyError {
    return new ProxyError(
      'KUP_ERR_PORT_RANGE_EXHAUSTED',
      `no free port left in --proxy-port-range ${formatPortRange(this.range)} (${this.#inUse} in use)`,
    );
  }

  /** Marks a specific port used (e.g. one remembered from a previous run). False if taken or out of range. */
  allocate(port: number): boolean {
    const offset = port - this.range.base;
    if (offset < 0 || offset >= this.range.size || this.#used[offset] !== FREE) return false;
    this.#used[offset] = USED;
    this.#inUse++;
    return true;
  }

  /** Returns a port to the pool. Ports outside the range (kernel-chosen ones) are ignored. */
  release(port: number): void {
    const offset = port - this.range.base;
    if (offset < 0 || offset >= this.range.size || this.#used[offset] !== USED) return;
    this.#used[offset] = FREE;
    this.#inUse--;
  }
}

/**
 * The allocator for --proxy-port-range: that range; or, when it is empty (kernel-chosen, kube-proxy's
 * default), the kernel's ephemeral range less its reserved ports, so that the hashed ports are the kind
 * the kernel would have chosen, with port 0 left for when none binds.
 */
export function createPortAllocator(
  range: PortRange,
  log: Logger,
  readEphemeral: () => EphemeralPorts | undefined = readEphemeralPorts,
): PortAllocator {
  if (range.size > 0) return new PortAllocator(range);
  const ephemeral = readEphemeral();
  if (ephemeral === undefined) {
    log.debug('Proxy ports are kernel-chosen: the ephemeral port range is unknown');
    return new PortAllocator(range);
  }
  log.debug(
    { range: formatPortRange(ephemeral.range), reserved: ephemeral.reserved.length },
    'Proxy ports are hashed into the ephemeral port range',
  );
  return new PortAllocator(ephemeral.range, proxyPortOffset, {
    kernelChosen: true,
    reserved: ephemeral.reserved,
  });
}
