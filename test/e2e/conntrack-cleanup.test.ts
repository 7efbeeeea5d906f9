// UDP conntrack cleanup against the real kernel and conntrack tool, in a network namespace: a flow that
// started while its service had no endpoints stays black-holed after the rules appear, until the
// deletions conntrackDeletions selects are run; they leave other flows alone.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { conntrackDeletions } from '../../src/netfilter/conntrack-cleanup.ts';
import { createIptables } from '../../src/netfilter/iptables.ts';
import { createCluster, createSandbox, requireRootOrSkip } from '../helpers/netns.ts';
import { portal } from '../helpers/portals.ts';
import { waitFor } from '../helpers/servers.ts';

/**
 * The "proxy listener" (echo on 40001) and a client that sends every 20 ms from one source port to the
 * ClusterIP, to another ClusterIP and to two NodePorts; prints a line per reply from the ClusterIP.
 */
const SCRIPT = `
const dgram = require('node:dgram');
const listener = dgram.createSocket('udp4');
listener.on('message', (m, r) => listener.send('pong', r.port, r.address));
listener.bind(40001, '0.0.0.0', () => {
  const client = dgram.createSocket('udp4');
  client.on('error', () => {});
  client.on('message', (m, r) => console.log('reply ' + r.address + ':' + r.port));
  client.bind(5555, '0.0.0.0', () => {
    setInterval(() => {
      client.send('q', 53, '10.96.0.10');
      client.send('q', 53, '10.96.0.11');
      client.send('q', 30053, '192.168.50.2');
      client.send('q', 30054, '192.168.50.2');
    }, 20);
  });
});
`;

test('a UDP flow black-holed while its service had no endpoints is served once the selected entries are deleted', async (t) => {
  if (!requireRootOrSkip(t)) return;
  const sb = await createSandbox(t);
  const { node } = await createCluster(sb);
  const run = sb.run(node);
  const ipt = async (...args: string[]) => {
    const r = await run('iptables', ['-w', ...args]);
    assert.equal(r.code, 0, r.stderr);
  };
  const check = await run('conntrack', ['-L']);
  if (check.code === 127) {
    t.skip('conntrack (conntrack-tools) is not installed');
    return;
  }
  // Connection tracking starts in a namespace with its first NAT target (a plain nat rule is not
  // enough); this one matches nothing we send.
  await ipt(
    '-t',
    'nat',
    '-A',
    'OUTPUT',
    '-d',
    '10.96.0.99/32',
    '-p',
    'udp',
    '-j',
    'REDIRECT',
    '--to-ports',
    '1',
  );
  const child = sb.spawnIn(node, process.execPath, ['-e', SCRIPT]);
  let replies = 0;
  child.stdout?.setEncoding('utf8').on('data', (d: string) => {
    replies += d.split('\n').filter((l) => l.startsWith('reply 10.96.0.10:53')).length;
  });
  const flows = async () => {
    const r = await run('conntrack', ['-L', '-p', 'udp']);
    return r.stdout;
  };
  // No endpoints: no NAT rule, the flow leaves by the default route and gets an entry without NAT.
  await waitFor(async () => /dst=10\.96\.0\.10 .*dport=53/.test(await flows()), 3000, 'the un-NATed flow');

  // Endpoints arrive: the rule appears, as our host-side rules write it (DNAT to the node IP: a reply
  // from a socket on 0.0.0.0 would not match a REDIRECT to 127.0.0.1).
  await ipt(
    ...['-t', 'nat', '-A', 'OUTPUT', '-d', '10.96.0.10/32', '-p', 'udp', '--dport', '53'],
    ...['-j', 'DNAT', '--to-destination', '192.168.50.2:40001'],
  );
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(replies, 0, 'the existing entry keeps the flow un-NATed: black-holed');

  // What IptablesPortals runs after that delta.
  const before = portal('kube-system', 'kube-dns', 'dns', {
    protocol: 'UDP',
    clusterIPs: ['10.96.0.10'],
    port: 53,
    nodePort: 30053,
    proxyPort: 40001,
    endpoints: { any: false, cluster: false, local: false },
  });
  const after = portal('kube-system', 'kube-dns', 'dns', {
    protocol: 'UDP',
    clusterIPs: ['10.96.0.10'],
    port: 53,
    nodePort: 30053,
    proxyPort: 40001,
  });
  const deletions = conntrackDeletions(before, after, 'IPv4');
  assert.equal(deletions.length, 2);
  const iptables = createIptables(run);
  for (const d of deletions) await iptables.flushConntrackUDP(d);
  // Nothing left to delete is not an error.
  for (const d of deletions) await iptables.flushConntrackUDP(d);

  await waitFor(() => replies > 0, 2000, 'a reply through the new rule');
  const left = await flows();
  // The other ClusterIP and the other port keep their entries.
  assert.match(left, /dst=10\.96\.0\.11 .*dport=53/);
  assert.match(left, /dst=192\.168\.50\.2 .*dport=30054/);
});
