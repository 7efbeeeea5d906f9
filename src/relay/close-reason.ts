// Why a connection or session ended, and why a connect attempt failed: socket failures on the relay
// are not wrapped, they become one of these strings once. Pure: no I/O.

/** Why a connection or session ended, decided once. */
export type CloseReason =
  | 'client-fin'
  | 'endpoint-fin'
  | 'client-reset'
  | 'endpoint-reset'
  | 'error'
  | 'idle-timeout'
  | 'half-close-timeout'
  /** The client waited for an endpoint that took none of its bytes, past the stall timeout. */
  | 'stalled'
  | 'no-endpoints'
  | 'connect-failed'
  | 'service-removed'
  | 'evicted'
  /** A UDP session whose endpoint left the service port's endpoints (closed so the next datagram picks again). */
  | 'endpoint-removed'
  | 'shutdown';

/** Why a connect attempt failed, as the connect-failure counters name it. */
export type ConnectFailureReason = 'refused' | 'timeout' | 'unreachable' | 'fd-exhausted' | 'error';

/** Maps a socket error to a short reason for connect-failure counters. */
export function connectErrorReason(err: NodeJS.ErrnoException | undefined): ConnectFailureReason {
  switch (err?.code) {
    case 'ECONNREFUSED':
      return 'refused';
    case 'ETIMEDOUT':
    case 'KUP_CONNECT_TIMEOUT':
      return 'timeout';
    case 'EHOSTUNREACH':
    case 'ENETUNREACH':
      return 'unreachable';
    case 'EMFILE':
    case 'ENFILE':
      return 'fd-exhausted';
    default:
      return 'error';
  }
}
