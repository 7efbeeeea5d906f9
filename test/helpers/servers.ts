// Small loopback servers for relay tests. Every server is closed by the returned close().
import dgram from 'node:dgram';
import net from 'node:net';

export type TestServer = { host: string; port: number; connections: number; close(): Promise<void> };

/** A TCP server on `host` that runs `handler` for each connection. */
export async function tcpServer(
  host: string,
  handler: (socket: net.Socket) => void,
  options: net.ServerOpts = {},
): Promise<TestServer> {
  const sockets = new Set<net.Socket>();
  const result: TestServer = {
    host,
    port: 0,
    connections: 0,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
  const server = net.createServer(options, (socket) => {
    result.connections++;
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('error', () => {});
    handler(socket);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen({ host, port: 0 }, () => resolve());
  });
  result.port = (server.address() as net.AddressInfo).port;
  return result;
}

/** Answers every connection with its own name and closes. */
export function identityServer(host: string, name = host): Promise<TestServer> {
  return tcpServer(host, (socket) => socket.end(name));
}

/** Echoes everything back; ends when the client ends. */
export function echoServer(host: string): Promise<TestServer> {
  return tcpServer(host, (socket) => socket.pipe(socket), { allowHalfOpen: true });
}

/** A UDP server that answers each datagram with `reply(msg)` (default: echo). */
export async function udpServer(
  host: string,
  reply: (msg: Buffer, rinfo: dgram.RemoteInfo) => Buffer | string | null = (msg) => msg,
): Promise<{ host: string; port: number; received: number; close(): Promise<void> }> {
  const socket = dgram.createSocket(host.includes(':') ? 'udp6' : 'udp4');
  const result = {
    host,
    port: 0,
    received: 0,
    close: () => new Promise<void>((resolve) => socket.close(() => resolve())),
  };
  socket.on('message', (msg, rinfo) => {
    result.received++;
    const out = reply(msg, rinfo);
    if (out !== null) socket.send(out, rinfo.port, rinfo.address);
  });
  await new Promise<void>((resolve) => socket.bind(0, host, resolve));
  result.port = socket.address().port;
  return result;
}

/** Connects from `localAddress` (a distinct 127.0.0.x per simulated client), sends `send`, ends, and
 * resolves with everything received. */
export function request(
  port: number,
  options: { host?: string; localAddress?: string; send?: string | Buffer; timeoutMs?: number } = {},
): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = net.connect({
      host: options.host ?? '127.0.0.1',
      port,
      localAddress: options.localAddress,
    });
    const chunks: Buffer[] = [];
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error(`request to ${port} timed out`));
    }, options.timeoutMs ?? 5000);
    socket.on('data', (c) => chunks.push(c));
    socket.on('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
    socket.on('close', () => {
      clearTimeout(timer);
      resolve(Buffer.concat(chunks).toString());
    });
    socket.end(options.send ?? '');
  });
}

/** Connects, sends `text` and ends; resolves with what came back before the close, or `error CODE`. */
export function exchange(port: number, text: string): Promise<string> {
  return new Promise((resolve) => {
    const c = net.connect({ host: '127.0.0.1', port });
    const got: Buffer[] = [];
    c.on('connect', () => c.end(text));
    c.on('data', (d) => got.push(d));
    c.on('error', (err: NodeJS.ErrnoException) => resolve(`error ${err.code}`));
    c.on('close', () => resolve(Buffer.concat(got).toString()));
  });
}

/** Sends one datagram from a fresh socket bound to `localAddress` and waits for one reply. */
export function udpRequest(
  port: number,
  payload: Buffer | string,
  options: { host?: string; localAddress?: string; localPort?: number; timeoutMs?: number } = {},
): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const socket = dgram.createSocket('udp4');
    const timer = setTimeout(() => {
      socket.close();
      reject(new Error('udp request timed out'));
    }, options.timeoutMs ?? 2000);
    socket.on('message', (msg) => {
      clearTimeout(timer);
      socket.close();
      resolve(msg);
    });
    socket.bind(options.localPort ?? 0, options.localAddress ?? '127.0.0.1', () => {
      socket.send(payload, port, options.host ?? '127.0.0.1');
    });
  });
}

/** Waits until `check()` is true, polling every 10 ms, or throws after `timeoutMs`. */
export async function waitFor(
  check: () => boolean | Promise<boolean>,
  timeoutMs = 5000,
  what = 'condition',
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}
