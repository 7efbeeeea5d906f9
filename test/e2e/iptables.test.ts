// Real iptables-restore, iptables-save and traffic, each inside network namespaces the test creates.
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { test } from 'node:test';
import { isProxyError } from '../../src/lib/errors.ts';
import { silentLogger } from '../../src/lib/log.ts';
import { JUMPS } from '../../src/netfilter/chains.ts';
import { createIptables, type Iptables, type Run, splitLine } from '../../src/netfilter/iptables.ts';
import { type FamilyConfig, Netfilter } from '../../src/netfilter/netfilter.ts';
import {
  portalRules,
  type RuleContext,
  renderDelta,
  renderRestoreInput,
  restoreText,
} from '../../src/netfilter/rules.ts';
import type { PortalSpec } from '../../src/proxier/portal-programmer.ts';
import type { IPFamily, ServicePortName } from '../../src/state/service-port.ts';
import { createCluster, createSandbox, requireRootOrSkip, type Sandbox } from '../helpers/netns.ts';
import { portal } from '../helpers/portals.ts';

const v4: FamilyConfig = {
  family: 'IPv4',
  bindAddress: '0.0.0.0',
  hostIP: '192.168.50.2',
  nodePortAddresses: [],
};
const v6: FamilyConfig = { family: 'IPv6', bindAddress: '::', hostIP: 'fd00:50::2', nodePortAddresses: [] };

const dns = portal('kube-system', 'kube-dns', 'dns', {
  protocol: 'UDP',
  port: 53,
  clusterIPs: ['10.96.0.10'],
  proxyPort: 40001,
});
const web = portal('default', 'web', 'http', {
  clusterIPs: ['10.96.0.20', 'fd00:96::20'],
  externalIPs: ['203.0.113.7'],
  loadBalancerIPs: ['198.51.100.1', '2001:db8::1'],
  nodePort: 30080,
  proxyPort: 40002,
});
const evil: PortalSpec = (() => {
  const p = portal('default', 'evil', 'x', { clusterIPs: ['10.96.0.66'], nodePort: 30066, proxyPort: 40066 });
  const name = 'default/"ev il"\n-A KUBE-PORTALS-HOST -j ACCEPT\nCOMMIT\n#:' + 'x'.repeat(400);
  return { ...p, servicePort: { ...p.servicePort, name: name as ServicePortName } };
})();
const extra = portal('default', 'extra', 'grpc', {
  clusterIPs: ['10.96.0.30'],
  port: 9090,
  proxyPort: 40003,
});

/** `0A` for shard 10: the shard chains' suffix, spelled out here. */
const hex2 = (k: number) => k.toString(16).toUpperCase().padStart(2, '0');

/** The shard of a canonical IP, computed here: the lowest 5 bits of its last octet or group. */
function shardOf(ip: string): number {
  const last = ip.includes('.')
    ? Number(ip.split('.').at(-1))
    : Number.parseInt(ip.split(':').at(-1) || '0', 16);
  return last & 31;
}

/** What iptables-save prints for the 64 dispatch rules of a family (shard 0 of IPv6 as `::/::1f`). */
function dispatchSaveLines(family: IPFamily): string[] {
  const dst = (k: number) =>
    family === 'IPv6' ? `${k === 0 ? '::' : `::${k.toString(16)}`}/::1f` : `0.0.0.${k}/0.0.0.31`;
  return ['KUBE-PORTALS-CONTAINER', 'KUBE-PORTALS-HOST'].flatMap((chain) =>
    [...Array(32).keys()].map((k) => `-A ${chain} -d ${dst(k)} -j ${chain}-${hex2(k)}`),
  );
}

/** Records every restore so the test can tell full restores from deltas. */
function recording(inner: Iptables): Iptables & { restores: string[] } {
  const restores: string[] = [];
  return {
    restores,
    restore: (family, text) => {
      restores.push(text);
      return inner.restore(family, text);
    },
    save: (f, t) => inner.save(f, t),
    missingJumps: (f) => inner.missingJumps(f),
    cleanup: (f) => inner.cleanup(f),
    flushConntrackUDP: (ip) => inner.flushConntrackUDP(ip),
  };
}

async function saved(sb: Sandbox, ns: string, family: IPFamily): Promise<string> {
  const cmd = family === 'IPv6' ? 'ip6tables-save' : 'iptables-save';
  return (await sb.exec(ns, cmd, [])).stdout;
}

/** Rules in our chains and jumps into them, from iptables-save output, counted per chain. */
function ourRules(save: string): Map<string, number> {
  const counts = new Map<string, number>();
  for (const line of save.split('\n')) {
    const m = /^-A (\S+) (.*)$/.exec(line);
    if (!m) continue;
    const jump = / -j (KUBE-\S+)$/.exec(line);
    const key = m[1]!.startsWith('KUBE-') ? m[1]! : jump ? `${m[1]}->${jump[1]}` : undefined;
    if (key) counts.set(key, (counts.get(key) ?? 0) + 1);
  }
  return counts;
}

/**
 * What the rules of `portals` should leave in iptables-save, counted the same way: the jumps, 32 dispatch
 * rules in each portal chain, KUBE-NODEPORT-NON-LOCAL's RETURN, and each portal rule in the shard chain
 * of its destination (computed here).
 */
function wanted(portals: PortalSpec[], config: FamilyConfig): Map<string, number> {
  const ctx: RuleContext = { ...config, localAddresses: [] };
  const counts = new Map<string, number>([
    ...JUMPS.map((j): [string, number] => [`${j.from}->${j.to}`, 1]),
    ['KUBE-PORTALS-CONTAINER', 32],
    ['KUBE-PORTALS-HOST', 32],
    // Its fixed first rule: RETURN for what no NAT rule sent to a listener.
    ['KUBE-NODEPORT-NON-LOCAL', 1],
  ]);
  for (const p of portals)
    for (const r of portalRules(p, ctx)) {
      const base = /^KUBE-PORTALS-(CONTAINER|HOST)/.exec(r.chain)?.[0];
      const ip = /-d (\S+)\/\d+ /.exec(r.spec)?.[1];
      const chain = base === undefined ? r.chain : `${base}-${hex2(shardOf(ip!))}`;
      counts.set(chain, (counts.get(chain) ?? 0) + 1);
    }
  return counts;
}

