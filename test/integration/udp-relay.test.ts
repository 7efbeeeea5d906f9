// The UDP relay on real loopback sockets.
import assert from 'node:assert/strict';
import dgram from 'node:dgram';
import { test } from 'node:test';
import type { UdpRelayOptions } from '../../src/relay/udp.ts';
import { DEFAULT_UDP_OPTIONS, UdpListener } from '../../src/relay/udp.ts';
import { ep } from '../helpers/endpoints.ts';
import { log, makeContext, makeDualStackContext } from '../helpers/relay.ts';
import { udpRequest, udpServer, waitFor } from '../helpers/servers.ts';

async function proxy(
  t: { after(fn: () => unknown): void },
  endpoints: ReturnType<typeof ep>[],
  options: Partial<UdpRelayOptions> = {},
) {
  const context = makeContext(endpoints, 'UDP', 'default/dns:dns');
  const listener = new UdpListener(context, { ...DEFAULT_UDP_OPTIONS, ...options }, { log }, 'udp4');
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.close());
  return { listener, context };
}

test('UDP echo through the proxy; the reply comes from the proxy port', async (t) => {
  const server = await udpServer('127.0.0.11', (msg) => Buffer.concat([Buffer.from('echo:'), msg]));
  t.after(() => server.close());
  const { listener, context } = await proxy(t, [ep(server.host, server.port)]);
  const socket = dgram.createSocket('udp4');
  t.after(() => socket.close());
  const reply = await new Promise<{ msg: Buffer; from: dgram.RemoteInfo }>((resolve) => {
    socket.once('message', (msg, from) => resolve({ msg, from }));
    socket.send('hello', listener.port, '127.0.0.1');
  });
  assert.equal(reply.msg.toString(), 'echo:hello');
  assert.equal(reply.from.port, listener.port);
  assert.equal(context.stats.accepted, 1);
});

test('round robin across endpoints per client ip:port session', async (t) => {
  const servers = await Promise.all(
    ['127.0.0.11', '127.0.0.12', '127.0.0.13'].map((h) => udpServer(h, () => Buffer.from(h))),
  );
  t.after(() => Promise.all(servers.map((s) => s.close())));
  const { listener } = await proxy(
    t,
    servers.map((s) => ep(s.host, s.port)),
  );
  const seen = new Map<string, number>();
  // Every client socket stays open until the end: a closed one's port could come back for a later
  // client, which would then be the same ip:port session (a flake seen once in CI).
  const clients: dgram.Socket[] = [];
  t.after(() => {
    for (const c of clients) c.close();
  });
  for (let i = 0; i < 30; i++) {
    const client = dgram.createSocket('udp4');
    clients.push(client);
    const who = await new Promise<string>((resolve) => {
      client.once('message', (msg) => resolve(msg.toString()));
      client.send('q', listener.port, '127.0.0.1');
    });
    seen.set(who, (seen.get(who) ?? 0) + 1);
  }
  assert.deepEqual([...seen.values()], [10, 10, 10]);
});

test('a session keeps its endpoint while traffic flows and expires after the idle timeout', async (t) => {
  const servers = await Promise.all(
    ['127.0.0.11', '127.0.0.12'].map((h) => udpServer(h, () => Buffer.from(h))),
  );
  t.after(() => Promise.all(servers.map((s) => s.close())));
  const { listener, context } = await proxy(
    t,
    servers.map((s) => ep(s.host, s.port)),
    { idleTimeoutMs: 150 },
  );
  const socket = dgram.createSocket('udp4');
  t.after(() => socket.close());
  await new Promise<void>((r) => socket.bind(0, '127.0.0.21', r));
  const ask = () =>
    new Promise<string>((resolve) => {
      socket.once('message', (m) => resolve(m.toString()));
      socket.send('q', listener.port, '127.0.0.1');
    });
  const first = await ask();
  for (let i = 0; i < 5; i++) {
    await new Promise((r) => setTimeout(r, 50));
    assert.equal(await ask(), first, 'same session, same endpoint');
  }
  assert.equal(listener.sessions.size, 1);
  await waitFor(() => listener.sessions.size === 0, 1000, 'session expiry');
  assert.equal(context.stats.active, 0);
  // A new session starts for the next datagram, at the next endpoint.
  assert.notEqual(await ask(), first);
});

test('datagrams up to 64 KiB pass unchanged both ways', async (t) => {
  const server = await udpServer('127.0.0.11');
  t.after(() => server.close());
  const { listener } = await proxy(t, [ep(server.host, server.port)]);
  for (const size of [1, 4096, 4097, 9000, 65507]) {
    const payload = Buffer.alloc(size);
    for (let i = 0; i < size; i++) payload[i] = i % 251;
    const reply = await udpRequest(listener.port, payload);
    assert.equal(reply.length, size);
    assert.ok(reply.equals(payload), `payload of ${size} bytes intact`);
  }
});

