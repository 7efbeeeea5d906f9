// Established UDP sessions relayed by the addon (src/relay/udp-fast.ts, native/udp_fast.c): a session is
// handed over once connected, answered and no longer sniffed; its datagrams then pass without JavaScript,
// and everything JavaScript decides from them (expiry, caps, the endpoint leaving, ICMP unreachable,
// the counts) stays as without the addon. Each test runs the relay with the addon and without it.
import assert from 'node:assert/strict';
import dgram from 'node:dgram';
import { readdirSync } from 'node:fs';
import { test } from 'node:test';
import type { ConnectionInfo, ConnectionObserver } from '../../src/relay/observer.ts';
import {
  DEFAULT_UDP_OPTIONS,
  FAST_RETRY_MS,
  UdpListener,
  type UdpRelayOptions,
} from '../../src/relay/udp.ts';
import { loadUdpFast, type UdpFastCalls, udpTapEnabled } from '../../src/relay/udp-fast.ts';
import { ep } from '../helpers/endpoints.ts';
import { log, makeContext } from '../helpers/relay.ts';
import { udpServer, waitFor } from '../helpers/servers.ts';

type After = { after(fn: () => unknown): void };

/**
 * Built by `npm run build` (scripts/build-native.ts); CI builds it before the tests. Loaded whatever
 * KUP_UDP_FAST says: these tests compare both paths (the others follow it).
 */
function addon(): UdpFastCalls {
  const support = loadUdpFast({});
  assert.ok(support.calls, `build/native/udp_fast.node: ${support.error}`);
  return support.calls;
}

const PATHS = [
  { name: 'addon', calls: () => addon() },
  { name: 'JavaScript', calls: () => null },
] as const;

async function relay(
  t: After,
  endpoints: ReturnType<typeof ep>[],
  udpFast: UdpFastCalls | null,
  options: Partial<UdpRelayOptions> = {},
) {
  const context = makeContext(endpoints, 'UDP', 'default/dns:dns');
  const listener = new UdpListener(context, { ...DEFAULT_UDP_OPTIONS, ...options }, { log, udpFast }, 'udp4');
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.close());
  return { listener, context };
}