test('full restore, delta, repair and cleanup with the real iptables in a namespace', async (t) => {
  if (!requireRootOrSkip(t)) return;
  const sb = await createSandbox(t);
  const ns = await sb.createNamespace('rules');
  const iptables = recording(createIptables(sb.run(ns)));
  const nf = new Netfilter({ iptables, log: silentLogger(), families: [v4, v6] });
  const check = async (portals: PortalSpec[], what: string) => {
    assert.deepEqual(ourRules(await saved(sb, ns, 'IPv4')), wanted(portals, v4), `IPv4 ${what}`);
    assert.deepEqual(ourRules(await saved(sb, ns, 'IPv6')), wanted(portals, v6), `IPv6 ${what}`);
  };

  await t.test('first sync: full restore, jumps in their positions, hostile comment contained', async () => {
    await nf.sync([dns, web, evil], { full: false });
    await check([dns, web, evil], 'after the first sync');
    const save = await saved(sb, ns, 'IPv4');
    assert.match(
      save,
      /\n-A KUBE-PORTALS-CONTAINER-0A -d 10\.96\.0\.10\/32 -p udp -m comment --comment "?kube-system\/kube-dns:dns"? -m udp --dport 53 -j REDIRECT --to-ports 40001\n/,
    );
    assert.match(
      save,
      /\n-A KUBE-PORTALS-HOST-14 -d 10\.96\.0\.20\/32 .* -j DNAT --to-destination 192\.168\.50\.2:40002\n/,
    );
    // The portal chains hold only the dispatch rules, in shard order.
    const dispatch = (text: string, chain: string) =>
      text.split('\n').filter((l) => l.startsWith(`-A ${chain} `));
    for (const chain of ['KUBE-PORTALS-CONTAINER', 'KUBE-PORTALS-HOST'])
      assert.deepEqual(
        dispatch(save, chain),
        dispatchSaveLines('IPv4').filter((l) => l.startsWith(`-A ${chain} `)),
      );
    const prerouting = save.split('\n').filter((l) => l.startsWith('-A PREROUTING'));
    assert.match(prerouting[0] ?? '', /-j KUBE-PORTALS-CONTAINER$/, 'portal jump first');
    assert.match(
      prerouting.at(-1) ?? '',
      /-m addrtype --dst-type LOCAL .*-j KUBE-NODEPORT-CONTAINER$/,
      'NodePort jump last',
    );
    assert.doesNotMatch(save, /-A KUBE-PORTALS-HOST -j ACCEPT/);
    const v6save = await saved(sb, ns, 'IPv6');
    assert.match(
      v6save,
      /\n-A KUBE-PORTALS-HOST-00 -d fd00:96::20\/128 .* -j DNAT --to-destination \[fd00:50::2\]:40002\n/,
    );
    // 2001:db8::1 (the LB IP) is in shard 1.
    assert.match(
      v6save,
      /\n-A KUBE-PORTALS-CONTAINER-01 -d 2001:db8::1\/128 .* -j REDIRECT --to-ports 40002\n/,
    );
    for (const chain of ['KUBE-PORTALS-CONTAINER', 'KUBE-PORTALS-HOST'])
      assert.deepEqual(
        dispatch(v6save, chain),
        dispatchSaveLines('IPv6').filter((l) => l.startsWith(`-A ${chain} `)),
      );
    assert.doesNotMatch(v6save, /10\.96\./);
  });

  await t.test('a one-service change is a delta of a few lines', async () => {
    iptables.restores.length = 0;
    await nf.sync([web, evil, extra], { full: false });
    await check([web, evil, extra], 'after the delta');
    assert.equal(iptables.restores.length, 1, 'IPv6 has nothing to change');
    const delta = iptables.restores[0] ?? '';
    assert.doesNotMatch(delta, /^:/m, 'a delta never flushes a chain');
    // kube-dns (10.96.0.10) leaves shard 0A, extra (10.96.0.30) joins shard 1E; no dispatch rule moves.
    assert.deepEqual(
      delta
        .split('\n')
        .filter((l) => l.startsWith('-'))
        .map((l) => l.split(' ').slice(0, 2).join(' ')),
      [
        '-D KUBE-PORTALS-CONTAINER-0A',
        '-D KUBE-PORTALS-HOST-0A',
        '-A KUBE-PORTALS-CONTAINER-1E',
        '-A KUBE-PORTALS-HOST-1E',
        // kube-dns's ACCEPT goes, extra's comes.
        '-D KUBE-NODEPORT-NON-LOCAL',
        '-A KUBE-NODEPORT-NON-LOCAL',
      ],
    );
    assert.doesNotMatch(await saved(sb, ns, 'IPv4'), /kube-dns/);
  });

  await t.test('rules and jumps removed by hand are repaired', async () => {
    const jump = [
      '-m',
      'comment',
      '--comment',
      'handle ClusterIPs; NOTE: this must be before the NodePort rules',
    ];
    // Jump gone and chain flushed: a plain delta does not look (the periodic full sync would repair it);
    // a delta asked to check the jumps finds it missing and restores everything.
    await sb.exec(ns, 'iptables', [
      '-w',
      '-t',
      'nat',
      '-D',
      'PREROUTING',
      ...jump,
      '-j',
      'KUBE-PORTALS-CONTAINER',
    ]);
    await sb.exec(ns, 'iptables', ['-w', '-t', 'nat', '-F', 'KUBE-PORTALS-CONTAINER']);
    const kinds = () => iptables.restores.splice(0).map((r) => (/^:KUBE-/m.test(r) ? 'full' : 'delta'));
    kinds();
    await nf.sync([web, evil, extra], { full: false, checkJumps: true });
    await check([web, evil, extra], 'after repairing a missing jump');
    assert.deepEqual(kinds(), ['full'], 'IPv4 found its jump missing; IPv6 had nothing to do');
    // Only rules flushed: the delta's -D of a flushed rule (extra's, in shard 1E) fails, and the same
    // sync restores everything, the dispatch rules too.
    await sb.exec(ns, 'iptables', ['-w', '-t', 'nat', '-F', 'KUBE-PORTALS-HOST']);
    await sb.exec(ns, 'iptables', ['-w', '-t', 'nat', '-F', 'KUBE-PORTALS-HOST-1E']);
    await nf.sync([web, evil], { full: false });
    await check([web, evil], 'after a failed delta');
    assert.deepEqual(kinds(), ['delta', 'full']);
    // Nothing that a delta would touch (the dispatch rules among it): the periodic full sync repairs it.
    await sb.exec(ns, 'iptables', ['-w', '-t', 'filter', '-F', 'KUBE-NODEPORT-NON-LOCAL']);
    await sb.exec(ns, 'ip6tables', ['-w', '-t', 'nat', '-F', 'KUBE-NODEPORT-HOST']);
    await sb.exec(ns, 'ip6tables', ['-w', '-t', 'nat', '-F', 'KUBE-PORTALS-CONTAINER']);
    await nf.sync([web, evil], { full: true });
    await nf.sync([web, evil], { full: true });
    await check([web, evil], 'after full syncs (jumps not duplicated)');
  });

  await t.test('a rejected restore names the failing line', async () => {
    const text = '*nat\n:KUBE-PORTALS-HOST - [0:0]\n-A KUBE-PORTALS-HOST -j NO-SUCH-CHAIN\nCOMMIT\n';
    await assert.rejects(iptables.restore('IPv4', text), (err) => {
      assert.ok(isProxyError(err, 'KUP_ERR_IPTABLES_RESTORE'));
      // Which line depends on the backend: legacy names the rule, nf_tables the COMMIT.
      assert.match(err.message, /NO-SUCH-CHAIN/);
      assert.match(
        err.message,
        /failing line \d+ of the input:\n(.*\n)*[> ] 3: -A KUBE-PORTALS-HOST -j NO-SUCH-CHAIN\n/,
      );
      return true;
    });
    await check([web, evil], 'after a rejected restore (nothing applied)');
  });

  await t.test('cleanup leaves no KUBE- chain and is safe twice, also shards of another count', async () => {
    // What a version with 64 shards would have left besides ours: shard chains we never declare.
    await sb.exec(ns, 'iptables', ['-w', '-t', 'nat', '-N', 'KUBE-PORTALS-CONTAINER-3F']);
    await sb.exec(ns, 'iptables', [
      ...['-w', '-t', 'nat', '-A', 'KUBE-PORTALS-CONTAINER'],
      ...['-d', '0.0.0.63/0.0.0.63', '-j', 'KUBE-PORTALS-CONTAINER-3F'],
    ]);
    await sb.exec(ns, 'ip6tables', ['-w', '-t', 'nat', '-N', 'KUBE-PORTALS-HOST-20']);
    await sb.exec(ns, 'ip6tables', [
      ...['-w', '-t', 'nat', '-A', 'KUBE-PORTALS-HOST'],
      ...['-d', '::20/::3f', '-j', 'KUBE-PORTALS-HOST-20'],
    ]);
    await nf.cleanup();
    for (const family of ['IPv4', 'IPv6'] as const) assert.doesNotMatch(await saved(sb, ns, family), /KUBE-/);
    await nf.cleanup();
    const clean = await sb.createNamespace('clean');
    await createIptables(sb.run(clean)).cleanup('IPv4');
    assert.doesNotMatch(await saved(sb, clean, 'IPv4'), /KUBE-/);
  });
});

