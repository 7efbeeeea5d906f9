// End to end, the PROXY protocol through real iptables in network namespaces: the endpoint of an
// annotated Service learns who each client was and which destination it asked for, through every
// portal: a pod through the ClusterIP (IPv4 and IPv6), the node itself through the ClusterIP, an outside
// host through the NodePort, an externalIP and the LoadBalancer IP, and under externalTrafficPolicy
// Local through the NodePort too. A Service without the annotation beside it gets no header.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ANNOTATION_PROXY_PROTOCOL } from '../../src/lib/kubernetes-labels.ts';
import type { DebugServicePort } from '../../src/server/debug.ts';
import {
  type Agent,
  createManifest,
  createProxyCluster,
  eventually,
  ProxyProcess,
} from '../helpers/cluster-proxy.ts';
import { type ApiPort, dualStackService, slice } from '../helpers/manifests.ts';
import { createSandbox, requireRootOrSkip } from '../helpers/netns.ts';
import { type ProxyHeader, parseProxyHeader } from '../helpers/proxy-protocol-parser.ts';

const PP_IP = '10.96.0.50';
const PP_IP6 = 'fd00:96::50';
const LOCAL_IP = '10.96.0.51';
const PLAIN_IP = '10.96.0.52';
const EXTERNAL_IP = '203.0.113.50';
const LB_IP = '198.51.100.50';
const NODE_PORT = 30150;
const LOCAL_NODE_PORT = 30151;
const PP_BACKEND = 8080;
const PLAIN_BACKEND = 8081;

/** A Service as the API has it, with our annotations. */
function svc(
  name: string,
  clusterIPs: string[],
  ports: ApiPort[],
  spec: object,
  annotations: object,
  status?: object,
) {
  const base = dualStackService(name, clusterIPs, ports, spec, status);
  return { ...base, metadata: { ...base.metadata, annotations } };
}

/** The pod0 endpoint of `name` on `port`, IPv4 (and IPv6 when `v6`). */
function slices(name: string, port: number, v6 = false): object[] {
  const out: object[] = [slice(name, `${name}-v4`, [{ ip: '10.244.0.10' }], [{ name: 'tcp', port }])];
  if (v6)
    out.push({
      ...slice(name, `${name}-v6`, [{ ip: 'fd00:244::10' }], [{ name: 'tcp', port }]),
      addressType: 'IPv6',
    });
  return out;
}

/** A connection from `agent` to host:port; the header pod0's backend read first. */
async function headerVia(agent: Agent, host: string, port: number, what: string): Promise<ProxyHeader> {
  const r = await agent.tcp(host, port, 3000);
  assert.ok(r.ok, `${what}: ${r.error}`);
  const [name, b64 = ''] = (r.data ?? '').split('|');
  assert.equal(name, 'pod0', what);
  const parsed = parseProxyHeader(Buffer.from(b64, 'base64'));
  assert.ok(parsed !== undefined, `${what}: a whole header in the first bytes`);
  return parsed.header;
}