async function client(t: After, host: string) {
  const socket = dgram.createSocket('udp4');
  t.after(() => socket.close());
  await new Promise<void>((r) => socket.bind(0, host, r));
  const answers: Buffer[] = [];
  socket.on('message', (m) => answers.push(m));
  return {
    socket,
    answers,
    /** Sends `msg` to `port` and waits for its answer. */
    async ask(port: number, msg: string | Buffer): Promise<Buffer> {
      const before = answers.length;
      socket.send(msg, port, '127.0.0.1');
      await waitFor(() => answers.length > before, 2000, `answer to ${msg.length} bytes`);
      return answers[before]!;
    },
  };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

test('KUP_UDP_FAST=off: no addon', () => {
  assert.match(loadUdpFast({ KUP_UDP_FAST: 'off' }).error ?? '', /KUP_UDP_FAST=off/);
});

test('a known session bypasses JavaScript; both paths answer the same bytes and count the same', async (t) => {
  const server = await udpServer('127.0.0.11', (m) => Buffer.concat([Buffer.from('re:'), m]));
  t.after(() => server.close());
  const seen: Record<string, unknown>[] = [];
  for (const path of PATHS) {
    const { listener, context } = await relay(t, [ep(server.host, server.port)], path.calls());
    const c = await client(t, '127.0.0.21');
    const sent: Buffer[] = [];
    for (let i = 0; i < 40; i++) {
      const size = [1, 100, 1400, 9000, 65_000][i % 5]!;
      const msg = Buffer.alloc(size, i);
      sent.push(msg);
      const answer = await c.ask(listener.port, msg);
      assert.ok(
        answer.equals(Buffer.concat([Buffer.from('re:'), msg])),
        `${path.name}: datagram ${i} intact`,
      );
    }
    const [session] = [...listener.sessions.values()];
    const live = { from: session!.bytesFromClient, to: session!.bytesToClient };
    // The first exchange goes through JavaScript (its answer hands the session over); the rest not.
    assert.equal(
      listener.fastDatagrams,
      path.name === 'addon' ? 78 : 0,
      `${path.name}: datagrams relayed natively`,
    );
    await listener.close();
    seen.push({
      live,
      bytesFromClients: context.stats.bytesFromClients,
      bytesToClients: context.stats.bytesToClients,
      accepted: context.stats.accepted,
      active: context.stats.active,
    });
  }
  const bytes = Array.from({ length: 40 }, (_, i) => [1, 100, 1400, 9000, 65_000][i % 5]!).reduce(
    (a, b) => a + b,
  );
  assert.deepEqual(seen[0], {
    live: { from: bytes, to: bytes + 40 * 3 },
    bytesFromClients: bytes,
    bytesToClients: bytes + 40 * 3,
    accepted: 1,
    active: 0,
  });
  assert.deepEqual(seen[1], seen[0]);
});

for (const path of PATHS) {
  test(`${path.name}: a session in use stays, an idle one expires after the timeout`, async (t) => {
    const servers = await Promise.all(
      ['127.0.0.11', '127.0.0.12'].map((h) => udpServer(h, () => Buffer.from(h))),
    );
    t.after(() => Promise.all(servers.map((s) => s.close())));
    const { listener, context } = await relay(
      t,
      servers.map((s) => ep(s.host, s.port)),
      path.calls(),
      { idleTimeoutMs: 150 },
    );
    const c = await client(t, '127.0.0.21');
    const first = String(await c.ask(listener.port, 'q'));
    // Three timeouts' worth of traffic: only the datagrams the addon relayed keep the session.
    for (let i = 0; i < 9; i++) {
      await sleep(50);
      assert.equal(String(await c.ask(listener.port, 'q')), first, 'same session, same endpoint');
    }
    assert.equal(listener.sessions.size, 1);
    assert.equal(context.stats.accepted, 1);
    await waitFor(() => listener.sessions.size === 0, 1000, 'session expiry');
    assert.equal(context.stats.active, 0);
    assert.equal(context.stats.bytesToClients, 10 * 10);
    assert.notEqual(String(await c.ask(listener.port, 'q')), first, 'a new session at the next endpoint');
  });

  test(`${path.name}: sessions are capped; the idlest, by what the addon saw, is evicted`, async (t) => {
    const server = await udpServer('127.0.0.11');
    t.after(() => server.close());
    const { listener, context } = await relay(t, [ep(server.host, server.port)], path.calls(), {
      maxSessions: 2,
      idleTimeoutMs: 10_000,
    });
    const a = await client(t, '127.0.0.21');
    const b = await client(t, '127.0.0.22');
    await a.ask(listener.port, 'a');
    await b.ask(listener.port, 'b');
    // a is used again after b: b is the idlest.
    await sleep(20);
    for (let i = 0; i < 3; i++) await a.ask(listener.port, 'a');
    const c = await client(t, '127.0.0.23');
    await c.ask(listener.port, 'c');
    assert.equal(context.stats.udpSessionsEvicted, 1);
    const left = [...listener.sessions.values()].map((s) => s.clientAddress).sort();
    assert.deepEqual(left, ['127.0.0.21', '127.0.0.23']);
  });

  test(`${path.name}: a removed endpoint's session is closed; the next datagram goes to a live endpoint`, async (t) => {
    const servers = await Promise.all(
      ['127.0.0.11', '127.0.0.12'].map((h) => udpServer(h, () => Buffer.from(h))),
    );
    t.after(() => Promise.all(servers.map((s) => s.close())));
    const endpoints = servers.map((s) => ep(s.host, s.port));
    const { listener, context } = await relay(t, endpoints, path.calls(), { idleTimeoutMs: 60_000 });
    const c = await client(t, '127.0.0.21');
    const first = String(await c.ask(listener.port, 'q'));
    for (let i = 0; i < 3; i++) assert.equal(String(await c.ask(listener.port, 'q')), first);
    context.balancer.setEndpoints(endpoints.filter((e) => e.ip !== first));
    assert.equal(listener.endpointsChanged(), 1);
    assert.equal(context.stats.udpSessionsEndpointRemoved, 1);
    assert.notEqual(String(await c.ask(listener.port, 'q')), first);
    assert.equal(String(await c.ask(listener.port, 'q')), servers.find((s) => s.host !== first)!.host);
    assert.equal(context.stats.accepted, 2);
  });

  test(`${path.name}: an endpoint gone (ICMP unreachable) ends the session; the client moves on`, async (t) => {
    const doomed = await udpServer('127.0.0.11', () => Buffer.from('doomed'));
    let doomedOpen = true;
    t.after(() => doomedOpen && doomed.close());
    const good = await udpServer('127.0.0.12', () => Buffer.from('good'));
    t.after(() => good.close());
    const { listener, context } = await relay(t, [ep(doomed.host, doomed.port)], path.calls(), {
      idleTimeoutMs: 60_000,
    });
    const c = await client(t, '127.0.0.21');
    assert.equal(String(await c.ask(listener.port, 'q')), 'doomed');
    assert.equal(String(await c.ask(listener.port, 'q')), 'doomed');
    const [session] = [...listener.sessions.values()];
    // The session's endpoint stays in the balancer: only the ICMP unreachable can end the session.
    context.balancer.setEndpoints([ep(doomed.host, doomed.port), ep(good.host, good.port)]);
    assert.equal(listener.endpointsChanged(), 0);
    doomedOpen = false;
    await doomed.close();
    for (let i = 0; i < 40 && c.answers.at(-1)?.toString() !== 'good'; i++) {
      c.socket.send('q', listener.port, '127.0.0.1');
      await sleep(25);
    }
    assert.equal(c.answers.at(-1)?.toString(), 'good');
    assert.equal(session!.closeReason, 'endpoint-reset');
    assert.ok(context.stats.accepted >= 2);
  });

  test(`${path.name}: the ICMP unreachable ends the session when it arrives, not at the client's next datagram`, async (t) => {
    const doomed = await udpServer('127.0.0.11', () => Buffer.from('doomed'));
    let doomedOpen = true;
    t.after(() => doomedOpen && doomed.close());
    const good = await udpServer('127.0.0.12', () => Buffer.from('good'));
    t.after(() => good.close());
    const { listener, context } = await relay(t, [ep(doomed.host, doomed.port)], path.calls(), {
      idleTimeoutMs: 60_000,
    });
    const c = await client(t, '127.0.0.21');
    assert.equal(String(await c.ask(listener.port, 'q')), 'doomed');
    assert.equal(String(await c.ask(listener.port, 'q')), 'doomed');
    assert.equal(listener.fastDatagrams > 0, path.name === 'addon');
    const [session] = [...listener.sessions.values()];
    context.balancer.setEndpoints([ep(doomed.host, doomed.port), ep(good.host, good.port)]);
    doomedOpen = false;
    await doomed.close();
    // One datagram draws the ICMP port unreachable (EPOLLERR on the session's socket); no other follows.
    c.socket.send('q', listener.port, '127.0.0.1');
    await waitFor(() => session!.closed, 2000, 'the session closed by the ICMP error');
    assert.equal(session!.closeReason, 'endpoint-reset');
    // The next session may pick the gone endpoint again (round robin): a few tries at most.
    for (let i = 0; i < 6 && c.answers.at(-1)?.toString() !== 'good'; i++) {
      c.socket.send('q', listener.port, '127.0.0.1');
      await sleep(100);
    }
    assert.equal(c.answers.at(-1)?.toString(), 'good');
  });

  test(`${path.name}: a sniffing observer sees every datagram until it wants no more`, async (t) => {
    const server = await udpServer('127.0.0.11');
    t.after(() => server.close());
    const fed: string[] = [];
    const observer: ConnectionObserver = {
      opened() {},
      closed() {},
      clientData: (_c: ConnectionInfo, m: Buffer) => fed.push(`c${m}`) < 6,
      endpointData: (_c: ConnectionInfo, m: Buffer) => fed.push(`e${m}`) < 6,
      wantsData: true,
    };
    const { listener, context } = await relay(t, [ep(server.host, server.port)], path.calls());
    context.observer = observer;
    const c = await client(t, '127.0.0.21');
    for (let i = 0; i < 6; i++) await c.ask(listener.port, String(i));
    assert.deepEqual(fed, ['c0', 'e0', 'c1', 'e1', 'c2', 'e2']);
    // With the tap (udp-tap.test.ts) handed over at the first answer, the other five exchanges the
    // addon's; with KUP_UDP_TAP=off with the answer that ended the sniffing, the last three.
    const handedOver = udpTapEnabled() ? 10 : 6;
    assert.equal(listener.fastDatagrams, path.name === 'addon' ? handedOver : 0);
  });
}

test('a handed-over session holds one descriptor, as the session caps count it', async (t) => {
  const server = await udpServer('127.0.0.11');
  t.after(() => server.close());
  const fds = () => readdirSync('/proc/self/fd').length;
  const held: number[] = [];
  for (const path of PATHS) {
    const { listener } = await relay(t, [ep(server.host, server.port)], path.calls(), {
      idleTimeoutMs: 60_000,
    });
    // One exchange first: the listener is taken over with the first session (the addon's one dup).
    const first = await client(t, '127.0.0.20');
    await first.ask(listener.port, 'q');
    const before = fds();
    for (let i = 0; i < 20; i++) {
      const c = await client(t, `127.0.0.${30 + i}`);
      await c.ask(listener.port, 'q');
      await c.ask(listener.port, 'q');
    }
    held.push(fds() - before);
    assert.equal(listener.sessions.size, 21);
    await listener.close();
  }
  // 20 client sockets and 20 sessions either way.
  assert.deepEqual(held, [40, 40]);
});

test('addon: a listener it could not read at first (no descriptor left) is tried again after a delay, not never', async (t) => {
  const server = await udpServer('127.0.0.11', (m) => Buffer.concat([Buffer.from('re:'), m]));
  t.after(() => server.close());
  const real = addon();
  let opens = 0;
  // The first open fails as a dup() without a free descriptor does (-EMFILE).
  const calls: UdpFastCalls = {
    open: (fd, onMiss, onError, onTap) => (++opens === 1 ? -24 : real.open(fd, onMiss, onError, onTap)),
    add: (listener, id, address, port, fd) => real.add(listener, id, address, port, fd),
    stats: (session, out) => real.stats(session, out),
    remove: (session) => real.remove(session),
    bypassed: (listener) => real.bypassed(listener),
    close: (listener) => real.close(listener),
    setupTap: (info) => real.setupTap(info),
    tap: (session, on) => real.tap(session, on),
  };
  let now = 1_000_000;
  const context = makeContext([ep(server.host, server.port)], 'UDP', 'default/dns:dns');
  const listener = new UdpListener(
    context,
    DEFAULT_UDP_OPTIONS,
    { log, udpFast: calls, now: () => now },
    'udp4',
  );
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.close());
  const a = await client(t, '127.0.0.21');
  for (let i = 0; i < 5; i++) await a.ask(listener.port, `a${i}`);
  assert.equal(opens, 1);
  assert.equal(listener.fastDatagrams, 0, 'JavaScript relays meanwhile');
  // A second session within the delay does not ask again.
  const b = await client(t, '127.0.0.22');
  for (let i = 0; i < 3; i++) await b.ask(listener.port, `b${i}`);
  assert.equal(opens, 1);
  now += FAST_RETRY_MS;
  for (let i = 0; i < 5; i++) assert.equal(String(await a.ask(listener.port, `a${i}`)), `re:a${i}`);
  assert.equal(opens, 2);
  assert.ok(listener.fastDatagrams > 0, 'handed over once the addon could read the service socket');
});

test('addon: 100 sessions of one listener (its table of clients grows from 16 chains) all relayed natively, then removed', async (t) => {
  const server = await udpServer('127.0.0.11', (m) => Buffer.concat([Buffer.from('re:'), m]));
  t.after(() => server.close());
  // Sessions that outlive the three rounds (the default expires them after 250 ms idle).
  const { listener } = await relay(t, [ep(server.host, server.port)], addon(), { idleTimeoutMs: 60_000 });
  const clients = [];
  for (let i = 0; i < 100; i++) clients.push(await client(t, '127.0.0.21'));
  for (let round = 0; round < 3; round++)
    for (const [i, c] of clients.entries())
      assert.equal(String(await c.ask(listener.port, `c${i}r${round}`)), `re:c${i}r${round}`);
  // Each client's first exchange goes through JavaScript (its answer hands it over), the other two not.
  assert.equal(listener.fastDatagrams, 100 * 2 * 2);
  assert.equal(listener.sessions.size, 100);
  await listener.close();
  assert.equal(listener.sessions.size, 0);
});
