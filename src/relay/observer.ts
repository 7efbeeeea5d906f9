// How the data path reports connections to tracing and access logs: at open and close, and with the
// first bytes while a sniffer wants them; `noopObserver` is used when tracing is off.
import type { Endpoint } from '../state/endpoint.ts';
import type { ServicePortName } from '../state/service-port.ts';
import type { CloseReason } from './close-reason.ts';

export type ConnectAttempt = { endpoint: string; error: string };

/** The facts about one TCP connection or UDP session that observers may read. */
export interface ConnectionInfo {
  readonly id: number;
  readonly service: ServicePortName;
  readonly protocol: 'TCP' | 'UDP';
  readonly clientAddress: string;
  readonly clientPort: number;
  readonly endpoint: Endpoint | undefined;
  readonly startMs: number;
  readonly endMs: number;
  readonly bytesFromClient: number;
  readonly bytesToClient: number;
  readonly failedAttempts: readonly ConnectAttempt[];
  readonly closeReason: CloseReason | undefined;
  /**
   * Owned by the connection's observer, never read by the relay: what the observer keeps per connection
   * (the tracer: its table entry), so that its callbacks find it without a lookup.
   */
  observerData: unknown;
}

export interface ConnectionObserver {
  /** The connection reached an endpoint (TCP) or a session started (UDP). */
  opened(conn: ConnectionInfo): void;
  /**
   * Bytes from the client, just after they were written on, unchanged (only when `wantsData` is true).
   * Valid during the call only: the native TCP relay's tap hands a view of its read buffer (tcp-offload.ts).
   * Returns whether it wants more: once false, the relays stop calling either of these for the
   * connection or session (a UDP session is then relayed natively when it can be: udp-fast.ts).
   */
  clientData?(conn: ConnectionInfo, chunk: Buffer): boolean;
  /** Bytes from the endpoint, as clientData. */
  endpointData?(conn: ConnectionInfo, chunk: Buffer): boolean;
  /** The connection or session is over; `closeReason` and byte counts are final. */
  closed(conn: ConnectionInfo): void;
  readonly wantsData: boolean;
}

export const noopObserver: ConnectionObserver = {
  opened() {},
  closed() {},
  wantsData: false,
};
