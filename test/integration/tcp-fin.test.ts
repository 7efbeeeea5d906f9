// The endpoint's FIN goes to the client with its last bytes (src/relay/tcp-fin.ts). An endpoint that
// answers and closes (HTTP `Connection: close`) has its FIN queued behind its answer; without the addon
// the relay passed the answer on alone and its FIN a loop turn or two later, so a client that closes as
// soon as it has the answer (wrk, curl, any HTTP/1.0 client) closed first and kept the TIME_WAIT: under
// churn the client pod runs out of ports. Measured here as the kernel sees it: the client's sockets left
// in TIME_WAIT (/proc/net/tcp), with the addon and without it, in the same run.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import net from 'node:net';
import { test } from 'node:test';
import { DEFAULT_TCP_OPTIONS, TcpListener } from '../../src/relay/tcp.ts';
import { processTcpFin, socketFd, type TcpFinCalls } from '../../src/relay/tcp-fin.ts';
import { ep } from '../helpers/endpoints.ts';
import { log, makeContext } from '../helpers/relay.ts';
import { tcpServer } from '../helpers/servers.ts';

type After = { after(fn: () => unknown): void };

const ANSWER = 'HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok';
const CONNECTIONS = 200;

/** Built by `npm run build` (scripts/build-native.ts); CI builds it before the tests. */
function addon(): TcpFinCalls {
  const support = processTcpFin();
  assert.ok(support.calls, `build/native/tcp_fin.node: ${support.error}`);
  return support.calls;
}

/** An endpoint that answers the first bytes it gets and closes: its FIN right behind the answer. */
async function closingEndpoint(t: After, host: string) {
  const pod = await tcpServer(host, (s) => s.once('data', () => s.end(ANSWER)));
  t.after(() => pod.close());
  return pod;
}

/** `tcpFin` null: neither addon (the native relay of tcp-offload.ts sends its FIN with the data too). */
async function relay(t: After, podHost: string, podPort: number, tcpFin: TcpFinCalls | null) {
  const deps = tcpFin === null ? { log, tcpFin, tcpOffload: null } : { log, tcpFin };
  const listener = new TcpListener(makeContext([ep(podHost, podPort)]), DEFAULT_TCP_OPTIONS, deps);
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.destroy());
  return listener;
}

/** Sockets in TIME_WAIT from `local` (its address in /proc/net/tcp's hex, little-endian) to port `to`. */
function timeWaits(localHex: string, to: number): number {
  const toHex = `:${to.toString(16).toUpperCase().padStart(4, '0')}`;
  let n = 0;
  for (const line of readFileSync('/proc/net/tcp', 'utf8').split('\n').slice(1)) {
    const [, local, remote, st] = line.trim().split(/\s+/);
    if (st === '06' && local?.startsWith(`${localHex}:`) && remote?.endsWith(toHex)) n++;
  }
  return n;
}

/**
 * Sequential connections from `clientHost`, each closing as soon as the whole answer is in (as wrk does):
 * how many found the FIN already queued behind the answer, and how many left a TIME_WAIT.
 */
async function churn(clientHost: string, clientHex: string, port: number, calls: TcpFinCalls) {
  const before = timeWaits(clientHex, port);
  let finWithAnswer = 0;
  for (let i = 0; i < CONNECTIONS; i++) {
    finWithAnswer += await new Promise<number>((resolve, reject) => {
      const client = net.connect({ host: '127.0.0.1', port, localAddress: clientHost });
      let got = '';
      client.setTimeout(5000, () => client.destroy(new Error('no answer within 5 s')));
      client.on('error', reject);
      client.on('connect', () => client.write('GET / HTTP/1.1\r\nHost: x\r\n\r\n'));
      client.on('data', (chunk: Buffer) => {
        got += chunk.toString();
        if (got.length < ANSWER.length) return;
        const fin = calls.peekEnd(socketFd(client)) === 1 ? 1 : 0;
        client.destroy();
        resolve(fin);
      });
    });
  }
  return { finWithAnswer, timeWaits: timeWaits(clientHex, port) - before };
}

