// The pass count of traffic that comes back from our own upstream sockets.
import assert from 'node:assert/strict';
import net from 'node:net';
import { test } from 'node:test';
import { OwnTraffic } from '../../../src/relay/own-traffic.ts';

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

test('UDP: a client on a registered port and address is one pass further; others are strangers', () => {
  const own = new OwnTraffic();
  const first = { passes: 0 };
  const second = { passes: 1 };
  own.udpOpened(first, '127.0.0.1', 41000);
  assert.equal(own.udpPasses('127.0.0.1', 41000), 1);
  assert.equal(own.udpPasses('127.0.0.2', 41000), 0, 'another address with the same port');
  assert.equal(own.udpPasses('127.0.0.1', 41001), 0);
  // Two of our sockets on one port: the later wins, and the earlier one's close does not remove it.
  own.udpOpened(second, '127.0.0.1', 41000);
  own.udpClosed(first, 41000);
  assert.equal(own.udpPasses('127.0.0.1', 41000), 2);
  own.udpClosed(second, 41000);
  assert.equal(own.udpPasses('127.0.0.1', 41000), 0);
  assert.equal(own.udpSize, 0);
});

test('TCP: an upstream socket is registered by its local address and port once connect(2) ran', async (t) => {
  const server = net.createServer((s) => s.destroy());
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.after(() => server.close());
  const own = new OwnTraffic();
  const owner = { passes: 2 };
  const socket = net.connect({ host: '127.0.0.1', port: (server.address() as net.AddressInfo).port });
  socket.on('error', () => {});
  t.after(() => socket.destroy());
  await new Promise((r) => process.nextTick(r));
  const port = own.tcpOpened(owner, socket);
  assert.ok(port > 0, 'the local port is bound right after the connect tick');
  assert.equal(own.tcpPasses('127.0.0.1', port), 3);
  own.tcpClosed({ passes: 0 }, port);
  assert.equal(own.tcpPasses('127.0.0.1', port), 3, 'only its owner removes it');
  own.tcpClosed(owner, port);
  assert.equal(own.tcpSize, 0);
});
