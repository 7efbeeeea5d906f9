// Traffic that comes back to this process from its own upstream sockets: a forwarding loop the endpoint
// filter could not see (a NAT rule of someone else's, a ClusterIP added after the endpoint). Counts how
// many times a connection or session has passed through us, so the relays can refuse it past a bound.
// Only clients on this host's own addresses are followed: no work for anyone else.
import type net from 'node:net';

/**
 * A connection or UDP session may pass through this process this many times (the first included); one
 * that would pass again is refused. A real chain of Services through this proxy (A's endpoint leads to
 * B's ClusterIP) passes twice; a loop passes until refused, so a loop costs at most this many
 * connections per client connection (one more when its first hop came from another host).
 */
export const MAX_PASSES = 3;

/** What a registered upstream socket belongs to. */
export interface PassOwner {
  /** Passes before this one (0 for a client that is not one of our own sockets). */
  readonly passes: number;
}

type Entry = { owner: PassOwner; address: string };

function isLoopback(address: string): boolean {
  return address.startsWith('127.') || address === '::1';
}

export class OwnTraffic {
  /** This host's addresses (canonical), beside loopback; the proxier keeps them current. */
  #local: ReadonlySet<string> = new Set();
  readonly #tcp = new Map<number, Entry>();
  readonly #udp = new Map<number, Entry>();

  /** Replaces the host's addresses (loopback is always local). */
  setLocalAddresses(addresses: ReadonlySet<string>): void {
    this.#local = addresses;
  }

  /** True for a loopback address or one of this host's: the only sources a loop can come from. */
  isLocal(address: string): boolean {
    return isLoopback(address) || this.#local.has(address);
  }

  /** Upstream TCP sockets registered (tests, debug). */
  get tcpSize(): number {
    return this.#tcp.size;
  }

  get udpSize(): number {
    return this.#udp.size;
  }

  /**
   * Registers `owner`'s upstream socket, once its connect() has been issued (its local port is bound).
   * Returns the local port registered (0 when it has none yet: nothing is registered).
   */
  tcpOpened(owner: PassOwner, socket: net.Socket): number {
    const port = socket.localPort ?? 0;
    const address = socket.localAddress;
    if (port === 0 || address === undefined) return 0;
    this.#tcp.set(port, { owner, address });
    return port;
  }

  tcpClosed(owner: PassOwner, port: number): void {
    // Two of our sockets may share a local port (towards different destinations): the later one wins.
    if (this.#tcp.get(port)?.owner === owner) this.#tcp.delete(port);
  }

  /** How many times a TCP client at `address`:`port` has already passed through us (0 for a stranger). */
  tcpPasses(address: string, port: number): number {
    const e = this.#tcp.get(port);
    return e !== undefined && e.address === address ? e.owner.passes + 1 : 0;
  }

  udpOpened(owner: PassOwner, address: string, port: number): void {
    if (port !== 0) this.#udp.set(port, { owner, address });
  }

  udpClosed(owner: PassOwner, port: number): void {
    if (this.#udp.get(port)?.owner === owner) this.#udp.delete(port);
  }

  /** As tcpPasses, for a datagram from `address`:`port`. */
  udpPasses(address: string, port: number): number {
    const e = this.#udp.get(port);
    return e !== undefined && e.address === address ? e.owner.passes + 1 : 0;
  }
}
