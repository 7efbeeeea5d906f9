// End-to-end proof of the iptables portals: the real proxy CLI as a process in a node namespace, real
// iptables, backend pods and clients in their own namespaces, every traffic path a user relies on.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { DebugServicePort } from '../../src/server/debug.ts';
import {
  type Agent,
  createManifest,
  createProxyCluster,
  eventually,
  longestGap,
  ProxyProcess,
  runProxyOnce,
} from '../helpers/cluster-proxy.ts';
import { dualStackService, slice } from '../helpers/manifests.ts';
import { createSandbox, requireRootOrSkip } from '../helpers/netns.ts';

// Portal rules live in the shard chain of their IP's lowest 5 bits (KUBE-PORTALS-CONTAINER-14 for .20).
const CLUSTER_IP = '10.96.0.20';
const CLUSTER_IP_SHARD = '14';
const CLUSTER_IP6 = 'fd00:96::20';
/** 0x7b: shard 27, `1B`, so IPv6 traffic also goes through a shard other than 0 (fd00:96::20 is in 0). */
const V6_ONLY_IP = 'fd00:96::7b';
const V6_ONLY_SHARD = '1B';
const DNS_IP = '10.96.0.10';
const API_IP = '10.96.0.30';
const ECHO_IP = '10.96.0.31';
const CLASH_IP = '10.96.0.40';
/** An externalIP the node owns (on eth0) and one that is only routed to it. */
const ASSIGNED_EIP = '192.168.50.3';
const ROUTED_EIP = '203.0.113.7';
const ROUTED_EIP2 = '203.0.113.8';
const LB_IP = '198.51.100.10';
const NODE_PORT = 30080;
const CLASH_NODE_PORT = 30090;
const BACKEND_TCP = 8080;
const BACKEND_UDP = 5353;
const PODS = 3;
const POD_NAME = /^pod[0-2]$/;

const svc = dualStackService;

/** The EndpointSlices of `service`: every pod, IPv4 and (when `v6`) IPv6. */
function podSlices(service: string, port: { name: string; protocol?: 'TCP' | 'UDP' }, v6 = false) {
  const pods = [...Array(PODS).keys()];
  const targetPort = port.protocol === 'UDP' ? BACKEND_UDP : BACKEND_TCP;
  const ports = [{ ...port, port: targetPort }];
  const out: object[] = [
    slice(
      service,
      `${service}-v4`,
      pods.map((i) => ({ ip: `10.244.0.${10 + i}` })),
      ports,
    ),
  ];
  if (v6)
    out.push({
      ...slice(
        service,
        `${service}-v6`,
        pods.map((i) => ({ ip: `fd00:244::${10 + i}` })),
        ports,
      ),
      addressType: 'IPv6',
    });
  return out;
}

/** web: dual-stack LoadBalancer with a NodePort, two externalIPs and an LB ingress IP; dns: UDP; v6only. */
function baseObjects(): object[] {
  return [
    svc(
      'web',
      [CLUSTER_IP, CLUSTER_IP6],
      [{ name: 'http', port: 80, targetPort: BACKEND_TCP, nodePort: NODE_PORT }],
      { type: 'LoadBalancer', externalIPs: [ASSIGNED_EIP, ROUTED_EIP] },
      { loadBalancer: { ingress: [{ ip: LB_IP }] } },
    ),
    ...podSlices('web', { name: 'http' }, true),
    svc('dns', [DNS_IP], [{ name: 'dns', port: 53, targetPort: BACKEND_UDP, protocol: 'UDP' }]),
    ...podSlices('dns', { name: 'dns', protocol: 'UDP' }),
    svc('v6only', [V6_ONLY_IP], [{ name: 'http', port: 80, targetPort: BACKEND_TCP }]),
    ...podSlices('v6only', { name: 'http' }, true),
  ];
}

function find(services: readonly DebugServicePort[], name: string): DebugServicePort | undefined {
  return services.find((s) => s.service === name);
}