test('PROXY protocol through every portal, with real iptables in namespaces', {
  timeout: 120_000,
}, async (t) => {
  if (!requireRootOrSkip(t)) return;
  const sb = await createSandbox(t);
  const cluster = await createProxyCluster(sb, { pods: 2, routedToNode: [EXTERNAL_IP, LB_IP] });
  const [pod0, pod1] = cluster.pods as [(typeof cluster.pods)[0], (typeof cluster.pods)[0]];
  await pod0.agent.serve('pp', 'pod0', { tcpPort: PP_BACKEND, proxyProtocol: true });
  await pod0.agent.serve('plain', 'pod0', { tcpPort: PLAIN_BACKEND });
  const manifest = await createManifest(t);
  await manifest.write([
    svc(
      'pp',
      [PP_IP, PP_IP6],
      [{ name: 'tcp', port: 80, targetPort: PP_BACKEND, nodePort: NODE_PORT }],
      { type: 'LoadBalancer', externalIPs: [EXTERNAL_IP] },
      { [ANNOTATION_PROXY_PROTOCOL]: 'v2' },
      { loadBalancer: { ingress: [{ ip: LB_IP }] } },
    ),
    ...slices('pp', PP_BACKEND, true),
    svc(
      'local',
      [LOCAL_IP],
      [{ name: 'tcp', port: 80, targetPort: PP_BACKEND, nodePort: LOCAL_NODE_PORT }],
      { type: 'NodePort', externalTrafficPolicy: 'Local' },
      { [ANNOTATION_PROXY_PROTOCOL]: 'v1' },
    ),
    // pod0 is on this node (node-1): the local list has it.
    {
      ...slices('local', PP_BACKEND)[0]!,
      endpoints: [
        {
          addresses: ['10.244.0.10'],
          nodeName: 'node-1',
          conditions: { ready: true, serving: true, terminating: false },
        },
      ],
    },
    svc('plain', [PLAIN_IP], [{ name: 'tcp', port: 80, targetPort: PLAIN_BACKEND }], {}, {}),
    ...slices('plain', PLAIN_BACKEND),
  ]);
  const proxy = new ProxyProcess(cluster, manifest.file);
  t.after(() => proxy.stop());
  const find = (s: readonly DebugServicePort[], name: string) => s.find((x) => x.service === name);
  await proxy.waitServices(
    (s) =>
      find(s, 'default/pp:tcp')?.portalProxyPorts?.node !== undefined &&
      find(s, 'default/local:tcp') !== undefined,
    15_000,
    'the first sync',
  );
  await eventually(async () => (await pod1.agent.tcp(PLAIN_IP, 80, 300)).ok, { what: 'the first rules' });
  const services = (await proxy.services())!;
  const pp = find(services, 'default/pp:tcp')!;
  assert.equal(pp.proxyProtocol, 'v2', '/debug/services says it is on');
  assert.deepEqual(
    Object.keys(pp.portalProxyPorts ?? {}).sort(),
    [EXTERNAL_IP, LB_IP, 'node'].sort(),
    'a listener of its own for each external destination',
  );
  assert.equal(find(services, 'default/plain:tcp')!.proxyProtocol, undefined);

  const cases: [string, Agent, string, number, string, string, number][] = [
    ['pod1 → ClusterIP', pod1.agent, PP_IP, 80, pod1.ip, PP_IP, 80],
    ['pod1 → ClusterIP (IPv6)', pod1.agent, PP_IP6, 80, pod1.ip6, PP_IP6, 80],
    ['node → ClusterIP (host-side DNAT)', cluster.nodeAgent, PP_IP, 80, cluster.nodeIP, PP_IP, 80],
    [
      'outside → node IP:NodePort',
      cluster.outsideAgent,
      cluster.nodeIP,
      NODE_PORT,
      cluster.outsideIP,
      cluster.nodeIP,
      NODE_PORT,
    ],
    ['outside → externalIP', cluster.outsideAgent, EXTERNAL_IP, 80, cluster.outsideIP, EXTERNAL_IP, 80],
    ['outside → LoadBalancer IP', cluster.outsideAgent, LB_IP, 80, cluster.outsideIP, LB_IP, 80],
    ['pod1 → LoadBalancer IP (from a pod)', pod1.agent, LB_IP, 80, pod1.ip, LB_IP, 80],
  ];
  for (const [what, agent, host, port, src, dst, dstPort] of cases) {
    const h = await headerVia(agent, host, port, what);
    assert.equal(h.version, 2, what);
    assert.deepEqual([h.source, h.destination, h.destinationPort], [src, dst, dstPort], what);
    assert.ok(h.sourcePort > 0, `${what}: the client's port`);
  }

  // externalTrafficPolicy Local: from outside through the local list's listener, v1.
  const local = await headerVia(
    cluster.outsideAgent,
    cluster.nodeIP,
    LOCAL_NODE_PORT,
    'outside → Local NodePort',
  );
  assert.deepEqual(
    [local.version, local.family, local.source, local.destination, local.destinationPort],
    [1, 'TCP4', cluster.outsideIP, cluster.nodeIP, LOCAL_NODE_PORT],
  );

  // No header for the Service without the annotation.
  const plain = await pod1.agent.tcp(PLAIN_IP, 80, 3000);
  assert.ok(plain.ok, plain.error);
  assert.equal(plain.data, 'pod0');
});
