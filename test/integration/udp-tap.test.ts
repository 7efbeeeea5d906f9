// Traced UDP sessions relayed by the addon with its tap (native/udp_fast.c, src/relay/udp.ts): a session
// whose observer still wants its datagrams is handed over at its first answer like any other, and the
// observer gets each datagram from the addon after it was sent on, a batch at a time. The tracer's events
// and records are the same as with KUP_UDP_TAP=off (the session stays in JavaScript while sniffed) and
// without the addon; so is what an observer that throws, or a session that ends while tapped, leads to.
import assert from 'node:assert/strict';
import dgram from 'node:dgram';
import { test } from 'node:test';
import type { ConnectionInfo, ConnectionObserver } from '../../src/relay/observer.ts';
import { noopObserver } from '../../src/relay/observer.ts';
import { Sweeper } from '../../src/relay/sweeper.ts';
import { DEFAULT_UDP_OPTIONS, UdpListener, type UdpRelayOptions } from '../../src/relay/udp.ts';
import { loadUdpFast, type UdpFastCalls, udpTapEnabled } from '../../src/relay/udp-fast.ts';
import { dnsAnswer, dnsQuery } from '../helpers/dns.ts';
import { ep } from '../helpers/endpoints.ts';
import { log, makeContext } from '../helpers/relay.ts';
import { udpServer, waitFor } from '../helpers/servers.ts';
import { recordingTracer } from '../helpers/tracer.ts';

type After = { after(fn: () => unknown): void };

function addon(): UdpFastCalls {
  const support = loadUdpFast({});
  assert.ok(support.calls, `build/native/udp_fast.node: ${support.error}`);
  return support.calls;
}

/** The addon with every tap call counted: onTap's calls and the datagrams they carried. */
function counted(real: UdpFastCalls) {
  const taps = { calls: 0, datagrams: 0, most: 0 };
  const calls: UdpFastCalls = {
    ...real,
    open: (fd, onMiss, onError, onTap) =>
      real.open(
        fd,
        onMiss,
        onError,
        onTap &&
          ((count) => {
            taps.calls++;
            taps.datagrams += count;
            taps.most = Math.max(taps.most, count);
            onTap(count);
          }),
      ),
  };
  return { calls, taps };
}

const PATHS = [
  { name: 'tap', calls: () => addon(), tap: true },
  { name: 'KUP_UDP_TAP=off', calls: () => addon(), tap: false },
  { name: 'JavaScript', calls: () => null, tap: false },
] as const;

async function relay(
  t: After,
  port: number,
  udpFast: UdpFastCalls | null,
  udpTap: boolean,
  observer: ConnectionObserver,
  options: Partial<UdpRelayOptions> = {},
) {
  const context = makeContext([ep('127.0.0.13', port)], 'UDP', 'kube-system/kube-dns:dns');
  context.observer = observer;
  const sweeper = new Sweeper(10);
  t.after(() => sweeper.stop());
  const listener = new UdpListener(
    context,
    { ...DEFAULT_UDP_OPTIONS, ...options },
    { log, udpFast, udpTap, sweeper },
    'udp4',
  );
  await listener.listen('127.0.0.1', 0);
  t.after(() => listener.close());
  return { listener, context };
}