test('sessions are capped per service port; the idlest are evicted', async (t) => {
  const server = await udpServer('127.0.0.11');
  t.after(() => server.close());
  const { listener, context } = await proxy(t, [ep(server.host, server.port)], {
    maxSessions: 10,
    idleTimeoutMs: 10_000,
  });
  const sockets: dgram.Socket[] = [];
  t.after(() => {
    for (const s of sockets) s.close();
  });
  let replies = 0;
  for (let i = 0; i < 50; i++) {
    const s = dgram.createSocket('udp4');
    sockets.push(s);
    s.on('message', () => replies++);
    await new Promise<void>((r) => s.bind(0, '127.0.0.1', r));
    s.send('x', listener.port, '127.0.0.1');
    await waitFor(() => replies === i + 1, 2000, `reply ${i}`);
    assert.ok(listener.sessions.size <= 10);
  }
  assert.equal(listener.sessions.size, 10);
  assert.equal(context.stats.udpSessionsEvicted, 40);
  assert.equal(context.stats.accepted, 50);
});

test('no endpoints: datagrams are dropped and counted', async (t) => {
  const { listener, context } = await proxy(t, []);
  await assert.rejects(udpRequest(listener.port, 'q', { timeoutMs: 200 }), /timed out/);
  assert.equal(context.stats.noEndpoints, 1);
});

test('an endpoint that answers with ICMP unreachable loses the session and the client moves on', async (t) => {
  const good = await udpServer('127.0.0.12', () => Buffer.from('good'));
  const dead = await udpServer('127.0.0.11');
  const deadPort = dead.port;
  await dead.close();
  t.after(() => good.close());
  const { listener, context } = await proxy(t, [ep('127.0.0.11', deadPort), ep(good.host, good.port)], {
    idleTimeoutMs: 5000,
  });
  context.balancer.setAffinity('ClientIP', 10800);
  const socket = dgram.createSocket('udp4');
  t.after(() => socket.close());
  let got = '';
  socket.on('message', (m) => {
    got = m.toString();
  });
  await new Promise<void>((r) => socket.bind(0, '127.0.0.21', r));
  for (let i = 0; i < 20 && got !== 'good'; i++) {
    socket.send('q', listener.port, '127.0.0.1');
    await new Promise((r) => setTimeout(r, 25));
  }
  assert.equal(got, 'good');
});

test('a session whose endpoint is removed is closed by endpointsChanged; the next datagram goes to a live endpoint', async (t) => {
  const servers = await Promise.all(
    ['127.0.0.11', '127.0.0.12'].map((h) => udpServer(h, () => Buffer.from(h))),
  );
  t.after(() => Promise.all(servers.map((s) => s.close())));
  const endpoints = servers.map((s) => ep(s.host, s.port));
  // A session far longer than the test: only the hook can move the client.
  const { listener, context } = await proxy(t, endpoints, { idleTimeoutMs: 60_000 });
  const socket = dgram.createSocket('udp4');
  t.after(() => socket.close());
  const answers: string[] = [];
  socket.on('message', (m) => answers.push(m.toString()));
  await new Promise<void>((r) => socket.bind(0, '127.0.0.21', r));
  // node-local-dns style: a datagram every 20 ms.
  const timer = setInterval(() => socket.send('q', listener.port, '127.0.0.1'), 20);
  t.after(() => clearInterval(timer));
  await waitFor(() => answers.length >= 3, 2000, 'first answers');
  const first = answers.at(-1)!;
  const other = servers.find((s) => s.host !== first)!;
  // The endpoint leaves the balancer; without the hook the session stays pinned to it.
  assert.equal(context.balancer.setEndpoints(endpoints.filter((e) => e.ip !== first)), true);
  const pinnedFrom = answers.length;
  await waitFor(() => answers.length >= pinnedFrom + 5, 2000, 'answers without the hook');
  assert.ok(
    answers.slice(pinnedFrom).every((a) => a === first),
    'without the hook the session keeps its removed endpoint',
  );
  // The proxier's hook: the session is closed at once, the next datagram picks a live endpoint.
  assert.equal(listener.endpointsChanged(), 1);
  assert.equal(listener.sessions.size, 0);
  assert.equal(context.stats.udpSessionsEndpointRemoved, 1);
  const from = answers.length;
  await waitFor(() => answers.length >= from + 3, 2000, 'answers after the hook');
  // At most one reply already in flight from the removed endpoint, then only the live one.
  const after = answers.slice(from);
  assert.ok(
    after.slice(1).every((a) => a === other.host),
    `moved to ${other.host}: ${after}`,
  );
  assert.equal(context.stats.accepted, 2);
  // Nothing else changed: the hook closes nothing.
  assert.equal(listener.endpointsChanged(), 0);
});

