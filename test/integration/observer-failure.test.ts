// An observer that throws costs only its own tracing: on a real TcpListener and UdpListener, a throw from
// opened, from a data callback or from closed leaves the connection relaying both ways and closing
// normally, never reaches the process, is logged once, and turns tracing off for that service port.
import assert from 'node:assert/strict';
import dgram from 'node:dgram';
import net from 'node:net';
import { Writable } from 'node:stream';
import { test } from 'node:test';
import { createLogger } from '../../src/lib/log.ts';
import type { ConnectionObserver } from '../../src/relay/observer.ts';
import { noopObserver } from '../../src/relay/observer.ts';
import type { ObserverCallback } from '../../src/relay/observer-failure.ts';
import { Sweeper } from '../../src/relay/sweeper.ts';
import { DEFAULT_TCP_OPTIONS, TcpListener } from '../../src/relay/tcp.ts';
import { DEFAULT_UDP_OPTIONS, UdpListener } from '../../src/relay/udp.ts';
import { ep } from '../helpers/endpoints.ts';
import { makeContext } from '../helpers/relay.ts';
import { echoServer, udpServer, waitFor } from '../helpers/servers.ts';

const FAILED = 'Connection observer failed, tracing off for the service port';

/** An observer that throws from `where`, every time, and counts what reached it. */
function throwingObserver(where: ObserverCallback) {
  const calls = { opened: 0, clientData: 0, endpointData: 0, closed: 0 };
  const call = (name: ObserverCallback): true => {
    calls[name]++;
    if (name === where) throw new Error(`boom in ${name}`);
    return true;
  };
  const observer: ConnectionObserver = {
    opened: () => {
      call('opened');
    },
    clientData: () => call('clientData'),
    endpointData: () => call('endpointData'),
    closed: () => {
      call('closed');
    },
    wantsData: true,
  };
  return { observer, calls };
}

function capturingLog() {
  const lines: { msg: string; callback?: string; err?: { message: string } }[] = [];
  const destination = new Writable({
    write(chunk, _enc, done) {
      lines.push(JSON.parse(String(chunk)));
      done();
    },
  });
  return { log: createLogger({ destination }), failures: () => lines.filter((l) => l.msg === FAILED) };
}

const CALLBACKS: ObserverCallback[] = ['opened', 'clientData', 'endpointData', 'closed'];

for (const where of CALLBACKS) {
  test(`TCP: an observer throwing in ${where} costs only its tracing`, async (t) => {
    const server = await echoServer('127.0.0.11');
    t.after(() => server.close());
    const context = makeContext([ep(server.host, server.port)]);
    const { observer, calls } = throwingObserver(where);
    context.observer = observer;
    const { log, failures } = capturingLog();
    const listener = new TcpListener(context, DEFAULT_TCP_OPTIONS, { log });
    await listener.listen('127.0.0.1', 0);
    t.after(() => listener.destroy());

    for (let i = 0; i < 2; i++) {
      const client = net.connect({ host: '127.0.0.1', port: listener.port });
      t.after(() => client.destroy());
      let received = '';
      client.on('data', (d) => {
        received += d;
      });
      const closed = new Promise<boolean>((r) => client.once('close', r));
      client.write('ping');
      await waitFor(() => received === 'ping', 2000, 'the echo');
      client.end();
      assert.equal(await closed, false, 'closed without error');
      await waitFor(() => context.stats.active === 0, 2000, 'the connection to finish');
    }
    assert.equal(calls[where], 1, `${where} reached once, on the first connection only`);
    assert.equal(context.observer, noopObserver, 'tracing off for the service port');
    assert.equal(context.stats.connectFailed, 0);
    assert.equal(context.stats.accepted, 2);
    await waitFor(() => failures().length > 0, 2000, 'the log line');
    assert.equal(failures().length, 1, 'logged once');
    assert.equal(failures()[0]!.callback, where);
    assert.equal(failures()[0]!.err?.message, `boom in ${where}`);
    if (where === 'clientData' || where === 'endpointData')
      assert.equal(calls.closed, 1, 'still told of the close');
  });

  test(`UDP: an observer throwing in ${where} costs only its tracing`, async (t) => {
    const server = await udpServer('127.0.0.11');
    t.after(() => server.close());
    const context = makeContext([ep(server.host, server.port)], 'UDP', 'default/dns:dns');
    const { observer, calls } = throwingObserver(where);
    context.observer = observer;
    const { log, failures } = capturingLog();
    const sweeper = new Sweeper(10);
    t.after(() => sweeper.stop());
    const listener = new UdpListener(
      context,
      { ...DEFAULT_UDP_OPTIONS, idleTimeoutMs: 50 },
      { log, sweeper },
      'udp4',
    );
    await listener.listen('127.0.0.1', 0);
    t.after(() => listener.close());

    for (let i = 0; i < 2; i++) {
      const socket = dgram.createSocket('udp4');
      t.after(() => socket.close());
      for (const msg of ['ping', 'pong']) {
        const reply = await new Promise<Buffer>((resolve) => {
          socket.once('message', resolve);
          socket.send(msg, listener.port, '127.0.0.1');
        });
        assert.equal(reply.toString(), msg);
      }
      await waitFor(() => context.stats.active === 0, 2000, 'the session to idle out');
    }
    assert.equal(calls[where], 1, `${where} reached once, on the first session only`);
    assert.equal(context.observer, noopObserver, 'tracing off for the service port');
    assert.equal(context.stats.accepted, 2);
    assert.equal(failures().length, 1, 'logged once');
    assert.equal(failures()[0]!.callback, where);
    if (where === 'clientData' || where === 'endpointData')
      assert.equal(calls.closed, 1, 'still told of the close');
  });
}