/** A ClusterIP in shard `k` whose other bits vary with `m`: last octet 32·(1..6) + k, never .0 or .255. */
function spreadIPv4(k: number, m: number): string {
  return `10.${97 + m}.${k}.${32 * (((k + m) % 6) + 1) + k}`;
}
/** An IPv6 ClusterIP in shard `k`: last group 0x20·(1..6) + k, so only its lowest 5 bits name the shard. */
function spreadIPv6(k: number, m: number): string {
  return `fd00:${97 + m}::${k.toString(16)}:${(32 * (((k + m) % 6) + 1) + k).toString(16)}`;
}

test('portals spread over all 32 shards land in the shard chain of their IP; cleanup removes every chain', async (t) => {
  if (!requireRootOrSkip(t)) return;
  const sb = await createSandbox(t);
  const ns = await sb.createNamespace('shards');
  const iptables = recording(createIptables(sb.run(ns)));
  const nf = new Netfilter({ iptables, log: silentLogger(), families: [v4, v6] });
  // Two dual-stack services per shard, whose IPs differ in every bit but the shard bits.
  const shardOfSvc = new Map<string, number>();
  const portals: PortalSpec[] = [];
  for (let k = 0; k < 32; k++)
    for (const m of [0, 1]) {
      const p = portal('shards', `s${k}-${m}`, 'p', {
        clusterIPs: [spreadIPv4(k, m), spreadIPv6(k, m)],
        proxyPort: 41000 + 2 * k + m,
      });
      shardOfSvc.set(p.servicePort.name, k);
      portals.push(p);
    }

  /** Checks every portal rule's chain against its IP, and every shard's rule count. */
  const check = async (live: PortalSpec[], what: string) => {
    const want = new Set<string>(live.map((p) => p.servicePort.name));
    for (const family of ['IPv4', 'IPv6'] as const) {
      const save = await saved(sb, ns, family);
      const lines = save.split('\n');
      for (const line of dispatchSaveLines(family))
        assert.ok(lines.includes(line), `${family} ${what}: ${line}`);
      const perChain = new Map<string, number>();
      const seen = new Map<string, number>();
      for (const line of lines.filter((l) => /^-A KUBE-PORTALS-(CONTAINER|HOST)-/.test(l))) {
        const args = splitLine(line);
        const chain = args[1]!;
        const name = args[args.indexOf('--comment') + 1]!;
        const ip = args[args.indexOf('-d') + 1]!.replace(/\/\d+$/, '');
        const k = shardOfSvc.get(name);
        assert.ok(k !== undefined && want.has(name), `${family} ${what}: unexpected ${line}`);
        assert.equal(shardOf(ip), k, `${family} ${what}: ${line}`);
        assert.equal(chain.slice(-3), `-${hex2(k)}`, `${family} ${what}: ${line} is not in shard ${hex2(k)}`);
        perChain.set(chain, (perChain.get(chain) ?? 0) + 1);
        seen.set(name, (seen.get(name) ?? 0) + 1);
      }
      // A container and a host rule for each live service, and nothing else in the shards.
      assert.deepEqual([...seen.keys()].sort(), [...want].sort(), `${family} ${what}`);
      for (const [name, n] of seen) assert.equal(n, 2, `${family} ${what}: ${name}`);
      for (const [chain, n] of perChain) {
        const k = Number.parseInt(chain.slice(-2), 16);
        const expected = live.filter((p) => shardOfSvc.get(p.servicePort.name) === k).length;
        assert.equal(n, expected, `${family} ${what}: ${chain}`);
      }
    }
  };

  await nf.sync(portals, { full: true });
  await check(portals, 'after the full restore');
  // Every one of the 64 shard chains of each family holds exactly two rules (one per service).
  for (const family of ['IPv4', 'IPv6'] as const) {
    const counts = ourRules(await saved(sb, ns, family));
    for (const side of ['CONTAINER', 'HOST'])
      for (let k = 0; k < 32; k++)
        assert.equal(counts.get(`KUBE-PORTALS-${side}-${hex2(k)}`), 2, `${family} ${side} ${k}`);
  }

  // A delta that empties shard 1F and adds to shard 00 touches only those shard chains.
  iptables.restores.length = 0;
  const extra = portal('shards', 'late', 'p', {
    clusterIPs: [spreadIPv4(0, 2), spreadIPv6(0, 2)],
    proxyPort: 41999,
  });
  shardOfSvc.set(extra.servicePort.name, 0);
  const next = [...portals.filter((p) => shardOfSvc.get(p.servicePort.name) !== 31), extra];
  await nf.sync(next, { full: false });
  assert.equal(iptables.restores.length, 2, 'one delta per family');
  for (const delta of iptables.restores) {
    const chains = new Set(
      delta
        .split('\n')
        .filter((l) => l.startsWith('-'))
        .map((l) => l.split(' ').slice(0, 2).join(' ')),
    );
    assert.deepEqual(
      chains,
      new Set([
        '-D KUBE-PORTALS-CONTAINER-1F',
        '-D KUBE-PORTALS-HOST-1F',
        '-A KUBE-PORTALS-CONTAINER-00',
        '-A KUBE-PORTALS-HOST-00',
        '-D KUBE-NODEPORT-NON-LOCAL',
        '-A KUBE-NODEPORT-NON-LOCAL',
      ]),
    );
  }
  await check(next, 'after the delta');

  await nf.cleanup();
  for (const family of ['IPv4', 'IPv6'] as const) assert.doesNotMatch(await saved(sb, ns, family), /KUBE-/);
});

