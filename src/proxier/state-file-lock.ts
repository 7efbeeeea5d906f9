// One proxy per state file. Two proxies on one file (a second DaemonSet, a manual run beside the pod)
// would split the proxy ports between them and overwrite each other's file; the second one refuses to
// start instead, naming the first.
//
// The lock is a Unix socket beside the file (`state.json.lock`): only who may write the state directory
// can take it (an abstract socket could be bound first by any process of the network namespace), a
// holder that died leaves a socket nobody answers on, which the next start removes, and the holder
// answers each connection with its pid and host name (then closes it: an asker cannot hold our
// descriptors). A path too long for a socket address falls back to an abstract socket named after it.
import { createHash } from 'node:crypto';
import { lstat, unlink } from 'node:fs/promises';
import net from 'node:net';
import { hostname } from 'node:os';
import { resolve } from 'node:path';
import { ProxyError } from '../lib/errors.ts';

/** A held state file: released by `release()` or by the process's end, whichever comes first. */
export type StateFileLock = { readonly address: string; release(): Promise<void> };

/** sun_path holds 108 bytes, its terminating NUL included. */
const MAX_SOCKET_PATH = 107;

/** Where the lock of the state file at `path` lives: a socket path, or an abstract name (leading NUL). */
export function lockAddress(path: string): string {
  const socketPath = `${resolve(path)}.lock`;
  if (Buffer.byteLength(socketPath) <= MAX_SOCKET_PATH) return socketPath;
  return `\0kube-userspace-proxy/state/${createHash('sha256').update(resolve(path)).digest('hex').slice(0, 40)}`;
}

/** Takes the state file at `path` for this process, or throws KUP_ERR_STATE_FILE_LOCKED naming the holder. */
export async function lockStateFile(path: string): Promise<StateFileLock> {
  const address = lockAddress(path);
  for (let attempt = 0; ; attempt++) {
    const server = net.createServer((socket) => {
      socket.on('error', () => {});
      socket.end(`${process.pid} ${hostname()}\n`, () => socket.destroy());
    });
    server.maxConnections = 8;
    try {
      await new Promise<void>((ok, fail) => {
        server.once('error', fail);
        server.listen({ path: address }, () => {
          server.off('error', fail);
          ok();
        });
      });
      server.unref();
      // Closing unlinks the socket path (libuv).
      return { address, release: () => new Promise<void>((done) => server.close(() => done())) };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EADDRINUSE' || attempt >= 3) throw lockError(path, err);
      const holder = await askHolder(address);
      if (holder !== undefined)
        throw new ProxyError(
          'KUP_ERR_STATE_FILE_LOCKED',
          `another proxy (pid ${holder.pid} on ${holder.host}) uses the state file ${path}; stop it, or give this one its own --state-file`,
        );
      // Nobody answers: a socket left by a holder that died (or one that is exiting). Remove it and retry.
      if (!address.startsWith('\0') && (await lstat(address).catch(() => undefined))?.isSocket())
        await unlink(address).catch(() => {});
      else await new Promise((r) => setTimeout(r, 100));
    }
  }
}

function lockError(path: string, err: unknown): ProxyError {
  return new ProxyError(
    'KUP_ERR_STATE_FILE_LOCKED',
    `cannot lock the state file ${path}: ${(err as Error).message}`,
    { cause: err },
  );
}

/** What the holder of `address` answers; undefined when nobody answers within a second. */
function askHolder(address: string): Promise<{ pid: string; host: string } | undefined> {
  return new Promise((done) => {
    const socket = net.connect({ path: address });
    let text = '';
    socket.setEncoding('utf8');
    socket.setTimeout(1000, () => socket.destroy());
    socket.on('data', (chunk) => {
      if (text.length < 512) text += chunk;
    });
    socket.on('close', () => {
      const m = /^(\d+) (\S{1,253})\n$/.exec(text);
      done(m === null ? undefined : { pid: m[1]!, host: m[2]! });
    });
    socket.on('error', () => {});
  });
}
