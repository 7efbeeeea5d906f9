// A cold start with many service ports writes the rules while the listeners bind (the ports are
// allocated first), and a listener that could not get its planned port is put right by a delta: the
// rules in the end point at the port each service port really listens on.
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import type { Config } from '../../src/config/config.ts';
import { DEFAULT_CONFIG } from '../../src/config/config.ts';
import { silentLogger } from '../../src/lib/log.ts';
import type { Iptables } from '../../src/netfilter/iptables.ts';
import { OVERLAP_MIN_SERVICE_PORTS } from '../../src/proxier/proxier.ts';
import { ProxyServer } from '../../src/proxy-server.ts';
import { fakeHostInfo } from '../helpers/host-info.ts';
import { service, slice, toYaml } from '../helpers/manifests.ts';
import { request, waitFor } from '../helpers/servers.ts';

const SERVICES = 100;
/** Ports in the range beyond one per service port: another process may take one meanwhile. */
const SPARE_PORTS = 4;

function canListen(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.once('error', () => resolve(false));
    s.listen({ host: '::', port, exclusive: true }, () => s.close(() => resolve(true)));
  });
}

/** A range of `n` free ports (checked one by one) starting somewhere in 40000-59999. */
async function freeRange(n: number): Promise<number> {
  for (let tries = 0; tries < 20; tries++) {
    const base = 40_000 + Math.floor(Math.random() * 20_000);
    let ok = true;
    for (let p = base; p < base + n && ok; p++) ok = await canListen(p);
    if (ok) return base;
  }
  throw new Error('no free port range');
}

/** The container-side rules after applying restore texts in order: comment → REDIRECT port. */
function applied(restores: readonly string[]): Map<string, number> {
  const rules = new Map<string, number>();
  for (const text of restores) {
    if (/^:KUBE-PORTALS-CONTAINER /m.test(text)) rules.clear();
    for (const line of text.split('\n')) {
      const m = /^-([AD]) KUBE-PORTALS-CONTAINER-\S+ .*--comment (\S+) .*--to-ports (\d+)/.exec(line);
      if (!m) continue;
      if (m[1] === 'A') rules.set(m[2]!, Number(m[3]));
      else if (rules.get(m[2]!) === Number(m[3])) rules.delete(m[2]!);
    }
  }
  return rules;
}

test('many new service ports: rules restored while listeners bind, then a delta for a port that was taken', async (t) => {
  assert.ok(SERVICES >= OVERLAP_MIN_SERVICE_PORTS);
  const pod = net.createServer((s) => s.end('pod'));
  await new Promise<void>((r) => pod.listen({ host: '127.0.0.11', port: 0 }, () => r()));
  t.after(() => new Promise((r) => pod.close(r)));
  const podPort = (pod.address() as net.AddressInfo).port;

  // A few ports more than service ports, and one of them held by someone else: the allocator most
  // likely plans it for a service port (it cannot know), whose listener then lands on another.
  const size = SERVICES + SPARE_PORTS;
  const base = await freeRange(size);
  const held = base + Math.floor(Math.random() * size);
  const squatter = net.createServer();
  await new Promise<void>((resolve, reject) => {
    squatter.once('error', reject);
    squatter.listen({ host: '::', port: held }, () => resolve());
  });
  t.after(() => new Promise((r) => squatter.close(r)));

  const dir = await mkdtemp(join(tmpdir(), 'kup-cold-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const file = join(dir, 'm.yaml');
  const objects: unknown[] = [];
  for (let i = 1; i <= SERVICES; i++) {
    objects.push(
      service(`svc-${i}`, `10.96.${i >> 8}.${i & 255}`, [{ name: 'http', port: 80, targetPort: podPort }]),
      slice(`svc-${i}`, `svc-${i}-1`, [{ ip: '127.0.0.11' }], [{ name: 'http', port: podPort }]),
    );
  }
  await writeFile(file, toYaml(objects));

  let server: ProxyServer | undefined;
  const restores: string[] = [];
  const listeningAtRestore: number[] = [];
  const iptables: Iptables = {
    restore: async (_family, text) => {
      listeningAtRestore.push(server?.proxier.status().length ?? 0);
      restores.push(text);
      await new Promise((r) => setTimeout(r, 20));
    },
    save: async () => '',
    missingJumps: async () => [],
    cleanup: async () => {},
    flushConntrackUDP: async () => {},
  };
  const config: Config = {
    ...DEFAULT_CONFIG,
    // In this process: one relaying process (the worker mode has tests of its own).
    workers: 1,
    manifest: file,
    iptables: true,
    hostnameOverride: 'node-1',
    bindAddress: '0.0.0.0',
    proxyPortRange: `${base}-${base + size - 1}`,
    healthzBindAddress: '127.0.0.1:0',
    metricsBindAddress: '127.0.0.1:0',
    iptablesMinSyncPeriodMs: 0,
  };
  server = new ProxyServer(config, { log: silentLogger(), iptables, hostInfo: fakeHostInfo });
  await server.start();
  t.after(() => server?.close());
  await waitFor(() => server!.proxier.lastSyncMs > 0, 10_000, 'the first sync');

  // The full restore went out before the listeners were bound, with every service port in it.
  assert.ok(restores.length >= 1);
  assert.match(restores[0]!, /^:KUBE-PORTALS-CONTAINER /m);
  assert.ok(
    listeningAtRestore[0]! < SERVICES,
    `restore began with ${listeningAtRestore[0]} of ${SERVICES} listening`,
  );
  // In the end: every service port listens, and its rule points at the port it listens on.
  const status = server.proxier.status();
  assert.equal(status.length, SERVICES);
  const rules = applied(restores);
  for (const s of status) assert.equal(rules.get(s.servicePort.name), s.proxyPort, s.servicePort.name);
  assert.equal(rules.size, SERVICES);
  assert.ok(![...rules.values()].includes(held), 'no rule points at the port someone else holds');
  // One full restore, in parts (the container side first, then the host side and the NodePorts), then
  // only deltas (no chain declared): the correction, when the held port was planned for a service port
  // (~96 % of runs; the others plan it among the spare ports).
  const parts = restores.findIndex((text, i) => i > 0 && !/^:KUBE-/m.test(text));
  const full = parts === -1 ? restores.length : parts;
  assert.equal(
    restores.filter((text) => /^:KUBE-PORTALS-CONTAINER /m.test(text)).length,
    1,
    'one full restore',
  );
  for (const text of restores.slice(full)) assert.doesNotMatch(text, /^:KUBE-/m, 'the correction is a delta');
  if (new RegExp(`--to-ports ${held}$`, 'm').test(restores[0]!))
    assert.ok(restores.length > full, `the rule planned at the held port ${held} is corrected by a delta`);
  // And the listeners serve.
  assert.equal(await request(status[0]!.proxyPort), 'pod');
});
