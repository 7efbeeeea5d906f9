// The fault suite: the real proxy CLI in a network-namespace cluster with real iptables, and one fault
// after another: a refusing and a blackholed endpoint, ejection and return, an endpoint killed mid-transfer,
// rules flushed, SIGKILL and restart, file descriptors running out, a 10,000-port UDP burst, 5,000 held
// TCP connections, hostile names; plus the API server cut, expired and failing. Each prints its figure.
import assert from 'node:assert/strict';
import { mkdtemp, readdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { test } from 'node:test';
import { readFdLimits } from '../../src/proxier/process-limits.ts';
import type { DebugServicePort } from '../../src/server/debug.ts';
import {
  createManifest,
  createProxyCluster,
  e2eProxyArgs,
  eventually,
  longestGap,
  PROXY_BIN,
  ProxyProcess,
} from '../helpers/cluster-proxy.ts';
import { service, slice } from '../helpers/manifests.ts';
import { createSandbox, requireRootOrSkip } from '../helpers/netns.ts';
import { FAKE_API, MANY_TCP, Script, STREAM_CLIENT, TCP_SERVER, UDP_BURST } from '../helpers/scripts.ts';

const PODS = 3;
const POD_IP = (i: number) => `10.244.0.${10 + i}`;
const WEB_IP = '10.96.1.10';
const REFUSE_IP = '10.96.1.11';
const BLACKHOLE_IP = '10.96.1.12';
const STREAM_IP = '10.96.1.13';
const HOLD_IP = '10.96.1.14';
const BURST_IP = '10.96.1.15';
const PORT = { web: 8080, refuse: 8081, blackhole: 8082, stream: 8083, hold: 8085, udp: 5353 };
const UDP_TOTAL_CAP = 1500;

function svc(name: string, ip: string, targetPort: number, protocol: 'TCP' | 'UDP' = 'TCP') {
  return service(name, ip, [{ name: 'p', port: protocol === 'UDP' ? 53 : 80, targetPort, protocol }]);
}

function eps(name: string, pods: number[], port: number, protocol: 'TCP' | 'UDP' = 'TCP') {
  return slice(
    name,
    `${name}-1`,
    pods.map((i) => ({ ip: POD_IP(i) })),
    [{ name: 'p', port, protocol }],
  );
}

function baseObjects(): object[] {
  return [
    svc('web', WEB_IP, PORT.web),
    eps('web', [0, 1, 2], PORT.web),
    svc('refuse', REFUSE_IP, PORT.refuse),
    eps('refuse', [0, 1, 2], PORT.refuse),
    svc('blackhole', BLACKHOLE_IP, PORT.blackhole),
    eps('blackhole', [0, 1, 2], PORT.blackhole),
    svc('stream', STREAM_IP, PORT.stream),
    eps('stream', [2], PORT.stream),
    svc('hold', HOLD_IP, PORT.hold),
    eps('hold', [1], PORT.hold),
    svc('burst', BURST_IP, PORT.udp, 'UDP'),
    eps('burst', [0, 1, 2], PORT.udp, 'UDP'),
  ];
}

const find = (s: readonly DebugServicePort[] | undefined, name: string) =>
  s?.find((x) => x.service === `default/${name}:p`);

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/** Open descriptors of a process (root reads any /proc/<pid>/fd). */
async function fdCount(pid: number): Promise<number> {
  return (await readdir(`/proc/${pid}/fd`)).length;
}

async function rssMB(pid: number): Promise<number> {
  const m = /VmRSS:\s+(\d+) kB/.exec(await readFile(`/proc/${pid}/status`, 'utf8'));
  return Math.round(Number(m?.[1] ?? 0) / 1024);
}

/** The sum of a metric's samples in a Prometheus text (those whose labels contain `filter`). */
function metric(text: string, name: string, filter = ''): number {
  let sum = 0;
  for (const line of text.split('\n')) {
    const m = /^([a-zA-Z_:][\w:]*)(\{[^}]*\})? (\S+)$/.exec(line);
    if (m?.[1] === name && (m[2] ?? '').includes(filter)) sum += Number(m[3]);
  }
  return sum;
}