const SERVER = `
const net = require('node:net'), dgram = require('node:dgram');
net.createServer((s) => s.end(JSON.stringify({ local: s.localAddress + ':' + s.localPort, remote: s.remoteAddress })))
  .listen(40080, '0.0.0.0', () => {
    const u = dgram.createSocket('udp4');
    u.on('message', (m, r) => u.send('pong:' + m, r.port, r.address));
    u.bind(40053, '0.0.0.0', () => console.log('ready'));
  });
`;

function tcpClient(host: string, port: number, timeoutMs = 3000): string {
  return `
const s = require('node:net').connect({ host: ${JSON.stringify(host)}, port: ${port} });
let d = '';
s.setTimeout(${timeoutMs}, () => { console.error('timeout'); process.exit(2); });
s.on('data', (c) => (d += c)).on('end', () => process.stdout.write(d)).on('error', (e) => { console.error(e.message); process.exit(3); });
`;
}

function udpClient(host: string, port: number): string {
  return `
const u = require('node:dgram').createSocket('udp4');
setTimeout(() => { console.error('timeout'); process.exit(2); }, 3000).unref();
// A connected socket only accepts replies from ${host}: a reply proves conntrack un-NATed it.
u.connect(${port}, ${JSON.stringify(host)}, () => u.send('ping'));
u.on('message', (m) => { process.stdout.write(String(m)); u.close(); });
`;
}

/** Connects to port 80 of every host at once; prints the local address each server saw (or the error). */
function tcpClients(hosts: string[]): string {
  return `
const net = require('node:net');
const one = (host) => new Promise((resolve) => {
  const s = net.connect({ host, port: 80 });
  let d = '';
  s.setTimeout(3000, () => { s.destroy(); resolve(host + ': timeout'); });
  s.on('data', (c) => (d += c)).on('end', () => resolve(d === '' ? host + ': empty' : JSON.parse(d).local));
  s.on('error', (e) => resolve(host + ': ' + e.message));
});
Promise.all(${JSON.stringify(hosts)}.map(one)).then((r) => process.stdout.write(JSON.stringify(r)));
`;
}

