// The tcp_fin addon's loader and calls, on real loopback sockets (src/relay/tcp-fin.ts).
import assert from 'node:assert/strict';
import net from 'node:net';
import { test } from 'node:test';
import {
  endFollows,
  loadTcpFin,
  processTcpFin,
  socketFd,
  type TcpFinCalls,
} from '../../../src/relay/tcp-fin.ts';

function addon(): TcpFinCalls {
  const support = processTcpFin();
  assert.ok(support.calls, `build/native/tcp_fin.node: ${support.error}`);
  return support.calls;
}

/** A connected pair on loopback: [the server's side, accepted paused (it reads nothing until resumed), client]. */
async function pair(t: { after(fn: () => unknown): void }): Promise<[net.Socket, net.Socket]> {
  const server = net.createServer({ allowHalfOpen: true, pauseOnConnect: true });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const accepted = new Promise<net.Socket>((r) => server.once('connection', r));
  const client = net.connect({
    host: '127.0.0.1',
    port: (server.address() as net.AddressInfo).port,
    allowHalfOpen: true,
  });
  const peer = await accepted;
  await new Promise((r) => (client.connecting ? client.once('connect', r) : r(undefined)));
  t.after(() => {
    client.destroy();
    peer.destroy();
    server.close();
  });
  return [peer, client];
}

/** Calls that say the FIN is next every time, and count the peeks. */
function countingCalls(): TcpFinCalls & { peeks: number } {
  const calls = {
    peeks: 0,
    peekEnd: () => {
      calls.peeks++;
      return 1;
    },
    shutdownWrite: () => 0,
    setCork: () => 0,
  };
  return calls;
}

test('KUP_TCP_FIN=off turns the addon off, with the reason', () => {
  const off = loadTcpFin({ KUP_TCP_FIN: 'off' });
  assert.equal(off.calls, undefined);
  assert.match(off.error!, /KUP_TCP_FIN=off/);
});

test('peekEnd tells a queued FIN from queued bytes and from nothing, and never consumes', async (t) => {
  const calls = addon();
  // `reader` is not read by Node (paused at accept): what the kernel holds for it stays there.
  const [reader, peer] = await pair(t);
  const fd = socketFd(reader);
  assert.ok(fd >= 0);
  assert.equal(calls.peekEnd(fd), 0, 'nothing came yet');
  peer.write('bytes');
  await new Promise((r) => setTimeout(r, 20));
  // Bytes first: the FIN is not next even once it comes.
  peer.end();
  await new Promise((r) => setTimeout(r, 20));
  assert.equal(calls.peekEnd(fd), 0);
  let got = '';
  reader.on('data', (d: Buffer) => {
    got += d.toString();
  });
  const ended = new Promise((r) => reader.once('end', r));
  reader.resume();
  await ended;
  assert.equal(got, 'bytes', 'the peek took nothing');
  assert.equal(calls.peekEnd(socketFd(reader)), 1, 'only the FIN is left');
});

test('endFollows: a full read never peeks; a destroyed socket has no descriptor', async (t) => {
  const counting = countingCalls();
  const [client] = await pair(t);
  assert.equal(endFollows(counting, client, Buffer.alloc(65_536)), 0);
  assert.equal(counting.peeks, 0);
  assert.equal(endFollows(counting, client, Buffer.alloc(10)), 1);
  client.destroy();
  assert.equal(socketFd(client), -1);
  assert.equal(endFollows(counting, client, Buffer.alloc(10)), 0);
  assert.equal(counting.peeks, 1);
});

test('the calls answer -errno on a descriptor that is not a socket, and do not throw', () => {
  const calls = addon();
  assert.ok(calls.peekEnd(0) < 0 || calls.peekEnd(0) === 0);
  assert.ok(calls.shutdownWrite(1_000_000) < 0);
  assert.ok(calls.setCork(1_000_000, 1) < 0);
});

test('endFollows: never while Node still holds bytes of that socket behind the chunk (paused by backpressure)', async (t) => {
  const counting = countingCalls();
  const [reader, peer] = await pair(t);
  // A paused socket that Node reads anyway (as the relay's endpoint socket while the client does not
  // read): its buffer holds the rest of the answer, and the EOF, while the kernel holds only the FIN.
  reader.pause();
  peer.end('the rest of the answer');
  reader.resume();
  reader.pause();
  for (let i = 0; i < 100 && reader.readableLength === 0; i++) await new Promise((r) => setTimeout(r, 5));
  assert.ok(reader.readableLength > 0, 'bytes wait in Node');
  assert.equal(endFollows(counting, reader, Buffer.from('a chunk before them')), 0);
  assert.equal(counting.peeks, 0, 'not even asked: the kernel would say the FIN is next');
});
