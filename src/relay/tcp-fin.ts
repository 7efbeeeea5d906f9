// The endpoint's FIN in the same segment as its last bytes. An endpoint that answers and closes (HTTP
// `Connection: close`, HTTP/1.0, most request-response protocols) usually has its FIN queued right behind
// its last bytes. Node reads that EOF a loop turn after the data, and end() runs shutdown(2) only after
// the next poll batch, so the client gets the data alone, reads it and closes first: the client pod holds
// the TIME_WAIT and, past a few hundred short connections a second to one Service, runs out of ports
// (issue 14; docs/performance-findings.md). HAProxy passes data and FIN on as one segment.
//
// JavaScript has no peek, no TCP_CORK and no synchronous shutdown: native/tcp_fin.c (built by
// `npm run build` into build/native/tcp_fin.node) has those three calls. Without it the relay works as
// before, its FIN later. KUP_TCP_FIN=off turns it off (the benchmark compares both).
import type net from 'node:net';
import { type AddonSupport, loadAddon } from '../lib/native-addon.ts';

/** native/tcp_fin.c: each takes a descriptor libuv owns and returns 0 / 1, or -errno. */
export interface TcpFinCalls {
  /** 1 when the next read returns end of stream (the peer's FIN is queued and no byte before it). */
  peekEnd(fd: number): number;
  /** shutdown(SHUT_WR) now. */
  shutdownWrite(fd: number): number;
  /** TCP_CORK on or off. */
  setCork(fd: number, on: number): number;
}

export type TcpFinSupport = AddonSupport<TcpFinCalls>;

/** A read that filled Node's whole buffer (64 KiB): more is waiting, so no FIN can be next. */
const FULL_READ = 65_536;

/** Loads the addon once per process; the error says why it is not there. */
export function loadTcpFin(env: NodeJS.ProcessEnv = process.env): TcpFinSupport {
  return loadAddon<TcpFinCalls>('tcp_fin', 'KUP_TCP_FIN', ['peekEnd', 'shutdownWrite', 'setCork'], env);
}

let processSupport: TcpFinSupport | undefined;
/** The process's addon (loaded on first use). */
export function processTcpFin(): TcpFinSupport {
  processSupport ??= loadTcpFin();
  return processSupport;
}

/** A socket's descriptor, or -1 (not open, or not a libuv TCP handle). */
export function socketFd(socket: net.Socket): number {
  const handle = (socket as net.Socket & { _handle?: { fd?: number } | null })._handle;
  const fd = handle?.fd;
  return typeof fd === 'number' && fd >= 0 ? fd : -1;
}

/**
 * What follows `chunk`, just emitted by `from`: 1 when it is the last thing before the peer's FIN (nothing
 * is left in Node's buffer behind it: a socket paused by backpressure goes on reading into that buffer,
 * the EOF included, and emits the chunks one by one when resumed; and the kernel holds the FIN next: a
 * read that did not fill the buffer drained the socket), 0 when not or unknown, -errno when a reset (or
 * an error) is next: the peek took it from the socket, as a read does, so Node will never see it and the
 * caller must act on it. Descriptors are read at each use, never kept: a destroyed socket's number may
 * already belong to another connection.
 */
export function endFollows(calls: TcpFinCalls, from: net.Socket, chunk: Buffer): number {
  if (chunk.length >= FULL_READ || from.readableLength !== 0) return 0;
  const fd = socketFd(from);
  return fd >= 0 ? calls.peekEnd(fd) : 0;
}

/**
 * Writes `chunk` and the FIN after it on `to`, in one segment when nothing of ours waits in Node or libuv
 * (cork, write, shutdown); otherwise end() after it, so the FIN follows the queue. Node's own
 * end() comes later, when the EOF is read: a second shutdown of a socket is a no-op. Returns write()'s
 * answer.
 */
export function writeWithFin(calls: TcpFinCalls, to: net.Socket, chunk: Buffer): boolean {
  const fd = to.writableLength === 0 ? socketFd(to) : -1;
  if (fd < 0) {
    const flowing = to.write(chunk);
    to.end();
    return flowing;
  }
  calls.setCork(fd, 1);
  const flowing = to.write(chunk);
  // A write the kernel took whole completes synchronously: Node's count is back to 0. The FIN pushes
  // out what the cork holds, with it: no uncork after it.
  if (to.writableLength === 0) calls.shutdownWrite(fd);
  else {
    to.end();
    calls.setCork(fd, 0);
  }
  return flowing;
}

/** Sends FIN on `to` now when nothing of ours waits to be written (libuv would wait for the poll batch). */
export function finNow(calls: TcpFinCalls, to: net.Socket): void {
  if (to.writableLength !== 0) return;
  const fd = socketFd(to);
  if (fd >= 0) calls.shutdownWrite(fd);
}
