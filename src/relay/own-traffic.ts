// Traffic that comes back to this process from its own upstream sockets: a forwarding loop the endpoint
// filter (proxier/loop-guard.ts) could not see, such as an endpoint on a local address added after the
// last sync. Counts how many times a connection or session has passed through us, so the relays can
// refuse it past a bound. A pass is counted only when the client is one of our upstream sockets (its
// address and port) AND that socket went to the address and port the client arrived at: a stranger whose
// source port happens to equal one of ours (Linux shares a local port among connections to different
// destinations) is never taken for a loop. A loop through NAT (someone else's rule sending an endpoint
// back to us) changes the destination and is not seen here: the per-service caps bound it.
// Only clients on this host's own addresses are followed: no work for anyone else.
import type net from 'node:net';
import { isLoopbackIP } from '../lib/ip.ts';

/**
 * A connection or UDP session may pass through this process this many times (the first included); one
 * that would pass again is refused. A loop passes until refused, so it costs at most this many
 * connections per client connection (one more when its first hop came from another host).
 */
export const MAX_PASSES = 3;

/** What a registered upstream socket belongs to. */
export interface PassOwner {
  /** Passes before this one (0 for a client that is not one of our own sockets). */
  readonly passes: number;
}

/** An upstream socket: whose it is, and the address and port it was sent to. */
type Entry = { owner: PassOwner; toAddress: string; toPort: number };

/** The owner of an entry that was removed (see release). */
const RELEASED: PassOwner = Object.freeze({ passes: 0 });

/**
 * Removes `key`'s entry if `owner` still has it, and first lets go of the owner: V8 replaces a Map's table
 * as entries come and go, and a replaced table keeps its entries (and a link to its successor) until the
 * next full GC, so under churn an entry's owner (a connection and all it holds) would be copied at every
 * scavenge (active-list.ts says more).
 */
function release(map: Map<string, Entry>, owner: PassOwner, key: string): void {
  const e = map.get(key);
  if (e === undefined || e.owner !== owner) return;
  e.owner = RELEASED;
  map.delete(key);
}

/** An upstream socket's local address and port: the client address it has when it comes back to us. */
function keyOf(address: string, port: number): string {
  return `${address}|${port}`;
}

export class OwnTraffic {
  /** This host's addresses (canonical), beside loopback; the proxier keeps them current. */
  #local: ReadonlySet<string> = new Set();
  readonly #tcp = new Map<string, Entry>();
  readonly #udp = new Map<string, Entry>();

  /** Replaces the host's addresses (loopback is always local). */
  setLocalAddresses(addresses: ReadonlySet<string>): void {
    this.#local = addresses;
  }

  /** True for a loopback address or one of this host's: the only sources a loop can come from. */
  isLocal(address: string): boolean {
    return isLoopbackIP(address) || this.#local.has(address);
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
   * Returns the key to close it with ('' when it has no local port yet: nothing is registered).
   */
  tcpOpened(owner: PassOwner, socket: net.Socket, toAddress: string, toPort: number): string {
    return this.tcpOpenedAt(owner, socket.localAddress, socket.localPort ?? 0, toAddress, toPort);
  }

  /** As tcpOpened, for an upstream socket known by its local address and port (dialled natively). */
  tcpOpenedAt(
    owner: PassOwner,
    address: string | undefined,
    port: number,
    toAddress: string,
    toPort: number,
  ): string {
    if (port === 0 || address === undefined) return '';
    const key = keyOf(address, port);
    this.#tcp.set(key, { owner, toAddress, toPort });
    return key;
  }

  tcpClosed(owner: PassOwner, key: string): void {
    // Linux reuses a local address and port towards another destination: the later socket wins.
    release(this.#tcp, owner, key);
  }

  /**
   * How many times a TCP client at `address`:`port`, accepted on `localAddress`:`localPort`, has already
   * passed through us: 0 for a stranger, or for one of our sockets that went somewhere else.
   */
  tcpPasses(address: string, port: number, localAddress: string, localPort: number): number {
    const e = this.#tcp.get(keyOf(address, port));
    if (e === undefined || e.toPort !== localPort || e.toAddress !== localAddress) return 0;
    return e.owner.passes + 1;
  }

  /** Registers a UDP session's upstream socket; returns the key to close it with ('' for none). */
  udpOpened(owner: PassOwner, address: string, port: number, toAddress: string, toPort: number): string {
    if (port === 0) return '';
    const key = keyOf(address, port);
    this.#udp.set(key, { owner, toAddress, toPort });
    return key;
  }

  udpClosed(owner: PassOwner, key: string): void {
    release(this.#udp, owner, key);
  }

  /**
   * As tcpPasses, for a datagram from `address`:`port` to the listener on `listenerPort`. A datagram's
   * destination address is not known to a dgram socket: one of this host's addresses is taken as ours.
   */
  udpPasses(address: string, port: number, listenerPort: number): number {
    const e = this.#udp.get(keyOf(address, port));
    if (e === undefined || e.toPort !== listenerPort || !this.isLocal(e.toAddress)) return 0;
    return e.owner.passes + 1;
  }
}
