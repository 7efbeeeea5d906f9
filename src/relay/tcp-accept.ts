// A service port's listening socket in native code (native/tcp_listen.c), on Node's own event loop. A
// net.Server builds a net.Socket and a libuv TCP handle for every connection it accepts (and libuv asks
// getpeername for the peer's address): for a connection the native relay dials and relays (tcp-offload.ts)
// they are thrown away at once. The addon accepts with accept4() (the peer's address comes with it) and
// hands JavaScript the descriptor, the address and the port; JavaScript decides as before (caps,
// descriptor pressure, the loop guard, no endpoints) and either has the relay dial with the descriptor
// itself, or wraps it in a net.Socket for the JavaScript relay (a sniffer, a PROXY protocol header). It
// also saves the net.Server of every idle service port. Without the addon (or with KUP_TCP_ACCEPT=off)
// a net.Server listens, as before.
import { getSystemErrorMessage, getSystemErrorName } from 'node:util';
import { type AddonSupport, loadAddon } from '../lib/native-addon.ts';

/** native/tcp_listen.c. A listener is an opaque handle (an external). */
export interface TcpListenCalls {
  /** The functions every listener calls: one per accepted connection, one per accept error. */
  setup(
    onAccept: (this: object, owner: object, fd: number, address: string, port: number) => void,
    onError: (this: object, owner: object, errno: number) => void,
  ): number;
  /** Binds and listens as server.listen() would; the listener, or -errno. */
  listen(
    owner: object,
    host: string,
    port: number,
    backlog: number,
    ipv6Only: number,
    reusePort: number,
  ): object | number;
  /** The port a listener is bound to, or -errno. */
  port(listener: object): number;
  /** Stops accepting and closes the listening socket now; 0 or -EBADF. */
  close(listener: object): number;
  /** The address and port an accepted connection arrived at. */
  localName(fd: number): [string, number] | undefined;
  /** Closes an accepted connection that was turned away (with RST when reset is 1). */
  closeFd(fd: number, reset: number): number;
}

export type TcpAcceptSupport = AddonSupport<TcpListenCalls>;

/** Loads the addon once per process; the error says why it is not there. */
export function loadTcpAccept(env: NodeJS.ProcessEnv = process.env): TcpAcceptSupport {
  return loadAddon<TcpListenCalls>(
    'tcp_listen',
    'KUP_TCP_ACCEPT',
    ['setup', 'listen', 'port', 'close', 'localName', 'closeFd'],
    env,
  );
}

let processSupport: TcpAcceptSupport | undefined;
/** The process's addon (loaded on first use). */
export function processTcpAcceptSupport(): TcpAcceptSupport {
  processSupport ??= loadTcpAccept();
  return processSupport;
}

/** What a native listener tells its owner. */
export interface AcceptOwner {
  /** A connection: its descriptor is the owner's from now on. */
  accepted(fd: number, address: string, port: number): void;
  /** accept() failed (EMFILE: what waited was shed). */
  acceptFailed(err: NodeJS.ErrnoException): void;
}

/** The error a failed system call stands for, as Node's own (code, errno, syscall). */
export function systemError(
  errno: number,
  syscall: string,
  host?: string,
  port?: number,
): NodeJS.ErrnoException {
  const code = getSystemErrorName(errno);
  const where = host === undefined ? '' : ` ${host}:${port}`;
  const err: NodeJS.ErrnoException & { address?: string; port?: number } = new Error(
    `${syscall} ${code}: ${getSystemErrorMessage(errno)}${where}`,
  );
  err.code = code;
  err.errno = errno;
  err.syscall = syscall;
  if (host !== undefined) {
    err.address = host;
    err.port = port;
  }
  return err;
}

function onAccept(owner: object, fd: number, address: string, port: number): void {
  (owner as AcceptOwner).accepted(fd, address, port);
}

function onError(owner: object, errno: number): void {
  (owner as AcceptOwner).acceptFailed(systemError(errno, 'accept'));
}

/** The addon with its callbacks registered; shared by every listener of the process. */
export class TcpAccept {
  readonly calls: TcpListenCalls;

  constructor(calls: TcpListenCalls) {
    this.calls = calls;
    calls.setup(onAccept, onError);
  }
}

let processAccept: TcpAccept | null | undefined;
/** The process's native listening, or null without the addon. */
export function processTcpAccept(): TcpAccept | null {
  if (processAccept === undefined) {
    const support = processTcpAcceptSupport();
    processAccept = support.calls === undefined ? null : new TcpAccept(support.calls);
  }
  return processAccept;
}
