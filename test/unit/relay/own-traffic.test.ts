// The pass count of traffic that comes back from our own upstream sockets.
import assert from 'node:assert/strict';
import net from 'node:net';
import { test } from 'node:test';
import { OwnTraffic } from '../../../src/relay/own-traffic.ts';
import { promotedPerItem } from '../../helpers/heap.ts';

test('isLocal: loopback always, the host addresses once told', () => {
  const own = new OwnTraffic();
  assert.ok(own.isLocal('127.0.0.1'));
  assert.ok(own.isLocal('127.9.9.9'));
  assert.ok(own.isLocal('::1'));
  assert.ok(!own.isLocal('192.168.1.10'));
  own.setLocalAddresses(new Set(['192.168.1.10']));
  assert.ok(own.isLocal('192.168.1.10'));
  assert.ok(!own.isLocal('10.244.1.5'));
});

test('UDP: a client on a registered address and port that went to our port is one pass further', () => {
  const own = new OwnTraffic();
  const first = { passes: 0 };
  const second = { passes: 1 };
  const other = { passes: 0 };
  const key = own.udpOpened(first, '127.0.0.1', 41000, '127.0.0.1', 5353);
  assert.equal(own.udpPasses('127.0.0.1', 41000, 5353), 1);
  assert.equal(own.udpPasses('127.0.0.2', 41000, 5353), 0, 'another address with the same port');
  assert.equal(own.udpPasses('127.0.0.1', 41001, 5353), 0);
  assert.equal(own.udpPasses('127.0.0.1', 41000, 5354), 0, 'our socket went to another port: a stranger');
  // The same port on another address is another socket: both stay registered.
  const otherKey = own.udpOpened(other, '127.0.0.2', 41000, '127.0.0.1', 5353);
  assert.equal(own.udpPasses('127.0.0.1', 41000, 5353), 1);
  assert.equal(own.udpPasses('127.0.0.2', 41000, 5353), 1);
  // Two of our sockets on one address and port: the later wins, and the earlier one's close does not remove it.
  const secondKey = own.udpOpened(second, '127.0.0.1', 41000, '127.0.0.1', 5353);
  own.udpClosed(first, key);
  assert.equal(own.udpPasses('127.0.0.1', 41000, 5353), 2);
  own.udpClosed(second, secondKey);
  own.udpClosed(other, otherKey);
  assert.equal(own.udpPasses('127.0.0.1', 41000, 5353), 0);
  assert.equal(own.udpSize, 0);
  // A socket of ours to a remote endpoint: a datagram from its address and port is a stranger's.
  own.udpOpened(first, '127.0.0.1', 41000, '10.244.1.5', 5353);
  assert.equal(own.udpPasses('127.0.0.1', 41000, 5353), 0);
});

test('TCP: an upstream socket is registered by its local address and port once connect(2) ran', async (t) => {
  const server = net.createServer((s) => s.destroy());
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.after(() => server.close());
  const serverPort = (server.address() as net.AddressInfo).port;
  const own = new OwnTraffic();
  const owner = { passes: 2 };
  const socket = net.connect({ host: '127.0.0.1', port: serverPort });
  socket.on('error', () => {});
  t.after(() => socket.destroy());
  await new Promise((r) => process.nextTick(r));
  const key = own.tcpOpened(owner, socket, '127.0.0.1', serverPort);
  const port = socket.localPort!;
  assert.ok(port > 0, 'the local port is bound right after the connect tick');
  assert.equal(key, `127.0.0.1|${port}`);
  assert.equal(own.tcpPasses('127.0.0.1', port, '127.0.0.1', serverPort), 3, 'it came back to where it went');
  assert.equal(
    own.tcpPasses('127.0.0.2', port, '127.0.0.1', serverPort),
    0,
    'the same port on another address',
  );
  // A stranger that Linux gave the same source port, connecting to another of our listeners: not a loop.
  assert.equal(own.tcpPasses('127.0.0.1', port, '127.0.0.1', serverPort + 1), 0);
  assert.equal(own.tcpPasses('127.0.0.1', port, '127.0.0.2', serverPort), 0);
  own.tcpClosed({ passes: 0 }, key);
  assert.equal(own.tcpPasses('127.0.0.1', port, '127.0.0.1', serverPort), 3, 'only its owner removes it');
  own.tcpClosed(owner, key);
  assert.equal(own.tcpSize, 0);
});

test('a closed upstream socket lets go of its owner: a connection that ended is not kept alive through a scavenge', (t) => {
  const own = new OwnTraffic();
  // An owner as heavy as a connection with what it holds.
  const make = (n: number) => ({ passes: 0, n, held: `${n}`.padEnd(2000, '.'), key: '' });
  const tcp = promotedPerItem(
    make,
    (o) => {
      o.key = own.tcpOpenedAt(o, '127.0.0.1', 10_000 + (o.n % 50_000), '127.0.0.1', 80);
    },
    (o) => own.tcpClosed(o, o.key),
  );
  const udp = promotedPerItem(
    make,
    (o) => {
      o.key = own.udpOpened(o, '127.0.0.1', 10_000 + (o.n % 50_000), '127.0.0.1', 53);
    },
    (o) => own.udpClosed(o, o.key),
  );
  t.diagnostic(
    `promoted per closed socket (owners of ~2 KB): TCP ${tcp.toFixed(0)} B, UDP ${udp.toFixed(0)} B`,
  );
  assert.ok(tcp < 500, `TCP: ${tcp.toFixed(0)} bytes promoted per closed socket`);
  assert.ok(udp < 500, `UDP: ${udp.toFixed(0)} bytes promoted per closed socket`);
  assert.equal(own.tcpSize + own.udpSize, 64, 'the 32 still open of each');
});