test('endpointsChanged closes only the sessions of removed endpoints, with the endpoint-removed reason', async (t) => {
  const servers = await Promise.all(
    ['127.0.0.11', '127.0.0.12'].map((h) => udpServer(h, () => Buffer.from(h))),
  );
  t.after(() => Promise.all(servers.map((s) => s.close())));
  const endpoints = servers.map((s) => ep(s.host, s.port));
  const { listener, context } = await proxy(t, endpoints, { idleTimeoutMs: 60_000 });
  const closed: string[] = [];
  context.observer = {
    opened() {},
    closed: (c) => closed.push(`${c.endpoint?.ip} ${c.closeReason}`),
    wantsData: false,
  };
  // Four clients, spread two per endpoint by round robin.
  const got = await Promise.all(
    ['127.0.0.21', '127.0.0.22', '127.0.0.23', '127.0.0.24'].map(async (c) =>
      (await udpRequest(listener.port, 'q', { localAddress: c })).toString(),
    ),
  );
  assert.deepEqual(got.slice().sort(), ['127.0.0.11', '127.0.0.11', '127.0.0.12', '127.0.0.12']);
  context.balancer.setEndpoints([endpoints[1]!]);
  assert.equal(listener.endpointsChanged(), 2);
  assert.equal(listener.sessions.size, 2);
  assert.deepEqual(closed, ['127.0.0.11 endpoint-removed', '127.0.0.11 endpoint-removed']);
  assert.equal(context.stats.active, 2);
});

test('dual-stack: an IPv4 session goes to the IPv4 endpoints, an IPv6 session to the IPv6 ones', async (t) => {
  const v4 = await udpServer('127.0.0.11', () => Buffer.from('v4'));
  t.after(() => v4.close());
  let v6: Awaited<ReturnType<typeof udpServer>> | undefined;
  try {
    v6 = await udpServer('::1', () => Buffer.from('v6'));
    t.after(() => v6!.close());
  } catch {
    // No ::1 here (IPv6 disabled): only the IPv4 half can be checked.
  }
  const context = makeDualStackContext(
    { IPv4: [ep(v4.host, v4.port)], IPv6: v6 === undefined ? [] : [ep('::1', v6.port)] },
    'UDP',
    'default/dns:dns',
  );
  const listener = new UdpListener(context, DEFAULT_UDP_OPTIONS, { log }, v6 === undefined ? 'udp4' : 'udp6');
  await listener.listen(v6 === undefined ? '0.0.0.0' : '::', 0);
  t.after(() => listener.close());
  // On `::` the IPv4 client is seen as ::ffff:127.0.0.1: still IPv4, and the reply still reaches it.
  for (let i = 0; i < 3; i++) assert.equal((await udpRequest(listener.port, 'q')).toString(), 'v4');
  if (v6 === undefined) {
    t.skip('::1 is not available: the IPv6 half is not checked');
    return;
  }
  const reply = await new Promise<string>((resolve, reject) => {
    const socket = dgram.createSocket('udp6');
    const timer = setTimeout(() => reject(new Error('no reply over IPv6')), 2000);
    socket.once('message', (m) => {
      clearTimeout(timer);
      socket.close();
      resolve(m.toString());
    });
    socket.send('q', listener.port, '::1');
  });
  assert.equal(reply, 'v6');
  // The IPv6 balancer lost its endpoint: only the IPv6 session is closed.
  context.balancers.IPv6.setEndpoints([]);
  assert.equal(listener.endpointsChanged(), 1);
  assert.equal(listener.sessions.size, 3);
});

// Review regression: 127.255.255.255 is lo's broadcast address, which a UDP connect() refuses (EACCES).
test('UDP: an upstream connect() that fails drops the session instead of crashing the process', async (t) => {
  const good = await udpServer('127.0.0.12', () => Buffer.from('good'));
  t.after(() => good.close());
  const context = makeContext([ep('127.255.255.255', 9)], 'UDP', 'default/dns:dns');
  const listener = new UdpListener(context, { ...DEFAULT_UDP_OPTIONS, idleTimeoutMs: 5000 }, { log }, 'udp4');
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.close());
  const socket = dgram.createSocket('udp4');
  t.after(() => socket.close());
  let got = '';
  socket.on('message', (m) => {
    got = m.toString();
  });
  await new Promise<void>((r) => socket.bind(0, '127.0.0.21', r));
  socket.send('q', listener.port, '127.0.0.1');
  await waitFor(() => context.stats.connectFailures['error'] === 1, 2000, 'the failed connect');
  await waitFor(() => listener.sessions.size === 0, 2000, 'the session to be dropped');
  assert.equal(context.stats.active, 0);
  // The process is still here and the listener still serves.
  context.balancer.setEndpoints([ep(good.host, good.port)]);
  socket.send('q', listener.port, '127.0.0.1');
  await waitFor(() => got === 'good', 2000, 'a reply through a working endpoint');
});