/** Packets counted by the rule for `-d ip/32` in each chain (`iptables-save -c`). */
function packetsByChain(save: string, ip: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of save.split('\n')) {
    const m = /^\[(\d+):\d+\] -A (\S+) (.*)$/.exec(line);
    if (m && m[3]!.includes(`-d ${ip}/32 `)) out.set(m[2]!, (out.get(m[2]!) ?? 0) + Number(m[1]));
  }
  return out;
}

async function waitForLine(child: ChildProcess, want: string, ms: number): Promise<void> {
  await new Promise<void>((resolve, reject) => {
    let out = '';
    let err = '';
    const timer = setTimeout(() => reject(new Error(`no "${want}" within ${ms} ms: ${err}`)), ms);
    child.stderr?.on('data', (d) => (err += d));
    child.stdout?.on('data', (d) => {
      out += d;
      if (out.includes(want)) {
        clearTimeout(timer);
        resolve();
      }
    });
    child.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`server exited with ${code}: ${err}`));
    });
  });
}

test('traffic: pod to ClusterIP via REDIRECT, node to ClusterIP via DNAT, NodePort, UDP', async (t) => {
  if (!requireRootOrSkip(t)) return;
  const sb = await createSandbox(t);
  const cluster = await createCluster(sb, { pods: 1 });
  const pod = cluster.pods[0]!;
  const iptables = createIptables(sb.run(cluster.node));
  const nf = new Netfilter({
    iptables,
    log: silentLogger(),
    families: [{ ...v4, hostIP: cluster.nodeIP }],
  });
  const server = sb.spawnIn(cluster.node, process.execPath, ['-e', SERVER]);
  await waitForLine(server, 'ready', 10_000);
  // One ClusterIP in each of the 32 shards, all to the same listener: every dispatch rule carries traffic.
  const spread = [...Array(32).keys()].map((k) => spreadIPv4(k, 5));
  await nf.sync(
    [
      ...spread.map((ip, k) =>
        portal('default', `shard-${k}`, 'http', { clusterIPs: [ip], proxyPort: 40080 }),
      ),
      portal('default', 'web', 'http', {
        clusterIPs: ['10.96.0.20'],
        port: 80,
        nodePort: 30080,
        proxyPort: 40080,
      }),
      portal('kube-system', 'dns', 'dns', {
        protocol: 'UDP',
        clusterIPs: ['10.96.0.10'],
        port: 53,
        proxyPort: 40053,
      }),
    ],
    { full: true },
  );
  const node = (await import('node:process')).execPath;
  const get = async (ns: string, script: string) => (await sb.exec(ns, node, ['-e', script])).stdout;

  // REDIRECT delivers to the primary address of the interface the packet came in on: the bridge.
  assert.deepEqual(JSON.parse(await get(pod.ns, tcpClient('10.96.0.20', 80))), {
    local: `${cluster.bridgeIP}:40080`,
    remote: pod.ip,
  });
  // The node's own traffic is DNATed to the node IP, never to 127.0.0.1.
  assert.deepEqual(JSON.parse(await get(cluster.node, tcpClient('10.96.0.20', 80))), {
    local: `${cluster.nodeIP}:40080`,
    remote: cluster.nodeIP,
  });
  assert.equal(
    JSON.parse(await get(pod.ns, tcpClient(cluster.bridgeIP, 30080))).local,
    `${cluster.bridgeIP}:40080`,
  );
  assert.equal(
    JSON.parse(await get(cluster.node, tcpClient(cluster.nodeIP, 30080))).local,
    `${cluster.nodeIP}:40080`,
  );
  assert.equal(await get(pod.ns, udpClient('10.96.0.10', 53)), 'pong:ping');

  // Pod and node to the ClusterIPs of all 32 shards: each answered through the rule in its own shard chain.
  assert.deepEqual(
    JSON.parse(await get(pod.ns, tcpClients(spread))),
    spread.map(() => `${cluster.bridgeIP}:40080`),
  );
  assert.deepEqual(
    JSON.parse(await get(cluster.node, tcpClients(spread))),
    spread.map(() => `${cluster.nodeIP}:40080`),
  );
  const counted = (await sb.exec(cluster.node, 'iptables-save', ['-c', '-t', 'nat'])).stdout;
  for (const [k, ip] of spread.entries()) {
    const packets = packetsByChain(counted, ip);
    assert.deepEqual([...packets.keys()].sort(), [
      `KUBE-PORTALS-CONTAINER-${hex2(k)}`,
      `KUBE-PORTALS-HOST-${hex2(k)}`,
    ]);
    for (const [chain, n] of packets) assert.ok(n > 0, `${ip}: the rule in ${chain} counted no packet`);
  }
  // The web ClusterIP 10.96.0.20 (shard 14) too, through its container rule (pod) and host rule (node).
  const web = packetsByChain(counted, '10.96.0.20');
  assert.ok(
    (web.get('KUBE-PORTALS-CONTAINER-14') ?? 0) > 0 && (web.get('KUBE-PORTALS-HOST-14') ?? 0) > 0,
    JSON.stringify([...web]),
  );

  // The UDP flow above left a conntrack entry; flushing twice is fine ("0 flow entries" the second time).
  await iptables.flushConntrackUDP('10.96.0.10');
  const left = await sb.run(cluster.node)('conntrack', ['-L', '--orig-dst', '10.96.0.10', '-p', 'udp']);
  assert.doesNotMatch(left.stdout, /10\.96\.0\.10/);
  await iptables.flushConntrackUDP('10.96.0.10');

  // Once the rules are gone, the ClusterIP leads nowhere (the node does not forward: a timeout).
  await nf.cleanup();
  const after = await sb.run(pod.ns)(node, ['-e', tcpClient('10.96.0.20', 80, 300)]);
  assert.equal(after.code, 2, after.stderr);
});