/** Both sides of a hostile object set: what API validation lets through and what it rejects. */
const LONG_NS = `${'n'.repeat(62)}.${'s'.repeat(62)}.${'x'.repeat(62)}.${'y'.repeat(62)}`; // 251 chars
const LONG_NAME = `${'a'.repeat(63)}.${'b'.repeat(63)}.${'c'.repeat(63)}.${'d'.repeat(61)}`; // 253 chars
const HOSTILE_TEXT = [
  '"; iptables -F; echo "',
  "' -j ACCEPT\n-A INPUT -j ACCEPT\nCOMMIT\n",
  '--comment x -j DNAT --to-destination 1.2.3.4:1',
  `${'#'.repeat(300)} \u0000 \u202e ${'é'.repeat(100)}`,
  'z'.repeat(100_000),
];

function hostileAllowed(): object[] {
  const annotations = Object.fromEntries(HOSTILE_TEXT.map((v, i) => [`evil.example.com/a${i}`, v]));
  const labels = { app: 'x', 'evil.example.com/l': 'v' };
  const a = service('evil-annotations', '10.96.2.1', [{ name: 'p', port: 80, targetPort: PORT.web }]);
  const withMeta = {
    ...a,
    metadata: { ...a.metadata, annotations, labels },
    spec: {
      ...a.spec,
      // Not IPs: each is dropped with a warning, none reaches a rule.
      externalIPs: ['1.2.3.4 -j ACCEPT', '1.2.3.4/0', '::ffff:1.2.3.4', '1.2.3.4\n-A INPUT'],
    },
    status: { loadBalancer: { ingress: [{ ip: '5.6.7.8 --to-ports 1' }, { hostname: '"; evil' }] } },
  };
  const long = service(
    LONG_NAME,
    '10.96.2.2',
    [{ name: `${'p'.repeat(62)}q`, port: 81, targetPort: PORT.web }],
    {
      namespace: LONG_NS,
    },
  );
  const sliceWithBadAddresses = {
    ...eps('evil-annotations', [0], PORT.web),
    endpoints: [
      { addresses: [POD_IP(0)] },
      { addresses: ['10.244.0.11 -j ACCEPT'] },
      { addresses: ['10.244.0.12\n'] },
    ],
    metadata: {
      ...eps('evil-annotations', [0], PORT.web).metadata,
      annotations: { 'endpoints.kubernetes.io/last-change-trigger-time': '"; x' },
    },
  };
  return [withMeta, sliceWithBadAddresses, long];
}

function hostileRejected(): object[][] {
  const named = (name: string, namespace = 'default') =>
    service(name, '10.96.2.9', [{ name: 'p', port: 80, targetPort: 1 }], { namespace });
  const port = service('ok-name', '10.96.2.9', [{ name: 'p', port: 80, targetPort: 1 }]);
  return [
    [named('evil"name')],
    [named('evil name')],
    [named('evil\n-A INPUT -j ACCEPT')],
    [named('ok', 'ns";-F')],
    [named('x'.repeat(254))],
    [
      {
        ...port,
        spec: { ...port.spec, clusterIP: '10.96.2.9 -j ACCEPT', clusterIPs: ['10.96.2.9 -j ACCEPT'] },
      },
    ],
    [{ ...port, spec: { ...port.spec, ports: [{ name: 'P"', port: 80, protocol: 'TCP' }] } }],
    [{ ...port, spec: { ...port.spec, ports: [{ name: 'p', port: 70000, protocol: 'TCP' }] } }],
  ];
}

