// The listener contract the proxier opens service ports and NodePort claims with, and the default
// factory: the real TCP and UDP relays. Tests inject a factory of their own (no sockets) to drive the
// proxier alone. TcpListener and UdpListener satisfy the contract structurally.
import type { Logger } from '../lib/log.ts';
import type { EjectionListener } from '../relay/endpoint-failure.ts';
import type { FdPressure } from '../relay/fd-pressure.ts';
import type { KeepAliveSweeper } from '../relay/keepalive.ts';
import type { OriginalDestination } from '../relay/original-destination.ts';
import type { OwnTraffic } from '../relay/own-traffic.ts';
import type { ServicePortContext } from '../relay/service-context.ts';
import type { Sweeper } from '../relay/sweeper.ts';
import { type Connector, TcpListener, type TcpRelayOptions } from '../relay/tcp.ts';
import { UdpListener, type UdpRelayOptions, type UdpSessionBudget } from '../relay/udp.ts';

/** One listening socket serving one service port context. */
export interface ServicePortListener {
  /** The bound port (the kernel's choice when listen() was given 0); 0 before listen() resolved. */
  readonly port: number;
  /**
   * Binds; rejects with the socket error (EADDRINUSE, EACCES...). `ipv6Only`: a `::` listener that does
   * not also answer IPv4 (the NodePort of an IPv6-only Service).
   */
  listen(host: string, port: number, ipv6Only?: boolean): Promise<void>;
  /** Stops accepting; established TCP connections run on, UDP sessions end. Idempotent. */
  close(): Promise<void>;
  /** Stops accepting and tears down every connection now. Idempotent. */
  destroy(): void;
  /** Resolves once no connection is left (after close(): when the last established one ended). */
  drained(): Promise<void>;
  /** The context's endpoint lists changed: UDP sessions to endpoints that left close. Returns how many. */
  endpointsChanged(): number;
}

/**
 * Makes an unbound listener serving `context` (read once per connection: the proxier updates its
 * balancers in place). `host` and `ipv6Only` are where it will listen: a UDP socket's type depends on them.
 * `destination`: which portal's traffic the rules send it (a TCP listener's PROXY protocol header says
 * so); by default its own address.
 */
export type ListenerFactory = (
  context: ServicePortContext,
  host: string,
  ipv6Only: boolean,
  destination?: OriginalDestination,
) => ServicePortListener;

export type RelayListenerOptions = { tcp: TcpRelayOptions; udp: UdpRelayOptions };

export type RelayListenerDeps = {
  log: Logger;
  connect: Connector | undefined;
  now: () => number;
  /** Shared by every listener: descriptors run out for all of them at once. */
  fdPressure: FdPressure;
  /** The cap on UDP sessions across service ports; undefined = none. */
  budget: UdpSessionBudget | undefined;
  /** Shared by every listener: what comes back from our own sockets (forwarding loops). */
  ownTraffic?: OwnTraffic;
  /** Each ejection this process decides (--workers: the others are told). */
  onEjection?: EjectionListener;
  /** The one timer idle UDP sessions, TCP stalls and keep-alive are swept on (default: the process's). */
  sweeper?: Sweeper;
  keepAlive?: KeepAliveSweeper;
};

/** The real relays: a TcpListener or a UdpListener by the context's protocol. */
export function relayListeners(options: RelayListenerOptions, deps: RelayListenerDeps): ListenerFactory {
  return (context, host, ipv6Only, destination) => {
    if (context.protocol === 'TCP') return new TcpListener(context, options.tcp, deps, destination);
    return new UdpListener(context, options.udp, deps, host.includes(':') ? 'udp6' : 'udp4', ipv6Only);
  };
}