/** A `Run` that calls the legacy backend's binaries under the usual names. */
function legacy(run: Run): Run {
  return (cmd, args, stdin) =>
    run(cmd.replace(/^(ip6?tables)(-restore|-save)?$/, '$1-legacy$2'), args, stdin);
}

const none = { any: false, cluster: false, local: false };
const podDetector = { ifLocal: '-s 10.244.0.0/16', ifNotLocal: '! -s 10.244.0.0/16' };
/** Every kind of rule of issue 13, in both families. */
const policyPortals: PortalSpec[] = [
  portal('default', 'etp', 'http', {
    clusterIPs: ['10.96.1.1', 'fd00:96::1:1'],
    loadBalancerIPs: ['198.51.100.7', '2001:db8::7'],
    externalIPs: ['203.0.113.8'],
    loadBalancerSourceRanges: ['10.0.0.0/8', '192.168.0.0/16', '2001:db8::/32'],
    nodePort: 30081,
    healthCheckNodePort: 32001,
    externalPolicyLocal: true,
    proxyPort: 40011,
    localProxyPort: 40012,
    endpoints: { local: true },
    IPv6: { local: false },
  }),
  portal('default', 'gone', 'http', {
    clusterIPs: ['10.96.1.2', 'fd00:96::1:2'],
    externalIPs: ['203.0.113.9', '2001:db8::9'],
    loadBalancerIPs: ['198.51.100.9'],
    loadBalancerSourceRanges: ['203.0.113.0/24'],
    nodePort: 30082,
    proxyPort: 40013,
    endpoints: none,
  }),
  portal('default', 'itp', 'dns', {
    protocol: 'UDP',
    clusterIPs: ['10.96.1.3'],
    port: 53,
    internalPolicyLocal: true,
    proxyPort: 40014,
    endpoints: { cluster: false, local: false },
  }),
];

for (const backend of ['nft', 'legacy'] as const) {
  test(`policy rules (${backend}): full restores and 0↔N deltas accepted by the real iptables-restore, cleanup removes all`, async (t) => {
    if (!requireRootOrSkip(t)) return;
    const sb = await createSandbox(t);
    const ns = await sb.createNamespace(`policy-${backend}`);
    const base = sb.run(ns);
    const run = backend === 'legacy' ? legacy(base) : base;
    const probe = await run('iptables-restore', ['--version']);
    if (probe.code === 127) {
      t.skip(`iptables ${backend} not installed`);
      return;
    }
    const iptables = createIptables(run);
    const nf = new Netfilter({
      iptables,
      log: silentLogger(),
      families: [v4, v6],
      localDetector: (family) => (family === 'IPv4' ? podDetector : undefined),
    });
    await nf.sync(policyPortals, { full: true });
    for (const [family, config] of [
      ['IPv4', v4],
      ['IPv6', v6],
    ] as const) {
      const save = await iptables.save(family, 'filter');
      const ctx: RuleContext = {
        ...config,
        localAddresses: [],
        localDetector: family === 'IPv4' ? podDetector : undefined,
      };
      // Every rendered rule is in place, counted per chain as iptables-save prints them back.
      const rendered = restoreText(renderRestoreInput({ ...ctx, portals: policyPortals }));
      const count = (text: string, chain: string) =>
        text.split('\n').filter((l) => l.startsWith(`-A ${chain} `)).length;
      for (const chain of [
        'KUBE-SERVICES',
        'KUBE-EXTERNAL-SERVICES',
        'KUBE-PROXY-FIREWALL',
        'KUBE-NODEPORTS',
        'KUBE-NODEPORT-NON-LOCAL',
      ])
        assert.equal(count(save, chain), count(rendered, chain), `${backend} ${family} ${chain}`);
      const nat = await iptables.save(family, 'nat');
      assert.equal(
        count(nat, 'KUBE-NODEPORT-CONTAINER') + count(nat, 'KUBE-NODEPORT-HOST'),
        count(rendered, 'KUBE-NODEPORT-CONTAINER') + count(rendered, 'KUBE-NODEPORT-HOST'),
      );
      // The filter jumps: DROP/REJECT chains first, then the ACCEPTs.
      const input = save
        .split('\n')
        .filter((l) => l.startsWith('-A INPUT '))
        .map((l) => l.split(' -j ')[1]);
      assert.deepEqual(input, [
        'KUBE-PROXY-FIREWALL',
        'KUBE-EXTERNAL-SERVICES',
        'KUBE-NODEPORTS',
        'KUBE-NODEPORT-NON-LOCAL',
      ]);
    }
    assert.match(await iptables.save('IPv4', 'filter'), /"default\/gone:http has no endpoints".* -j REJECT/);
    assert.match(
      await iptables.save('IPv6', 'filter'),
      /"default\/etp:http has no local endpoints".* -j DROP/,
    );
    // Endpoints come (0 → N) and go (N → 0), ETP Local's local ones too: deltas, then full again.
    const flip = (p: PortalSpec): PortalSpec =>
      p.endpoints.IPv4.any
        ? { ...p, endpoints: { IPv4: none, IPv6: none } }
        : {
            ...p,
            endpoints: {
              IPv4: { any: true, cluster: true, local: true },
              IPv6: { any: true, cluster: true, local: true },
            },
          };
    const steps = [policyPortals.map(flip), policyPortals, policyPortals.map(flip)];
    let prev = policyPortals;
    for (const next of steps) {
      assert.notEqual(
        restoreText(renderDelta(prev, next, { ...v4, localAddresses: [], localDetector: podDetector })),
        '',
      );
      await nf.sync(next, { full: false });
      assert.ok(!nf.needsFullSync('IPv4') && !nf.needsFullSync('IPv6'), 'the deltas applied');
      prev = next;
    }
    await nf.cleanup();
    for (const family of ['IPv4', 'IPv6'] as const)
      for (const table of ['nat', 'filter'] as const)
        assert.doesNotMatch(await iptables.save(family, table), /KUBE-/, `${backend} ${family} ${table}`);
  });
}