/** Asserts that `agent` gets a pod's name from host:port. */
async function answers(agent: Agent, host: string, port: number, what: string): Promise<string> {
  const r = await agent.tcp(host, port);
  assert.ok(r.ok, `${what}: ${r.error}`);
  assert.match(r.data ?? '', POD_NAME, what);
  return r.data!;
}

/** Asserts that host:port does not answer from `agent` (refused, reset or silent). */
async function silent(agent: Agent, host: string, port: number, what: string): Promise<void> {
  const r = await agent.tcp(host, port, 400);
  assert.equal(r.ok, false, `${what}: answered ${JSON.stringify(r.data)}`);
}

test('the proxy process with real iptables in network namespaces', { timeout: 120_000 }, async (t) => {
  if (!requireRootOrSkip(t)) return;
  const sb = await createSandbox(t);
  const cluster = await createProxyCluster(sb, {
    pods: PODS,
    extraNodeIPs: [ASSIGNED_EIP],
    routedToNode: [ROUTED_EIP, ROUTED_EIP2, LB_IP],
  });
  const [pod0] = cluster.pods;
  const pod = pod0!.agent;
  const { nodeAgent, outsideAgent, node } = cluster;
  for (const [i, p] of cluster.pods.entries())
    await p.agent.serve('backend', `pod${i}`, { tcpPort: BACKEND_TCP, udpPort: BACKEND_UDP });
  const manifest = await createManifest(t);
  await manifest.write(baseObjects());
  const save = async (cmd = 'iptables-save', args = ['-t', 'nat']) => (await sb.exec(node, cmd, args)).stdout;
  /** Packets counted by the nat rules of `chain` whose line includes every one of `parts`. */
  const packets = async (chain: string, parts: string[], cmd = 'iptables-save') =>
    (await save(cmd, ['-c', '-t', 'nat']))
      .split('\n')
      .filter((l) => l.includes(`] -A ${chain} `) && parts.every((p) => l.includes(p)))
      .reduce((n, l) => n + Number(/^\[(\d+):/.exec(l)?.[1] ?? 0), 0);

  let proxy = new ProxyProcess(cluster, manifest.file);
  t.after(() => proxy.stop());
  await proxy.waitServices(
    (s) => ['default/web:http', 'default/dns:dns', 'default/v6only:http'].every((n) => find(s, n)),
    15_000,
    'the first sync',
  );
  await eventually(async () => (await pod.tcp(CLUSTER_IP, 80, 300)).ok, { what: 'the first rules' });

  await t.test(
    'pod → ClusterIP:port over TCP, through the rule in the shard chain of the ClusterIP',
    async () => {
      const shard = `KUBE-PORTALS-CONTAINER-${CLUSTER_IP_SHARD}`;
      const dispatch = ['-d 0.0.0.20/0.0.0.31', `-j ${shard}`];
      const before = [
        await packets(shard, [`-d ${CLUSTER_IP}/32`]),
        await packets('KUBE-PORTALS-CONTAINER', dispatch),
      ];
      await answers(pod, CLUSTER_IP, 80, 'pod0 → ClusterIP');
      await answers(cluster.pods[2]!.agent, CLUSTER_IP, 80, 'pod2 → ClusterIP');
      const after = [
        await packets(shard, [`-d ${CLUSTER_IP}/32`]),
        await packets('KUBE-PORTALS-CONTAINER', dispatch),
      ];
      assert.ok(
        after[0]! >= before[0]! + 2,
        `the portal rule in ${shard} counted both connections: ${before} → ${after}`,
      );
      assert.ok(
        after[1]! >= before[1]! + 2,
        `the dispatch rule to ${shard} counted both: ${before} → ${after}`,
      );
    },
  );

  await t.test('pod → ClusterIP:port over UDP, the reply comes from ClusterIP:port', async () => {
    const r = await pod.udp(DNS_IP, 53, { send: 'ping' });
    assert.ok(r.ok, r.error);
    assert.match(r.data ?? '', /^pod[0-2]:ping$/);
    assert.deepEqual(r.from, { address: DNS_IP, port: 53 }, 'conntrack un-NATs the reply');
  });

  await t.test('node process → ClusterIP (host-side DNAT to the node IP)', async () => {
    await answers(nodeAgent, CLUSTER_IP, 80, 'node → ClusterIP');
    const web = find((await proxy.services())!, 'default/web:http')!;
    assert.match(
      await save(),
      new RegExp(
        `\\n-A KUBE-PORTALS-HOST-${CLUSTER_IP_SHARD} -d ${CLUSTER_IP}/32 .*-j DNAT --to-destination ${cluster.nodeIP}:${web.proxyPort}\\n`,
      ),
    );
  });

  await t.test('outside → NodePort on the node IP, through the NodePort rule', async () => {
    const packets = async () =>
      (await save('iptables-save', ['-c', '-t', 'nat']))
        .split('\n')
        .filter((l) => l.includes('-A KUBE-NODEPORT-CONTAINER') && l.includes(`--dport ${NODE_PORT}`))
        .reduce((n, l) => n + Number(/^\[(\d+):/.exec(l)?.[1] ?? 0), 0);
    const before = await packets();
    await answers(outsideAgent, cluster.nodeIP, NODE_PORT, 'outside → NodePort');
    // Our NodePort listener would answer even without rules: the counter shows the REDIRECT did it.
    assert.ok((await packets()) > before, 'the KUBE-NODEPORT-CONTAINER rule counted the connection');
  });

  await t.test('outside → externalIPs (assigned and routed) and the LoadBalancer ingress IP', async () => {
    await answers(outsideAgent, ASSIGNED_EIP, 80, 'outside → externalIP on the node');
    await answers(outsideAgent, ROUTED_EIP, 80, 'outside → externalIP routed to the node');
    await answers(outsideAgent, LB_IP, 80, 'outside → LB ingress IP');
  });

  await t.test('round robin across 3 pods seen through the ClusterIP', async () => {
    const counts = new Map<string, number>();
    for (let i = 0; i < 30; i++) {
      const name = await answers(pod, CLUSTER_IP, 80, `request ${i}`);
      counts.set(name, (counts.get(name) ?? 0) + 1);
    }
    t.diagnostic(`round robin over 30 requests: ${JSON.stringify(Object.fromEntries(counts))}`);
    assert.equal(counts.size, PODS, 'every pod answered');
    for (const [name, n] of counts) assert.ok(n >= 8 && n <= 12, `${name} answered ${n} of 30`);
  });

  await t.test('IPv6: pod → [ClusterIP]:port (dual-stack and IPv6-only Services)', async () => {
    await answers(pod, CLUSTER_IP6, 80, 'pod → [dual-stack v6 ClusterIP]');
    const v6shard = `KUBE-PORTALS-CONTAINER-${V6_ONLY_SHARD}`;
    const before = await packets(v6shard, [`-d ${V6_ONLY_IP}/128`], 'ip6tables-save');
    await answers(pod, V6_ONLY_IP, 80, 'pod → [IPv6-only ClusterIP]');
    const after = await packets(v6shard, [`-d ${V6_ONLY_IP}/128`], 'ip6tables-save');
    assert.ok(after > before, `the rule in ${v6shard} counted the connection: ${before} → ${after}`);
    await answers(nodeAgent, CLUSTER_IP6, 80, 'node → [v6 ClusterIP] (host DNAT)');
    const v6only = find((await proxy.services())!, 'default/v6only:http')!;
    assert.ok(
      v6only.endpoints.some((e) => e.includes('fd00:244::')),
      `v6 endpoints: ${v6only.endpoints}`,
    );
    assert.match(
      await save('ip6tables-save'),
      new RegExp(
        `\\n-A KUBE-PORTALS-CONTAINER-${V6_ONLY_SHARD} -d ${V6_ONLY_IP}/128 .*-j REDIRECT --to-ports ${v6only.proxyPort}\\n`,
      ),
    );
  });

  await t.test('a Service added, changed and removed while the proxy runs', async () => {
    const api = (port: number, externalIPs: string[] = []) => [
      svc('api', [API_IP], [{ name: 'grpc', port, targetPort: BACKEND_TCP }], { externalIPs }),
      ...podSlices('api', { name: 'grpc' }),
    ];
    const echo = [
      svc('echo', [ECHO_IP], [{ name: 'u', port: 5353, targetPort: BACKEND_UDP, protocol: 'UDP' }]),
      ...podSlices('echo', { name: 'u', protocol: 'UDP' }),
    ];
    await manifest.write([...baseObjects(), ...api(9090), ...echo]);
    const addedIn = await eventually(async () => (await pod.tcp(API_IP, 9090, 300)).ok, {
      what: 'the added Service',
    });
    const u = await eventually(async () => (await pod.udp(ECHO_IP, 5353)).ok, {
      what: 'the added UDP Service',
    });
    t.diagnostic(`added: TCP answered after ${addedIn} ms, UDP after ${u} ms`);

    await manifest.write([...baseObjects(), ...api(9091, [ROUTED_EIP2]), ...echo]);
    await eventually(async () => (await pod.tcp(API_IP, 9091, 300)).ok, { what: 'the new port' });
    await answers(outsideAgent, ROUTED_EIP2, 9091, 'outside → the new externalIP');
    await silent(pod, API_IP, 9090, 'the old port');

    const conntrack = async () =>
      (await sb.exec(node, 'conntrack', ['-L', '-p', 'udp', '--orig-dst', ECHO_IP])).stdout;
    assert.match(await conntrack(), new RegExp(ECHO_IP), 'the UDP flow is tracked');
    await manifest.write(baseObjects());
    await proxy.waitServices(
      (s) => !find(s, 'default/api:grpc') && !find(s, 'default/echo:u'),
      5000,
      'the removal',
    );
    await eventually(async () => !(await save()).includes(API_IP), { what: 'the rules to go' });
    await silent(pod, API_IP, 9091, 'removed Service');
    await silent(outsideAgent, ROUTED_EIP2, 9091, 'removed externalIP');
    assert.doesNotMatch(await conntrack(), new RegExp(ECHO_IP), 'UDP conntrack entries flushed');
    assert.equal((await pod.udp(ECHO_IP, 5353, { timeoutMs: 400 })).ok, false);
  });

  await t.test('NodePort held by another process: KUP_ERR_PORT_CONFLICT, others keep working', async () => {
    await nodeAgent.serve('holder', 'holder', { tcpPort: CLASH_NODE_PORT, host: '0.0.0.0' });
    const clash = [
      svc(
        'clash',
        [CLASH_IP],
        [{ name: 'http', port: 80, targetPort: BACKEND_TCP, nodePort: CLASH_NODE_PORT }],
        { type: 'NodePort' },
      ),
      ...podSlices('clash', { name: 'http' }),
    ];
    await manifest.write([...baseObjects(), ...clash]);
    const services = await proxy.waitServices(
      (s) => find(s, 'default/clash:http')?.error?.code === 'KUP_ERR_PORT_CONFLICT',
      5000,
      'the conflict',
    );
    assert.equal(find(services, 'default/web:http')?.error, undefined);
    await answers(pod, CLUSTER_IP, 80, 'web ClusterIP');
    await answers(outsideAgent, cluster.nodeIP, NODE_PORT, 'web NodePort');
    await eventually(async () => (await pod.tcp(CLASH_IP, 80, 300)).ok, { what: 'the ClusterIP of clash' });
    // Its NodePort got no rule (checked after the restore that added its ClusterIP): the holder keeps
    // its own traffic.
    assert.doesNotMatch(await save(), new RegExp(`--dport ${CLASH_NODE_PORT}`));
    const held = await outsideAgent.tcp(cluster.nodeIP, CLASH_NODE_PORT);
    assert.equal(held.data, 'holder', JSON.stringify(held));

    // Released by the other process: claimed and programmed within a sync period.
    await nodeAgent.unserve('holder');
    await proxy.waitServices((s) => find(s, 'default/clash:http')?.error === undefined, 5000, 'the claim');
    await eventually(async () => (await save()).includes(`--dport ${CLASH_NODE_PORT}`), {
      what: 'the NodePort rules of clash',
    });
    await eventually(
      async () => POD_NAME.test((await outsideAgent.tcp(cluster.nodeIP, CLASH_NODE_PORT)).data ?? ''),
      {
        what: 'the NodePort of clash',
      },
    );
    await manifest.write(baseObjects());
    await proxy.waitServices((s) => !find(s, 'default/clash:http'), 5000, 'clash removed');
  });

  await t.test('rules flushed and a jump deleted by hand are repaired within the sync period', async () => {
    const jump = [
      '-m',
      'comment',
      '--comment',
      'handle ClusterIPs; NOTE: this must be before the NodePort rules',
    ];
    const brokenAt = Date.now();
    // The dispatch rules and the shard chain holding the ClusterIP's rule.
    await sb.exec(node, 'iptables', ['-w', '-t', 'nat', '-F', 'KUBE-PORTALS-CONTAINER']);
    await sb.exec(node, 'iptables', ['-w', '-t', 'nat', '-F', `KUBE-PORTALS-CONTAINER-${CLUSTER_IP_SHARD}`]);
    // Rejects unless the jump was there: proof it was deleted. The state is not read back here, since a
    // periodic sync may already have repaired it.
    await sb.exec(node, 'iptables', [
      '-w',
      '-t',
      'nat',
      '-D',
      'PREROUTING',
      ...jump,
      '-j',
      'KUBE-PORTALS-CONTAINER',
    ]);
    await eventually(
      async () => {
        const s = await save();
        return (
          s.includes(`\n-A KUBE-PORTALS-CONTAINER-${CLUSTER_IP_SHARD} -d ${CLUSTER_IP}/32 `) &&
          s.includes(
            `\n-A KUBE-PORTALS-CONTAINER -d 0.0.0.20/0.0.0.31 -j KUBE-PORTALS-CONTAINER-${CLUSTER_IP_SHARD}\n`,
          ) &&
          /-A PREROUTING .*-j KUBE-PORTALS-CONTAINER/.test(s)
        );
      },
      { timeoutMs: 2000 + 1500, what: 'the repair' },
    );
    t.diagnostic(`rules repaired ${Date.now() - brokenAt} ms after the flush (sync period 2 s)`);
    await answers(pod, CLUSTER_IP, 80, 'pod → ClusterIP after the repair');
    const prerouting = (await save()).split('\n').filter((l) => l.startsWith('-A PREROUTING'));
    assert.match(prerouting[0] ?? '', /-j KUBE-PORTALS-CONTAINER$/, 'the portal jump is first again');
  });

  await t.test('restart: the new process reuses the proxy ports, traffic returns at once', async () => {
    const before = await proxy.services();
    const ports = (s: DebugServicePort[] | undefined) =>
      Object.fromEntries((s ?? []).map((x) => [`${x.service}/${x.protocol}`, x.proxyPort]));
    await pod.pollStart('restart', CLUSTER_IP, 80, 20);
    const old = proxy;
    const stoppedAt = Date.now();
    const stopped = old.stop();
    // The old process keeps its metrics port while it drains: the new one gets its own.
    proxy = new ProxyProcess(cluster, manifest.file, [], 10259);
    const code = await stopped;
    const after = await proxy.waitServices((s) => s.length === before?.length, 15_000, 'the new process');
    await eventually(async () => (await pod.tcp(CLUSTER_IP, 80, 300)).ok, {
      what: 'traffic after the restart',
    });
    await new Promise((r) => setTimeout(r, 200)); // a few more polls after recovery
    const samples = await pod.pollStop('restart');
    const { gapMs, failures } = longestGap(samples);
    const since = (t: number | undefined) => (t === undefined ? '?' : `${t - stoppedAt} ms`);
    const firstFail = samples.find((s) => !s.ok && s.t >= stoppedAt)?.t;
    const back = samples.find((s) => s.ok && firstFail !== undefined && s.t > firstFail)?.t;
    const opened = proxy.logTime('Opened service port', { service: 'default/web:http/TCP' });
    const restored = proxy.logTime('Proxy started');
    t.diagnostic(
      `restart: longest time without an answer ${gapMs} ms (${failures} of ${samples.length} polls failed). ` +
        `After SIGTERM: first failure ${since(firstFail)}, new listener open ${since(opened)}, ` +
        `traffic back ${since(back)}, new process started ${since(restored)}; old process exited with ${code}`,
    );
    assert.equal(code, 0, old.logTail());
    assert.deepEqual(ports(after), ports(before), 'the same proxy ports');
    // Read back from the container-side rules in the shard chains: every service port, both families.
    const reused = proxy.logs.find((l) => l.includes('Reusing the proxy ports of the rules in place'));
    assert.ok(reused, proxy.logTail());
    assert.equal(JSON.parse(reused).servicePorts, before?.length, reused);
    assert.ok(samples.at(-1)?.ok, 'traffic recovered');
    assert.ok(gapMs < 5000, `gap ${gapMs} ms`);
  });

  await t.test(
    '--nodeport-addresses: NodePorts answer only on local addresses inside the CIDRs',
    async () => {
      assert.equal(await proxy.stop(), 0, proxy.logTail());
      proxy = new ProxyProcess(cluster, manifest.file, ['--nodeport-addresses', '192.168.50.0/24']);
      await proxy.waitServices((s) => find(s, 'default/web:http') !== undefined, 15_000);
      // Until its first restore, the previous process's rules (NodePorts on every address) are in place.
      const destinations = async () =>
        (await save())
          .split('\n')
          .filter((l) => l.startsWith('-A KUBE-NODEPORT-CONTAINER'))
          .map((l) => /-d (\S+)/.exec(l)?.[1])
          .sort()
          .join(' ');
      await eventually(async () => (await destinations()) === `${cluster.nodeIP}/32 ${ASSIGNED_EIP}/32`, {
        what: 'NodePort rules for the addresses in the CIDR only',
      });
      await answers(outsideAgent, cluster.nodeIP, NODE_PORT, 'NodePort on the node IP');
      await answers(outsideAgent, ASSIGNED_EIP, NODE_PORT, 'NodePort on a second node address in the CIDR');
      await answers(nodeAgent, cluster.nodeIP, NODE_PORT, 'node → own NodePort in the CIDR');
      await silent(pod, cluster.bridgeIP, NODE_PORT, 'NodePort on the bridge address (outside the CIDR)');
      await silent(nodeAgent, '127.0.0.1', NODE_PORT, 'NodePort on loopback (outside the CIDR)');
    },
  );

  await t.test('--cleanup leaves no KUBE- chain or jump, twice, and on a clean namespace', async () => {
    assert.equal(await proxy.stop(), 0, proxy.logTail());
    assert.match(
      await save('iptables-save', []),
      /KUBE-PORTALS-CONTAINER/,
      'a stopped proxy leaves its rules',
    );
    for (const round of [1, 2]) {
      const r = await runProxyOnce(node, ['--cleanup']);
      assert.equal(r.code, 0, `round ${round}: ${r.output}`);
      assert.doesNotMatch(await save('iptables-save', []), /KUBE-/, `IPv4 after round ${round}`);
      assert.doesNotMatch(await save('ip6tables-save', []), /KUBE-/, `IPv6 after round ${round}`);
    }
    const clean = await sb.createNamespace('clean');
    const r = await runProxyOnce(clean, ['--cleanup']);
    assert.equal(r.code, 0, r.output);
    assert.doesNotMatch((await sb.exec(clean, 'iptables-save', [])).stdout, /KUBE-/);
  });
});