test("the endpoint's FIN reaches the client with its answer, so the client does not close first", async (t) => {
  const calls = addon();
  const pod = await closingEndpoint(t, '127.0.0.12');
  const withFin = await relay(t, pod.host, pod.port, calls);
  const without = await relay(t, pod.host, pod.port, null);

  // 127.0.0.31 and .32: each run's client address, so the TIME_WAITs are told apart.
  const on = await churn('127.0.0.31', '1F00007F', withFin.port, calls);
  const off = await churn('127.0.0.32', '2000007F', without.port, calls);
  t.diagnostic(
    `FIN with the answer: ${on.finWithAnswer}/${CONNECTIONS} with the addon, ${off.finWithAnswer} without; ` +
      `client TIME_WAITs: ${on.timeWaits} with, ${off.timeWaits} without`,
  );
  assert.ok(
    on.finWithAnswer >= CONNECTIONS * 0.95,
    `FIN with the answer: ${on.finWithAnswer}/${CONNECTIONS}`,
  );
  assert.ok(
    on.timeWaits <= CONNECTIONS * 0.05,
    `the client closed first ${on.timeWaits}/${CONNECTIONS} times`,
  );
  // What the addon changes: the same relay without it leaves the client closing first.
  assert.ok(off.timeWaits > CONNECTIONS / 2, `without the addon: ${off.timeWaits}/${CONNECTIONS}`);
  assert.equal(withFin.context.stats.active, 0);
});

test('an answer that does not end the stream keeps the connection open both ways', async (t) => {
  const calls = addon();
  // Answers each line and stays: the peek sees no FIN, nothing is shut.
  const pod = await tcpServer('127.0.0.12', (s) => s.on('data', (d) => s.write(`echo ${d}`)));
  t.after(() => pod.close());
  const listener = await relay(t, pod.host, pod.port, calls);
  const client = net.connect({ host: '127.0.0.1', port: listener.port });
  t.after(() => client.destroy());
  let got = '';
  client.on('data', (d: Buffer) => {
    got += d.toString();
  });
  for (const word of ['one', 'two', 'three']) {
    const want = got.length + `echo ${word}`.length;
    client.write(word);
    for (let i = 0; i < 200 && got.length < want; i++) await new Promise((r) => setTimeout(r, 5));
  }
  assert.equal(got, 'echo oneecho twoecho three');
  assert.equal(calls.peekEnd(socketFd(client)), 0, 'no FIN came to the client');
});

test('after the FIN with the answer the client may still send: its bytes reach the endpoint (half-close)', async (t) => {
  const calls = addon();
  let received = '';
  const gotAll = Promise.withResolvers<void>();
  // Answers and closes its side at once, then keeps reading the client's upload until its FIN.
  const pod = await tcpServer(
    '127.0.0.12',
    (s) => {
      s.once('data', () => s.end(ANSWER));
      s.on('data', (d: Buffer) => {
        received += d.toString();
      });
      s.on('end', () => gotAll.resolve());
    },
    { allowHalfOpen: true },
  );
  t.after(() => pod.close());
  const listener = await relay(t, pod.host, pod.port, calls);
  const client = net.connect({ host: '127.0.0.1', port: listener.port, allowHalfOpen: true });
  t.after(() => client.destroy());
  let answer = '';
  client.on('data', (d: Buffer) => {
    answer += d.toString();
  });
  const ended = new Promise((r) => client.once('end', r));
  client.write('first;');
  await ended;
  assert.equal(answer, ANSWER);
  client.end('after the answer;');
  await gotAll.promise;
  assert.equal(received, 'first;after the answer;');
});

test("an endpoint's reset right behind its last bytes: the bytes reach the client, then the close (endpoint-reset)", async (t) => {
  const calls = addon();
  // Answers and resets at once (SO_LINGER 0): the answer and the reset are both in the relay's socket
  // when it reads, and the peek for a FIN after the answer finds the reset instead (and takes it).
  const pod = await tcpServer('127.0.0.12', (s) =>
    s.once('data', () => {
      s.write(ANSWER);
      s.resetAndDestroy();
    }),
  );
  t.after(() => pod.close());
  const context = makeContext([ep(pod.host, pod.port)]);
  const closed: string[] = [];
  context.observer = { wantsData: false, opened() {}, closed: (c) => closed.push(c.closeReason!) };
  const listener = new TcpListener(context, DEFAULT_TCP_OPTIONS, { log, tcpFin: calls, tcpOffload: null });
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.destroy());
  // A client that keeps its side open after the endpoint's FIN: only a close by the relay ends it.
  const client = net.connect({ host: '127.0.0.1', port: listener.port, allowHalfOpen: true });
  client.on('error', () => {});
  t.after(() => client.destroy());
  let answer = '';
  client.on('data', (d: Buffer) => {
    answer += d.toString();
  });
  client.write('GET / HTTP/1.1\r\nHost: x\r\n\r\n');
  for (let i = 0; i < 200 && closed.length === 0; i++) await new Promise((r) => setTimeout(r, 5));
  assert.equal(answer, ANSWER);
  assert.deepEqual(closed, ['endpoint-reset']);
  assert.equal(listener.connections.size, 0);
});