test('traffic with INPUT policy DROP: DNATed traffic passes, no endpoints is refused at once, source ranges drop', async (t) => {
  if (!requireRootOrSkip(t)) return;
  const sb = await createSandbox(t);
  const cluster = await createCluster(sb, { pods: 1 });
  const pod = cluster.pods[0]!;
  await sb.exec(cluster.node, 'sysctl', ['-qw', 'net.ipv4.ip_forward=1']);
  await sb.exec(cluster.node, 'iptables', ['-w', '-P', 'INPUT', 'DROP']);
  // ICMP errors for the node's own connections come back through INPUT: let them in, as every host with
  // a DROP policy does (TCP replies are not let in: our ACCEPTs must pass those).
  await sb.exec(cluster.node, 'iptables', [
    ...['-w', '-A', 'INPUT', '-p', 'icmp', '-m', 'conntrack', '--ctstate', 'RELATED', '-j', 'ACCEPT'],
  ]);
  const iptables = createIptables(sb.run(cluster.node));
  const nf = new Netfilter({ iptables, log: silentLogger(), families: [{ ...v4, hostIP: cluster.nodeIP }] });
  const server = sb.spawnIn(cluster.node, process.execPath, ['-e', SERVER]);
  await waitForLine(server, 'ready', 10_000);
  const served = portal('default', 'web', 'http', {
    clusterIPs: ['10.96.0.20'],
    nodePort: 30080,
    proxyPort: 40080,
  });
  const gone = portal('default', 'gone', 'http', {
    clusterIPs: ['10.96.0.21'],
    nodePort: 30081,
    proxyPort: 40081,
    endpoints: none,
  });
  const ranges = (r: string[]) =>
    portal('default', 'lb', 'http', {
      clusterIPs: ['10.96.0.22'],
      loadBalancerIPs: ['198.51.100.1'],
      loadBalancerSourceRanges: r,
      proxyPort: 40080,
    });
  await nf.sync([served, gone, ranges(['203.0.113.0/24'])], { full: true });
  const node = process.execPath;
  const get = async (ns: string, script: string) => sb.run(ns)(node, ['-e', script]);

  // The INPUT policy drops everything else, yet the pod and the node reach the proxy port.
  assert.equal(
    JSON.parse((await get(pod.ns, tcpClient('10.96.0.20', 80))).stdout).local,
    `${cluster.bridgeIP}:40080`,
  );
  assert.equal(
    JSON.parse((await get(pod.ns, tcpClient(cluster.bridgeIP, 30080))).stdout).local,
    `${cluster.bridgeIP}:40080`,
  );
  assert.equal(
    JSON.parse((await get(cluster.node, tcpClient('10.96.0.20', 80))).stdout).local,
    `${cluster.nodeIP}:40080`,
  );
  // No endpoints: refused at once (REJECT), from the pod (FORWARD), the node (OUTPUT), to the NodePort (INPUT).
  for (const [ns, host, port] of [
    [pod.ns, '10.96.0.21', 80],
    [cluster.node, '10.96.0.21', 80],
    [pod.ns, cluster.bridgeIP, 30081],
  ] as const) {
    const started = Date.now();
    const r = await get(ns, tcpClient(host, port, 2000));
    assert.equal(r.code, 3, `${host}:${port}: ${r.stderr}`);
    assert.match(r.stderr, /ECONNREFUSED/);
    assert.ok(Date.now() - started < 1500, `${host}:${port} refused in ${Date.now() - started} ms`);
  }
  // The pod (10.244.0.10) is outside the LB's source ranges: not NATed, dropped by KUBE-PROXY-FIREWALL.
  const denied = await get(pod.ns, tcpClient('198.51.100.1', 80, 500));
  assert.equal(denied.code, 2, denied.stderr);
  // Its range allowed (a delta): served.
  await nf.sync([served, gone, ranges(['10.244.0.0/24'])], { full: false });
  assert.equal(
    JSON.parse((await get(pod.ns, tcpClient('198.51.100.1', 80))).stdout).local,
    `${cluster.bridgeIP}:40080`,
  );
  // Endpoints back for `gone` (0 → N, a delta): its ClusterIP is served.
  await nf.sync(
    [
      served,
      {
        ...gone,
        proxyPort: 40080,
        endpoints: { IPv4: { any: true, cluster: true, local: false }, IPv6: none },
      },
      ranges(['10.244.0.0/24']),
    ],
    { full: false },
  );
  assert.equal(
    JSON.parse((await get(pod.ns, tcpClient('10.96.0.21', 80))).stdout).local,
    `${cluster.bridgeIP}:40080`,
  );
  await nf.cleanup();
});

