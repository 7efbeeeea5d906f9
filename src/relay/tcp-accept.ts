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

/**
 * native/tcp_listen.c. A listener is an id (>= 0) from listen() until close(); after it the id may be
 * another listener's.
 */
export interface TcpListenCalls {
  /** The functions every listener calls: one per accepted connection, one per accept error. */
  setup(
    onAccept: (id: number, fd: number, address: string, port: number) => void,
    onError: (id: number, errno: number) => void,
  ): number;
  /** Binds and listens as server.listen() would; the listener's id, or -errno. */
  listen(host: string, port: number, backlog: number, ipv6Only: number, reusePort: number): number;
  /** The port a listener is bound to, or -errno. */
  port(id: number): number;
  /** Stops accepting and closes the listening socket now; 0 or -EBADF. */
  close(id: number): number;
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

/**
 * The addon with its callbacks registered; shared by every listener of the process. It keeps each open
 * listener's owner by id (a slot of an array, where a Node-API reference a listener cost ~0.1 KiB).
 */
export class TcpAccept {
  readonly calls: TcpListenCalls;
  /** The owner of each open listener, by id. */
  readonly #owners: (AcceptOwner | undefined)[] = [];

  constructor(calls: TcpListenCalls) {
    this.calls = calls;
    const owners = this.#owners;
    calls.setup(
      (id, fd, address, port) => owners[id]!.accepted(fd, address, port),
      (id, errno) => owners[id]!.acceptFailed(systemError(errno, 'accept')),
    );
  }

  /** Binds and listens for `owner` as server.listen() would; the listener's id, or -errno. */
  listen(
    owner: AcceptOwner,
    host: string,
    port: number,
    backlog: number,
    ipv6Only: boolean,
    reusePort: boolean,
  ): number {
    const id = this.calls.listen(host, port, backlog, ipv6Only ? 1 : 0, reusePort ? 1 : 0);
    if (id >= 0) this.#owners[id] = owner;
    return id;
  }

  /** The port listener `id` is bound to, or -errno. */
  port(id: number): number {
    return this.calls.port(id);
  }

  /** Stops listener `id` accepting and closes its socket now; its owner hears nothing more. */
  close(id: number): void {
    if (this.calls.close(id) === 0) this.#owners[id] = undefined;
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