test('fault suite: the proxy in network namespaces under faults', { timeout: 175_000 }, async (t) => {
  if (!requireRootOrSkip(t)) return;
  const sb = await createSandbox(t);
  const cluster = await createProxyCluster(sb, { pods: PODS });
  const { node, pods, nodeAgent } = cluster;
  const client = pods[2]!.agent;
  for (const [i, p] of pods.entries()) {
    await p.agent.serve('web', `pod${i}`, { tcpPort: PORT.web, udpPort: PORT.udp });
    await p.agent.serve('blackhole', `pod${i}`, { tcpPort: PORT.blackhole });
    if (i > 0) await p.agent.serve('refuse', `pod${i}`, { tcpPort: PORT.refuse });
  }
  const scripts: Script[] = [];
  t.after(() => {
    for (const s of scripts) s.kill();
  });
  const script = (ns: string, code: string, args: unknown) => {
    const s = new Script(sb, ns, code, args);
    scripts.push(s);
    return s;
  };
  const echo = script(pods[1]!.ns, TCP_SERVER, { port: PORT.hold, mode: 'echo' });
  await echo.wait('listening');

  const manifest = await createManifest(t);
  await manifest.write(baseObjects());
  const stateDir = await mkdtemp(join(tmpdir(), 'kup-fault-'));
  t.after(() => rm(stateDir, { recursive: true, force: true }));
  const stateFile = join(stateDir, 'state.json');
  const ARGS = [
    // One process: descriptors, session caps and ejections are counted per process below.
    '--workers=1',
    '--state-file',
    stateFile,
    '--outlier-base-ejection-time',
    '1s',
    '--udp-timeout',
    '5s',
    '--udp-max-sessions',
    '5000',
    '--udp-max-sessions-total',
    String(UDP_TOTAL_CAP),
    // One Service holds 5,000 connections below; the default cap (fd limit / 8) would be 2,500 here.
    '--max-connections-per-service',
    '6000',
  ];
  const save = async () => (await sb.exec(node, 'iptables-save', [])).stdout;
  const rules = async () => (await save()).split('\n').filter((l) => l.startsWith('-A'));
  // Back to the hard limit this process has (Node raised its own soft limit to it).
  const hard = readFdLimits()?.hard ?? 65_536;
  const raiseFds = async (pid: number, n = hard) =>
    sb.exec(node, 'prlimit', ['--pid', String(pid), `--nofile=${n}:${hard}`]);

  let proxy = new ProxyProcess(cluster, manifest.file, ARGS);
  t.after(() => proxy.stop());
  const all = (s: DebugServicePort[]) =>
    ['web', 'refuse', 'blackhole', 'stream', 'hold', 'burst'].every((n) => find(s, n));
  await proxy.waitServices(all, 15_000, 'the first sync');
  await raiseFds(proxy.child.pid!);
  await eventually(async () => (await client.tcp(WEB_IP, 80, 300)).ok, { what: 'the first rules' });
  const services = () => proxy.services();
  const metrics = async () =>
    (await nodeAgent.get(`http://127.0.0.1:${proxy.metricsPort}/metrics`)).body ?? '';
  const healthz = async () =>
    (await nodeAgent.get(`http://127.0.0.1:${proxy.metricsPort + 7}/healthz`)).status;

  await t.test('1 of 3 endpoints refusing: 100 of 100 requests succeed', async () => {
    let ok = 0;
    const answers = new Map<string, number>();
    for (let i = 0; i < 100; i++) {
      const r = await client.tcp(REFUSE_IP, 80);
      if (r.ok) ok++;
      answers.set(r.data ?? r.error ?? '?', (answers.get(r.data ?? r.error ?? '?') ?? 0) + 1);
    }
    const refuse = find(await services(), 'refuse')!;
    t.diagnostic(
      `refusing endpoint: ${ok} of 100 requests succeeded, answers ${JSON.stringify(Object.fromEntries(answers))}, ` +
        `refused connects ${refuse.connections.connectFailures['refused'] ?? 0}, ejected now ${JSON.stringify(refuse.ejected ?? [])}`,
    );
    assert.equal(ok, 100);
    assert.ok(!answers.has('pod0'));
  });

  await t.test(
    '1 of 3 endpoints blackholed: every request succeeds, one costs at most the 250 ms connect timeout',
    async () => {
      await sb.exec(pods[1]!.ns, 'iptables', [
        '-A',
        'INPUT',
        '-p',
        'tcp',
        '--dport',
        String(PORT.blackhole),
        '-j',
        'DROP',
      ]);
      const ms: number[] = [];
      let ok = 0;
      for (let i = 0; i < 30; i++) {
        const r = await client.tcp(BLACKHOLE_IP, 80);
        if (r.ok) ok++;
        ms.push(r.ms);
      }
      const base = median(ms);
      const extra = ms.map((m) => m - base);
      const slow = extra.filter((e) => e > 150);
      const bh = find(await services(), 'blackhole')!;
      t.diagnostic(
        `blackholed endpoint: ${ok} of 30 succeeded; median ${base} ms; ${slow.length} paid extra ` +
          `[${slow.join(', ')}] ms (then ejected: ${JSON.stringify(bh.ejected?.map((e) => e.endpoint) ?? [])}); ` +
          `connect timeouts ${bh.connections.connectFailures['timeout'] ?? 0}`,
      );
      assert.equal(ok, 30);
      assert.ok(slow.length >= 1 && slow.length <= 4, `${slow.length} slow requests`);
      // The connect timeout is 250 ms; the rest is timer granularity.
      assert.ok(Math.max(...extra) <= 250 + 75, `extra ${Math.max(...extra)} ms`);
      assert.ok(slow[0]! >= 240, 'the first one waited for the connect timeout');
    },
  );

  await t.test('an ejected endpoint returns on its own once it recovers', async () => {
    const POD0 = `${POD_IP(0)}:${PORT.refuse}`;
    const ejectedPod0 = async () =>
      find(await services(), 'refuse')?.ejected?.find((x) => x.endpoint === POD0);
    // Wait out the ejection from the first test; then, still refusing, pod0 is ejected afresh, for twice
    // as long as before (it never succeeded in between).
    await eventually(async () => (await ejectedPod0()) === undefined, { timeoutMs: 20_000, intervalMs: 50 });
    let until = 0;
    await eventually(
      async () => {
        await client.tcp(REFUSE_IP, 80);
        const e = await ejectedPod0();
        until = e === undefined ? 0 : Date.parse(e.until);
        return e !== undefined;
      },
      { timeoutMs: 10_000, intervalMs: 20, what: 'pod0 ejected' },
    );
    await pods[0]!.agent.serve('refuse', 'pod0', { tcpPort: PORT.refuse });
    const recovered = Date.now();
    let skipped = 0;
    const tookMs = await eventually(
      async () => {
        const r = await client.tcp(REFUSE_IP, 80);
        if (r.ok && r.data !== 'pod0') skipped++;
        return r.data === 'pod0';
      },
      { timeoutMs: 20_000, intervalMs: 50, what: 'pod0 to be picked again' },
    );
    await eventually(async () => find(await services(), 'refuse')?.ejected === undefined, {
      what: 'no endpoint ejected',
    });
    t.diagnostic(
      `ejected endpoint: recovered with ${until - recovered} ms of ejection left; skipped by ${skipped} requests ` +
        `meanwhile, all answered by the others; picked again ${tookMs} ms after it recovered`,
    );
    assert.ok(tookMs >= until - recovered - 100, 'not picked while ejected');
    assert.ok(tookMs <= until - recovered + 1000, 'picked again soon after its ejection ended');
  });

  await t.test('endpoint killed mid-transfer: the client sees the end, the proxy stays healthy', async () => {
    const server = script(pods[2]!.ns, TCP_SERVER, { port: PORT.stream, mode: 'stream' });
    await server.wait('listening');
    const reader = script(pods[0]!.ns, STREAM_CLIENT, { host: STREAM_IP, port: 80 });
    await reader.wait('first');
    await new Promise((r) => setTimeout(r, 100));
    server.kill('SIGKILL');
    const killedAt = Date.now();
    const done = await reader.wait<{ bytes: number; how: string; ms: number }>('done', 10_000);
    const after = Date.now() - killedAt;
    await eventually(async () => find(await services(), 'stream')?.connections.active === 0, {
      what: 'the connection accounted as closed',
    });
    const status = await healthz();
    const web = await client.tcp(WEB_IP, 80);
    t.diagnostic(
      `killed mid-transfer: client saw "${done.how}" ${after} ms after the kill, ${done.bytes} bytes of 64 MiB; ` +
        `healthz ${status}; other service ${web.ok ? 'answers' : web.error}`,
    );
    assert.ok(done.bytes < 64 << 20);
    assert.ok(after < 5000);
    assert.equal(status, 200);
    assert.ok(web.ok);
  });

  await t.test('rules flushed by someone: repaired within the sync period', async () => {
    const flushedAt = Date.now();
    // The dispatch rules and the shard chain of WEB_IP (10.96.1.10: shard 10, 0A).
    await sb.exec(node, 'iptables', ['-w', '-t', 'nat', '-F', 'KUBE-PORTALS-CONTAINER']);
    await sb.exec(node, 'iptables', ['-w', '-t', 'nat', '-F', 'KUBE-PORTALS-CONTAINER-0A']);
    const tookMs = await eventually(
      async () => {
        const s = await save();
        return (
          s.includes(`\n-A KUBE-PORTALS-CONTAINER-0A -d ${WEB_IP}/32 `) &&
          s.includes('\n-A KUBE-PORTALS-CONTAINER -d 0.0.0.10/0.0.0.31 -j KUBE-PORTALS-CONTAINER-0A\n')
        );
      },
      {
        timeoutMs: 2000 + 1500,
        intervalMs: 25,
        what: 'the repair',
      },
    );
    t.diagnostic(`rules repaired ${tookMs} ms after the flush (sync period 2 s)`);
    assert.ok((await client.tcp(WEB_IP, 80)).ok);
    assert.ok(Date.now() - flushedAt < 4000);
  });

  await t.test('SIGKILL and restart: same proxy ports, traffic back, the gap measured', async () => {
    const before = await services();
    const ports = (s: DebugServicePort[] | undefined) =>
      Object.fromEntries((s ?? []).map((x) => [`${x.service}/${x.protocol}`, x.proxyPort]));
    const state = JSON.parse(await readFile(stateFile, 'utf8')) as { proxyPorts: Record<string, number> };
    assert.deepEqual(state.proxyPorts, ports(before), 'the state file holds the running ports');
    // Hostile entries in the state file: skipped, never a rule.
    const hostile = {
      ...state.proxyPorts,
      'default/web:p/TCP\n-A INPUT -j ACCEPT': 1,
      '"; iptables -F': 2,
      'default/x:y/TCP': 99999,
    };
    await writeFile(`${stateFile}.new`, JSON.stringify({ version: 1, proxyPorts: hostile }));
    await rename(`${stateFile}.new`, stateFile);
    const rulesBefore = (await rules()).sort();

    await client.pollStart('restart', WEB_IP, 80, 20);
    const killedAt = Date.now();
    proxy.child.kill('SIGKILL');
    await proxy.exited;
    proxy = new ProxyProcess(cluster, manifest.file, ARGS);
    const after = await proxy.waitServices((s) => s.length === before?.length, 15_000, 'the new process');
    await raiseFds(proxy.child.pid!);
    await eventually(async () => (await client.tcp(WEB_IP, 80, 300)).ok, {
      what: 'traffic after the restart',
    });
    await new Promise((r) => setTimeout(r, 200));
    const samples = await client.pollStop('restart');
    const { gapMs, failures } = longestGap(samples.filter((s) => s.t >= killedAt - 100));
    const listening = proxy.logTime('Opened service port', { service: 'default/web:p/TCP' });
    t.diagnostic(
      `SIGKILL + restart: longest time without an answer ${gapMs} ms (${failures} failed polls); new listener ` +
        `${listening === undefined ? '?' : listening - killedAt} ms after the kill; same ports: ${JSON.stringify(ports(after)) === JSON.stringify(ports(before))}`,
    );
    assert.deepEqual(ports(after), ports(before), 'the same proxy ports');
    assert.match(proxy.logs.join('\n'), /Ignoring invalid entries of the state file/);
    await eventually(async () => (await rules()).sort().join('\n') === rulesBefore.join('\n'), {
      what: 'the same rules as before the kill, nothing from the hostile entries',
    });
    assert.ok(samples.at(-1)?.ok);
    assert.ok(gapMs < 5000, `gap ${gapMs} ms`);
  });

  await t.test(
    'out of file descriptors (EMFILE): no crash, service resumes when descriptors free up',
    async () => {
      const pid = proxy.child.pid!;
      const open = await fdCount(pid);
      const limit = open + 40;
      await raiseFds(pid, limit);
      const holders = script(pods[0]!.ns, MANY_TCP, {
        host: HOLD_IP,
        port: 80,
        count: 60,
        batch: 60,
        timeoutMs: 3000,
      });
      const held = await holders.wait<{ ok: number; failed: number; closedEarly: number }>('ready', 20_000);
      const alive = proxy.child.exitCode === null && proxy.child.signalCode === null;
      holders.send('close');
      await holders.wait('done');
      const releasedAt = Date.now();
      const resumedMs = await eventually(async () => (await client.tcp(WEB_IP, 80, 500)).ok, {
        intervalMs: 50,
        what: 'service after the descriptors were freed',
      });
      await raiseFds(pid);
      const text = await metrics();
      const exhausted = {
        connect: metric(text, 'kup_fd_exhausted_total', 'operation="connect"'),
        accept: metric(text, 'kup_fd_exhausted_total', 'operation="accept"'),
        shed: metric(text, 'kup_service_connections_rejected_total', 'reason="fd-exhausted"'),
        connectFailures: metric(text, 'kup_service_connect_failures_total', 'reason="fd-exhausted"'),
      };
      t.diagnostic(
        `EMFILE with ${open} open and a limit of ${limit}: of 60 connections ${held.ok} relayed, ` +
          `${held.closedEarly + held.failed} closed at once; proxy alive: ${alive}; counted ${JSON.stringify(exhausted)}; ` +
          `served again ${resumedMs} ms after the descriptors were freed (${Date.now() - releasedAt} ms)`,
      );
      assert.ok(alive, proxy.logTail());
      assert.ok(held.ok < 60, 'descriptors did run out');
      assert.ok(held.ok > 0, 'until they ran out, connections were relayed');
      assert.equal(proxy.child.exitCode, null);
      assert.equal(await healthz().catch(() => 0), 200);
    },
  );

  await t.test('10,000 UDP client ports in a burst: sessions capped, descriptors bounded', async () => {
    const pid = proxy.child.pid!;
    const baseline = await fdCount(pid);
    const rcvbufErrors = async () => {
      const lines = (await sb.exec(node, 'cat', ['/proc/net/snmp'])).stdout
        .split('\n')
        .filter((l) => l.startsWith('Udp:'));
      const [names, values] = lines.map((l) => l.split(/\s+/));
      return Number(values?.[names?.indexOf('RcvbufErrors') ?? -1] ?? 0);
    };
    const dropsBefore = await rcvbufErrors();
    let maxFds = baseline;
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        maxFds = Math.max(maxFds, await fdCount(pid).catch(() => 0));
        await new Promise((r) => setTimeout(r, 10));
      }
    })();
    const burst = script(pods[0]!.ns, UDP_BURST, {
      host: BURST_IP,
      port: 53,
      count: 10_000,
      batch: 1000,
      waitMs: 50,
    });
    const r = await burst.wait<{ sent: number; replies: number; ports: number }>('done', 60_000);
    sampling = false;
    await sampler;
    const text = await metrics();
    const sessions = metric(text, 'kup_udp_sessions');
    const evicted = metric(text, 'kup_udp_sessions_evicted_total');
    const opened = metric(text, 'kup_service_connections_total', 'service="default/burst:p"');
    const dropped = (await rcvbufErrors()) - dropsBefore;
    t.diagnostic(
      `UDP burst: ${r.sent} datagrams from ${r.ports} client ports; ${opened} sessions opened, ${dropped} datagrams ` +
        `dropped by the kernel (receive buffers full), ${r.replies} replies; sessions now ${sessions} (cap ${UDP_TOTAL_CAP}), ` +
        `${evicted} evicted; descriptors ${baseline} before, at most ${maxFds} during`,
    );
    assert.equal(r.sent, 10_000);
    assert.equal(r.ports, 10_000, 'distinct client ports');
    assert.ok(opened > UDP_TOTAL_CAP, `${opened} sessions opened`);
    assert.ok(sessions <= UDP_TOTAL_CAP);
    assert.equal(evicted, opened - sessions, 'every session over the cap evicted one');
    assert.ok(maxFds <= baseline + UDP_TOTAL_CAP + 64, `${maxFds} descriptors`);
    assert.equal(proxy.child.exitCode, null);
  });

  await t.test('5,000 concurrent TCP connections held and relayed', async () => {
    const pid = proxy.child.pid!;
    const started = Date.now();
    const many = script(pods[0]!.ns, MANY_TCP, { host: HOLD_IP, port: 80, count: 5000, batch: 250 });
    const r = await many.wait<{ ok: number; failed: number; closedEarly: number }>('ready', 90_000);
    const tookMs = Date.now() - started;
    const hold = find(await services(), 'hold')!;
    const fds = await fdCount(pid);
    const rss = await rssMB(pid);
    t.diagnostic(
      `5,000 connections: ${r.ok} echoed and held (${r.failed + r.closedEarly} failed) in ${tookMs} ms; ` +
        `proxy: ${hold.connections.active} active, ${fds} descriptors, RSS ${rss} MB`,
    );
    assert.equal(r.ok, 5000);
    assert.equal(hold.connections.active, 5000);
    assert.ok(fds >= 10_000);
    many.send('close');
    await many.wait('done');
    await eventually(async () => find(await services(), 'hold')?.connections.active === 0, {
      timeoutMs: 15_000,
      what: 'every connection closed',
    });
  });

  await t.test(
    'hostile names and annotations: iptables-save shows no rule beyond the expected ones',
    async () => {
      const before = new Set(await rules());
      const before6 = (await sb.exec(node, 'ip6tables-save', [])).stdout;
      await manifest.write([...baseObjects(), ...hostileAllowed()]);
      const running = await proxy.waitServices((s) => s.length === 8, 10_000, 'the hostile Services');
      const evil = running.find((s) => s.service === 'default/evil-annotations:p')!;
      const long = running.find((s) => s.service.startsWith(`${LONG_NS}/`))!;
      assert.ok(evil && long, JSON.stringify(running.map((s) => s.service)));
      // The Service with an endpoint gets its two portal rules; the one without gets a REJECT instead
      // (kube-proxy's filter KUBE-SERVICES). No ACCEPT of their own: the listener port range has one per
      // protocol (a host whose INPUT policy is DROP), in place before they came.
      let added: string[] = [];
      await eventually(
        async () => {
          added = (await rules()).filter((l) => !before.has(l));
          return added.length === 3;
        },
        { what: '3 new rules' },
      ).catch((err: Error) => assert.fail(`${err.message}; got ${JSON.stringify(added)}`));
      const comment = '-m comment --comment "?[A-Za-z0-9._:/ -]{1,255}"?';
      // Each portal in the shard chain of its ClusterIP's lowest 5 bits.
      const portals = added.filter((l) => l.startsWith('-A KUBE-PORTALS-'));
      assert.equal(portals.length, 2, JSON.stringify(added));
      for (const l of portals)
        assert.match(
          l,
          new RegExp(
            `^-A KUBE-PORTALS-(CONTAINER|HOST)-01 -d 10\\.96\\.2\\.1/32 -p tcp ${comment} -m tcp --dport 80 -j (REDIRECT --to-ports ${evil.proxyPort}|DNAT --to-destination 192\\.168\\.50\\.2:${evil.proxyPort})$`,
          ),
        );
      const reject = added.filter((l) => l.startsWith('-A KUBE-SERVICES '));
      assert.equal(reject.length, 1, JSON.stringify(added));
      assert.match(
        reject[0]!,
        new RegExp(`^-A KUBE-SERVICES -d 10\\.96\\.2\\.2/32 -p tcp ${comment} -m tcp --dport 81 -j REJECT`),
      );
      const ranges = [...before].flatMap((l) => {
        const m = /^-A KUBE-NODEPORT-NON-LOCAL -p tcp .*--ctreplsrcport (\d+):(\d+) -j ACCEPT$/.exec(l);
        return m === null ? [] : [[Number(m[1]), Number(m[2])]];
      });
      assert.equal(ranges.length, 1, JSON.stringify([...before]));
      for (const port of [evil.proxyPort, long.proxyPort])
        assert.ok(ranges[0]![0]! <= port && port <= ranges[0]![1]!, `${port} in ${ranges[0]}`);
      assert.equal(
        (await sb.exec(node, 'ip6tables-save', [])).stdout.replace(/^#.*\n/gm, ''),
        before6.replace(/^#.*\n/gm, ''),
      );
      assert.ok((await client.tcp('10.96.2.1', 80)).ok, 'the hostile-but-valid Service works');

      // What validation blocks: the whole file is rejected, the rules stay exactly as they are.
      const withHostile = (await rules()).sort().join('\n');
      let rejected = 0;
      createInterface({ input: proxy.child.stdout! }).on('line', (l) => {
        if (l.includes('"Manifest rejected, keeping the last good state"')) rejected++;
      });
      for (const [i, objects] of hostileRejected().entries()) {
        await manifest.write([...baseObjects(), ...hostileAllowed(), ...objects]);
        await eventually(() => rejected > i, { what: `rejection ${i}` });
      }
      await new Promise((r) => setTimeout(r, 2200)); // a periodic full sync in between
      assert.equal((await rules()).sort().join('\n'), withHostile);
      t.diagnostic(
        `hostile input: 2 hostile-but-valid service ports added exactly 4 rules (comments sanitized, ${long.service.length}-char name cut to 255); ` +
          `${hostileRejected().length} manifests with names, IPs or ports validation blocks were rejected, rules unchanged`,
      );
      await manifest.write(baseObjects());
      await proxy.waitServices((s) => s.length === 6, 10_000, 'back to the base objects');
    },
  );
  await t.test('API server cut, 410 and 500 mid-run: no stale endpoints after recovery', async () => {
    // The manifest proxy makes way: one proxy per node. This one reads a stand-in API server that runs
    // in the node namespace too.
    assert.equal(await proxy.stop(), 0, proxy.logTail());
    const TOKEN = 'kup-secret-token-3f9c2e7d';
    const api = script(node, FAKE_API, {
      module: new URL('../helpers/fake-apiserver.ts', import.meta.url).href,
      token: TOKEN,
    });
    const { kubeconfig } = await api.wait<{ kubeconfig: string }>('ready');
    const IP = '10.96.3.10';
    const ports = [{ name: 'http', protocol: 'TCP', port: PORT.web }];
    const webSlice = (pods: number[]) => ({
      kind: 'EndpointSlice',
      namespace: 'shop',
      name: 'web-1',
      service: 'web',
      endpoints: pods.map(POD_IP),
      ports,
    });
    const spec = {
      clusterIP: IP,
      clusterIPs: [IP],
      ports: [{ name: 'http', protocol: 'TCP', port: 80, targetPort: PORT.web }],
    };
    await api.request('create', { kind: 'Service', namespace: 'shop', name: 'web', spec });
    await api.request('create', webSlice([0, 1]));
    const goneSpec = { ...spec, clusterIP: '10.96.3.11', clusterIPs: ['10.96.3.11'] };
    await api.request('create', { kind: 'Service', namespace: 'shop', name: 'gone', spec: goneSpec });

    const child = sb.spawnIn(node, process.execPath, [
      PROXY_BIN,
      ...e2eProxyArgs(['--kubeconfig', kubeconfig]),
      '--workers=1',
      '--state-file',
      '',
    ]);
    const logs: string[] = [];
    for (const stream of [child.stdout, child.stderr])
      createInterface({ input: stream! }).on('line', (l) => logs.push(l));
    t.after(() => child.kill('SIGKILL'));
    const debug = async () => {
      const r = await nodeAgent.get('http://127.0.0.1:10249/debug/services');
      return JSON.parse(r.body ?? '[]') as DebugServicePort[];
    };
    const web = async () => (await debug()).find((s) => s.service === 'shop/web:http');
    const endpointsAre = async (pods: number[]) =>
      JSON.stringify((await web())?.endpoints) ===
      JSON.stringify(pods.map((i) => `${POD_IP(i)}:${PORT.web}`).sort());
    /** 30 requests through the ClusterIP: which pods answered. */
    const answered = async () => {
      const seen = new Set<string>();
      for (let i = 0; i < 30; i++) seen.add((await client.tcp(IP, 80)).data ?? 'error');
      return [...seen].sort();
    };
    await eventually(() => endpointsAre([0, 1]), {
      timeoutMs: 15_000,
      what: `the first list; ${logs.slice(-5).join('\n')}`,
    });
    await eventually(async () => (await client.tcp(IP, 80, 300)).ok, { what: 'the rules' });

    // Cut: the API server goes away; while it is away the endpoints change and a Service goes.
    await api.request('stop');
    await api.request('update', webSlice([1, 2]));
    await api.request('remove', { kind: 'Service', namespace: 'shop', name: 'gone' });
    await new Promise((r) => setTimeout(r, 500));
    await api.request('restart');
    const afterCut = await eventually(() => endpointsAre([1, 2]), {
      timeoutMs: 20_000,
      what: 'recovery after the cut',
    });
    await eventually(async () => (await debug()).every((s) => s.service !== 'shop/gone:http'), {
      what: 'gone removed',
    });
    assert.deepEqual(await answered(), ['pod1', 'pod2']);

    // 410: the history is gone; the watch resumes from an expired resourceVersion and must relist.
    await api.request('expireHistory');
    await api.request('update', webSlice([2]));
    await api.request('cutWatches');
    const after410 = await eventually(() => endpointsAre([2]), {
      timeoutMs: 20_000,
      what: 'recovery after 410',
    });
    assert.deepEqual(await answered(), ['pod2']);

    // 500: every request fails for a while; the endpoints change meanwhile.
    await api.request('setFailing', { status: 500 });
    await api.request('update', webSlice([0, 2]));
    await api.request('cutWatches');
    await new Promise((r) => setTimeout(r, 1500));
    assert.ok(await endpointsAre([2]), 'unchanged while the API server fails');
    const failedUntil = Date.now();
    await api.request('setFailing', { status: null });
    await eventually(() => endpointsAre([0, 2]), { timeoutMs: 20_000, what: 'recovery after 500s' });
    const after500 = Date.now() - failedUntil;
    assert.deepEqual(await answered(), ['pod0', 'pod2']);
    assert.ok(!(await save()).includes('10.96.3.11'), 'no rule left for the deleted Service');

    const { count } = await api.request<{ count: number }>('requests');
    const text = logs.join('\n');
    t.diagnostic(
      `API server faults: endpoints right ${afterCut} ms after a 500 ms cut, ${after410} ms after a 410, ` +
        `${after500} ms after 1.5 s of 500s; no stale endpoint, Service or rule; ${count} API requests; ` +
        `the bearer token in none of ${logs.length} log lines`,
    );
    assert.ok(!text.includes(TOKEN), 'the bearer token is never logged');
    assert.match(text, /Watch failed, retrying/);
    assert.equal(child.exitCode, null);
  });
});