test('KUBE-NODEPORT-NON-LOCAL: a packet no NAT rule sent to a listener leaves at the first rule, after full syncs and deltas', async (t) => {
  if (!requireRootOrSkip(t)) return;
  const sb = await createSandbox(t);
  const cluster = await createCluster(sb, { pods: 1 });
  const pod = cluster.pods[0]!;
  await sb.exec(cluster.node, 'sysctl', ['-qw', 'net.ipv4.ip_forward=1']);
  const iptables = createIptables(sb.run(cluster.node));
  const nf = new Netfilter({ iptables, log: silentLogger(), families: [{ ...v4, hostIP: cluster.nodeIP }] });
  const server = sb.spawnIn(cluster.node, process.execPath, ['-e', SERVER]);
  await waitForLine(server, 'ready', 10_000);
  // Many listeners: INPUT jumps to the chain for every packet, which walked one ACCEPT per listener.
  const many = [...Array(200).keys()].map((i) =>
    portal('default', `s${i}`, 'http', { clusterIPs: [`10.96.1.${i + 1}`], proxyPort: 41000 + i }),
  );
  const served = portal('default', 'web', 'http', { clusterIPs: ['10.96.0.20'], proxyPort: 40080 });
  await nf.sync([...many, served], { full: true });
  await nf.sync([...many.slice(1), served], { full: false });
  const chain = (await sb.run(cluster.node)('iptables', ['-w', '-S', 'KUBE-NODEPORT-NON-LOCAL'])).stdout
    .split('\n')
    .filter((l) => l.startsWith('-A '));
  assert.equal(chain[0], '-A KUBE-NODEPORT-NON-LOCAL -m conntrack ! --ctstate DNAT -j RETURN');
  assert.equal(chain.length, 1 + 200, 'the RETURN, then one ACCEPT per listener left');

  const node = process.execPath;
  const get = async (ns: string, script: string) => sb.run(ns)(node, ['-e', script]);
  // Through the ClusterIP: DNAT, its ACCEPT counts; straight to the listener on the node IP: no NAT, the
  // RETURN counts and no ACCEPT does.
  assert.equal(
    JSON.parse((await get(pod.ns, tcpClient('10.96.0.20', 80))).stdout).local,
    `${cluster.bridgeIP}:40080`,
  );
  const counted = async () => {
    const save = (await sb.run(cluster.node)('iptables-save', ['-c', '-t', 'filter'])).stdout;
    const pkts = (re: RegExp) =>
      save
        .split('\n')
        .filter((l) => re.test(l))
        .reduce((n, l) => n + Number(/^\[(\d+):/.exec(l)?.[1] ?? 0), 0);
    return {
      returns: pkts(/-A KUBE-NODEPORT-NON-LOCAL -m conntrack ! --ctstate DNAT -j RETURN/),
      accepts: pkts(/-A KUBE-NODEPORT-NON-LOCAL .* -j ACCEPT/),
    };
  };
  const before = await counted();
  assert.ok(before.accepts > 0, 'the DNATed connection was accepted by its rule');
  await get(pod.ns, tcpClient(cluster.bridgeIP, 40080));
  const after = await counted();
  assert.ok(after.returns > before.returns, `RETURN counted ${before.returns} → ${after.returns}`);
  assert.equal(after.accepts, before.accepts, 'no ACCEPT saw the packets no NAT rule sent');
  await nf.cleanup();
});

test('KUBE-NODEPORT-NON-LOCAL with a listener port range: one ACCEPT per protocol for the range, DNATed traffic passes under INPUT policy DROP, deltas leave the filter table alone', async (t) => {
  if (!requireRootOrSkip(t)) return;
  const sb = await createSandbox(t);
  const cluster = await createCluster(sb, { pods: 1 });
  const pod = cluster.pods[0]!;
  await sb.exec(cluster.node, 'sysctl', ['-qw', 'net.ipv4.ip_forward=1']);
  await sb.exec(cluster.node, 'iptables', ['-w', '-P', 'INPUT', 'DROP']);
  const iptables = createIptables(sb.run(cluster.node));
  const families = [{ ...v4, hostIP: cluster.nodeIP, listenerPorts: { base: 40000, size: 2000 } }];
  const nf = new Netfilter({ iptables, log: silentLogger(), families });
  const server = sb.spawnIn(cluster.node, process.execPath, ['-e', SERVER]);
  await waitForLine(server, 'ready', 10_000);
  const many = [...Array(200).keys()].map((i) =>
    portal('default', `s${i}`, 'http', { clusterIPs: [`10.96.1.${i + 1}`], proxyPort: 40200 + i }),
  );
  const served = portal('default', 'web', 'http', { clusterIPs: ['10.96.0.20'], proxyPort: 40080 });
  await nf.sync(many, { full: true });
  const filter = async () =>
    (await sb.run(cluster.node)('iptables-save', ['-t', 'filter'])).stdout.replace(/^#.*\n/gm, '');
  const before = await filter();
  await nf.sync([...many.slice(1), served], { full: false });
  assert.equal(await filter(), before, 'a listener added and one removed: the filter table is untouched');
  const chain = (await sb.run(cluster.node)('iptables', ['-w', '-S', 'KUBE-NODEPORT-NON-LOCAL'])).stdout
    .split('\n')
    .filter((l) => l.startsWith('-A '));
  assert.deepEqual(chain, [
    '-A KUBE-NODEPORT-NON-LOCAL -m conntrack ! --ctstate DNAT -j RETURN',
    '-A KUBE-NODEPORT-NON-LOCAL -p tcp -m comment --comment "kube-userspace-proxy listener ports" -m conntrack --ctstate DNAT --ctreplsrcport 40000:41999 -j ACCEPT',
    '-A KUBE-NODEPORT-NON-LOCAL -p udp -m comment --comment "kube-userspace-proxy listener ports" -m conntrack --ctstate DNAT --ctreplsrcport 40000:41999 -j ACCEPT',
  ]);

  // The INPUT policy drops everything else, yet the pod reaches the proxy port through the ClusterIP.
  const get = async (ns: string, script: string) => sb.run(ns)(process.execPath, ['-e', script]);
  assert.equal(
    JSON.parse((await get(pod.ns, tcpClient('10.96.0.20', 80))).stdout).local,
    `${cluster.bridgeIP}:40080`,
  );
  const save = (await sb.run(cluster.node)('iptables-save', ['-c', '-t', 'filter'])).stdout;
  const accepted =
    /^\[(\d+):\d+\] -A KUBE-NODEPORT-NON-LOCAL -p tcp .*--ctreplsrcport 40000:41999 -j ACCEPT/m.exec(save);
  assert.ok(Number(accepted?.[1] ?? 0) > 0, `the range ACCEPT counted the connection: ${save}`);
  // Straight to the listener (no NAT): the policy drops it, as before.
  const direct = await get(pod.ns, tcpClient(cluster.bridgeIP, 40080, 500));
  assert.equal(direct.code, 2, direct.stderr);
  await nf.cleanup();
});