async function client(t: After) {
  const socket = dgram.createSocket('udp4');
  t.after(() => socket.close());
  await new Promise<void>((r) => socket.bind(0, '127.0.0.21', r));
  const answers: Buffer[] = [];
  socket.on('message', (m) => answers.push(m));
  return {
    answers,
    /** Sends the datagrams at once (one batch for the addon) and waits for `expect` answers. */
    async burst(port: number, msgs: Buffer[], expect = msgs.length): Promise<void> {
      const before = answers.length;
      for (const m of msgs) socket.send(m, port, '127.0.0.1');
      await waitFor(() => answers.length >= before + expect, 2000, `${expect} answers`);
    },
    send(port: number, msg: Buffer): void {
      socket.send(msg, port, '127.0.0.1');
    },
  };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

test('KUP_UDP_TAP=off turns the tap off; anything else leaves it on', () => {
  assert.equal(udpTapEnabled({ KUP_UDP_TAP: 'off' }), false);
  assert.equal(udpTapEnabled({}), true);
});

test('a traced DNS session: the addon relays it from its first answer, with the same events and records', async (t) => {
  const server = await udpServer('127.0.0.13', (m) => dnsAnswer(m));
  t.after(() => server.close());
  const seen: unknown[] = [];
  for (const path of PATHS) {
    const { table, tracer, events } = recordingTracer(t);
    const real = path.calls();
    const spy = real === null ? null : counted(real);
    const { listener } = await relay(
      t,
      server.port,
      spy?.calls ?? null,
      path.tap,
      tracer.observerFor({ trace: undefined }),
      { idleTimeoutMs: 150 },
    );
    const c = await client(t);
    // One at a time, two bursts, then one at a time again: the sniffer records 16 exchanges and is done
    // with the second burst's last answer (every query it saw answered).
    const ask = (i: number) => c.burst(listener.port, [dnsQuery(i, `q${i}.svc.cluster.local`)]);
    for (let i = 0; i < 4; i++) await ask(i);
    for (let i = 4; i < 20; i += 8) {
      const burst = Array.from({ length: 8 }, (_, k) => dnsQuery(i + k, `q${i + k}.svc.cluster.local`));
      await c.burst(listener.port, burst);
    }
    for (let i = 20; i < 24; i++) await ask(i);
    const fast = listener.fastDatagrams;
    await waitFor(() => table.list().recent.length === 1, 3000, 'the session idled out');
    await waitFor(() => events.some((e) => e.type === 'closed'), 2000, 'the closed event');
    const [r] = table.list().recent;
    assert.ok(r!.app?.protocol === 'dns');
    if (path.name === 'tap') {
      // All but the first exchange; those sniffed came from the tap, in batches, and the tap went off
      // with the sniffer.
      assert.equal(fast, 46, 'tap: datagrams relayed natively');
      assert.equal(spy!.taps.datagrams, 38, 'tap: exchanges 1-19 from the tap');
      assert.ok(spy!.taps.calls < 38, `tap: ${spy!.taps.calls} calls for 38 datagrams`);
    } else if (path.name === 'KUP_UDP_TAP=off') {
      // Handed over once the sniffer was done: the last 4 exchanges.
      assert.equal(fast, 8);
      assert.equal(spy!.taps.calls, 0);
    } else assert.equal(fast, 0);
    seen.push({
      events: events.map((e) =>
        e.type === 'dns-query' || e.type === 'dns-response'
          ? [e.type, e.dnsId, e.qname, e.qtype, e.type === 'dns-response' ? [e.rcode, e.answers] : null]
          : [e.type],
      ),
      record: {
        closeReason: r!.closeReason,
        bytes: [r!.bytesFromClient, r!.bytesToClient],
        app: {
          ...r!.app,
          exchanges: r!.app.exchanges.map((x) => [x.id, x.qname, x.qtype, x.rcode, x.answers, x.truncated]),
        },
      },
    });
  }
  const first = seen[0] as { events: unknown[]; record: { app: { exchanges: unknown[] } } };
  assert.equal(first.record.app.exchanges.length, 16);
  assert.equal(first.events.length, 2 + 2 * 20, 'opened, 20 queries and answers, closed');
  assert.deepEqual(seen[1], seen[0], 'KUP_UDP_TAP=off');
  assert.deepEqual(seen[2], seen[0], 'without the addon');
});

for (const path of PATHS) {
  test(`${path.name}: an observer that throws is fed no more; the session goes on relayed`, async (t) => {
    const server = await udpServer('127.0.0.13', (m) => Buffer.concat([Buffer.from('re:'), m]));
    t.after(() => server.close());
    const fed: string[] = [];
    const observer: ConnectionObserver = {
      opened() {},
      closed() {},
      clientData(_c: ConnectionInfo, m: Buffer) {
        fed.push(`c${m}`);
        if (String(m) === 'boom') throw new Error('observer bug');
        return true;
      },
      endpointData: (_c: ConnectionInfo, m: Buffer) => fed.push(`e${m}`) > 0,
      wantsData: true,
    };
    const { listener, context } = await relay(t, server.port, path.calls(), path.tap, observer);
    const c = await client(t);
    await c.burst(listener.port, [Buffer.from('a')]);
    await c.burst(listener.port, [Buffer.from('b'), Buffer.from('boom'), Buffer.from('c')]);
    await c.burst(listener.port, [Buffer.from('d')]);
    // The batch's answers may come before or after the throw: only the client's side is certain.
    assert.deepEqual(
      fed.filter((f) => f.startsWith('c')),
      ['ca', 'cb', 'cboom'],
    );
    assert.ok(!fed.includes('ed'), 'nothing after the throw');
    assert.equal(context.observer, noopObserver, 'tracing off for the service port');
    assert.deepEqual(
      c.answers.map(String).sort(),
      ['re:a', 're:b', 're:boom', 're:c', 're:d'],
      'every datagram relayed',
    );
    if (path.name === 'tap') assert.equal(listener.fastDatagrams, 8);
  });

  test(`${path.name}: a session that ends while sniffed is fed no more; the client's next datagram opens a new one`, async (t) => {
    const servers = await Promise.all(
      ['127.0.0.13', '127.0.0.14'].map((h) => udpServer(h, (m) => Buffer.concat([Buffer.from(`${h}:`), m]))),
    );
    t.after(() => Promise.all(servers.map((s) => s.close())));
    const fed: string[] = [];
    const closed: string[] = [];
    const observer: ConnectionObserver = {
      opened() {},
      closed: (conn: ConnectionInfo) => void closed.push(`${conn.id}:${conn.closeReason}`),
      clientData(_c: ConnectionInfo, m: Buffer) {
        fed.push(`c${m}`);
        // The endpoint leaves while the batch is being fed: the session ends in the middle of it.
        if (String(m) === 'end') {
          context.balancers.IPv4.setEndpoints([ep(servers[1]!.host, servers[1]!.port)]);
          listener.endpointsChanged();
        }
        return true;
      },
      endpointData: (_c: ConnectionInfo, m: Buffer) => fed.push(`e${m}`) > 0,
      wantsData: true,
    };
    const { listener, context } = await relay(t, servers[0]!.port, path.calls(), path.tap, observer);
    const c = await client(t);
    await c.burst(listener.port, [Buffer.from('a')]);
    c.send(listener.port, Buffer.from('b'));
    c.send(listener.port, Buffer.from('end'));
    c.send(listener.port, Buffer.from('late'));
    await sleep(100);
    assert.equal(closed.length, 1);
    assert.match(closed[0]!, /:endpoint-removed$/);
    const cut = fed.indexOf('cend');
    assert.ok(cut > 0, 'fed up to the datagram whose observer ended it');
    assert.ok(
      !fed.slice(cut + 1).some((f) => f.startsWith('e') && f.includes('127.0.0.13')),
      'no answer of the ended session fed after the end',
    );
    // The next datagram opens a session on the endpoint left, traced and (with the tap) relayed natively.
    const before = fed.length;
    await c.burst(listener.port, [Buffer.from('x')]);
    await c.burst(listener.port, [Buffer.from('y')]);
    assert.equal(c.answers.at(-1)?.toString(), '127.0.0.14:y');
    assert.ok(fed.slice(before).includes('cy') && fed.slice(before).includes('e127.0.0.14:y'));
    if (path.name === 'tap') assert.ok(listener.fastDatagrams > 0);
  });
}
