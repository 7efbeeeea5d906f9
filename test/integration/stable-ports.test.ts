// Proxy ports without a state file: the proxy as users run it (the bin, a manifest, --no-iptables,
// --state-file=) gets the same ports on every start, whatever order the manifest lists its services in,
// because each service port's port is hashed from its key (port-allocator.ts) and collisions are
// resolved in key order; a state file still wins. In-process: the cold start's planned ports (the early
// restore, with iptables) are the same hashed ones.
import assert from 'node:assert/strict';
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import type { Config } from '../../src/config/config.ts';
import { DEFAULT_CONFIG } from '../../src/config/config.ts';
import { silentLogger } from '../../src/lib/log.ts';
import type { Iptables } from '../../src/netfilter/iptables.ts';
import { readEphemeralPorts } from '../../src/proxier/ephemeral-ports.ts';
import { createPortAllocator, proxyPortOffset } from '../../src/proxier/port-allocator.ts';
import { OVERLAP_MIN_SERVICE_PORTS } from '../../src/proxier/proxier.ts';
import { ProxyServer } from '../../src/proxy-server.ts';
import { fakeHostInfo } from '../helpers/host-info.ts';
import { service, slice, toYaml } from '../helpers/manifests.ts';
import { freePort } from '../helpers/proxy-process.ts';
import { waitFor } from '../helpers/servers.ts';

const BIN = fileURLToPath(new URL('../../bin/kube-userspace-proxy.js', import.meta.url));
const SIZE = 40;

function canListen(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.once('error', () => resolve(false));
    s.listen({ host: '::', port, exclusive: true }, () => s.close(() => resolve(true)));
  });
}

/** A range of `n` free ports below the ephemeral range and the NodePort range (nobody's by chance). */
async function freeRange(n: number): Promise<number> {
  for (let tries = 0; tries < 20; tries++) {
    const base = 21_000 + Math.floor(Math.random() * 8_000);
    let ok = true;
    for (let p = base; p < base + n && ok; p++) ok = await canListen(p);
    if (ok) return base;
  }
  throw new Error('no free port range');
}

/** Two service names whose `default/NAME:http/TCP` keys hash to the same port of a SIZE-port range. */
function collidingNames(): [string, string] {
  const seen = new Map<number, string>();
  for (let i = 0; i < 1000; i++) {
    const name = `svc-${i}`;
    const offset = proxyPortOffset(`default/${name}:http/TCP`, SIZE);
    const other = seen.get(offset);
    if (other !== undefined) return [other, name];
    seen.set(offset, name);
  }
  throw new Error('no collision');
}

/** Services (each with its slice): two colliding TCP ones, a UDP one, one with a second (local) listener. */
function manifest(colliding: [string, string]): unknown[][] {
  const [a, b] = colliding;
  const local = [
    {
      apiVersion: 'v1',
      kind: 'Service',
      metadata: { name: 'edge', namespace: 'default' },
      spec: {
        type: 'NodePort',
        clusterIP: '10.96.0.40',
        clusterIPs: ['10.96.0.40'],
        externalTrafficPolicy: 'Local',
        ports: [{ name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, nodePort: 30777 }],
      },
    },
    slice('edge', 'edge-1', [{ ip: '127.0.0.11' }], [{ name: 'http', port: 8080 }]),
  ];
  return [
    [
      service(a, '10.96.0.41', [{ name: 'http', port: 80, targetPort: 8080 }]),
      slice(a, `${a}-1`, [{ ip: '127.0.0.11' }], [{ name: 'http', port: 8080 }]),
    ],
    [
      service(b, '10.96.0.42', [{ name: 'http', port: 80, targetPort: 8080 }]),
      slice(b, `${b}-1`, [{ ip: '127.0.0.12' }], [{ name: 'http', port: 8080 }]),
    ],
    [
      service('dns', '10.96.0.10', [{ name: 'dns', port: 53, targetPort: 5353, protocol: 'UDP' }]),
      slice('dns', 'dns-1', [{ ip: '127.0.0.11' }], [{ name: 'dns', port: 5353, protocol: 'UDP' }]),
    ],
    local,
  ];
}

/** The ports a model of the allocator gives: key order, each from its hashed offset up to a free one. */
function modelPorts(base: number, keys: string[]): Record<string, number> {
  const used = new Set<number>();
  const out: Record<string, number> = {};
  // A service port's local listener binds right after its own (both in key order of the service port).
  const order = [...keys].sort((x, y) => {
    const kx = x.replace(/\/local$/, '');
    const ky = y.replace(/\/local$/, '');
    return kx === ky ? x.length - y.length : kx < ky ? -1 : 1;
  });
  for (const key of order) {
    let offset = proxyPortOffset(key, SIZE);
    while (used.has(offset)) offset = (offset + 1) % SIZE;
    used.add(offset);
    out[key] = base + offset;
  }
  return out;
}

type Run = { ports: Record<string, number>; lines: Record<string, unknown>[] };

/** Runs the bin on `objects` until /debug/services shows `count` ports, reads them, stops it (SIGTERM). */
async function runProxy(objects: unknown[], count: number, args: string[]): Promise<Run> {
  const dir = await mkdtemp(join(tmpdir(), 'kup-stable-'));
  const file = join(dir, 'm.yaml');
  await writeFile(file, toYaml(objects));
  const metrics = await freePort();
  const child: ChildProcess = spawn(
    process.execPath,
    [
      BIN,
      '--manifest',
      file,
      '--no-iptables',
      '--hostname-override=node-1',
      '--healthz-bind-address=',
      `--metrics-bind-address=127.0.0.1:${metrics}`,
      '--v=2',
      ...args,
    ],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  const lines: Record<string, unknown>[] = [];
  let stderr = '';
  child.stderr!.on('data', (d) => {
    stderr += String(d);
  });
  createInterface({ input: child.stdout! }).on('line', (l) => {
    try {
      lines.push(JSON.parse(l) as Record<string, unknown>);
    } catch {}
  });
  const exited = new Promise((r) => child.once('exit', r));
  try {
    let ports: Record<string, number> = {};
    await waitFor(
      async () => {
        if (child.exitCode !== null) throw new Error(`the proxy exited: ${stderr}`);
        const res = await fetch(`http://127.0.0.1:${metrics}/debug/services`).catch(() => undefined);
        if (res === undefined || res.status !== 200) return false;
        const list = (await res.json()) as {
          service: string;
          protocol: string;
          proxyPort: number;
          localProxyPort?: number;
        }[];
        ports = {};
        for (const s of list) {
          if (s.proxyPort > 0) ports[`${s.service}/${s.protocol}`] = s.proxyPort;
          if ((s.localProxyPort ?? 0) > 0) ports[`${s.service}/${s.protocol}/local`] = s.localProxyPort!;
        }
        return Object.keys(ports).length === count;
      },
      20_000,
      'the service ports',
    );
    return { ports, lines };
  } finally {
    child.kill('SIGTERM');
    await exited;
    await rm(dir, { recursive: true, force: true });
  }
}

const KEYS = (colliding: [string, string]) => [
  `default/${colliding[0]}:http/TCP`,
  `default/${colliding[1]}:http/TCP`,
  'default/dns:dns/UDP',
  'default/edge:http/TCP',
  'default/edge:http/TCP/local',
];

test('no state file: the same ports on every start and in any manifest order; a state file still wins', async (t) => {
  const colliding = collidingNames();
  const keys = KEYS(colliding);
  const groups = manifest(colliding);
  const base = await freeRange(SIZE);
  const range = [`--proxy-port-range=${base}-${base + SIZE - 1}`];
  const want = modelPorts(base, keys);

  const first = await runProxy(groups.flat(), keys.length, [...range, '--state-file=']);
  assert.deepEqual(first.ports, want, 'the hashed ports, the collision resolved in key order');
  const again = await runProxy(groups.flat(), keys.length, [...range, '--state-file=']);
  assert.deepEqual(again.ports, want, 'a restart: the same ports');
  const reversed = await runProxy([...groups].reverse().flat(), keys.length, [...range, '--state-file=']);
  assert.deepEqual(reversed.ports, want, 'the services in reverse order: the same ports');

  // A state file from another history: it says the second colliding service had the first one's
  // port. The first one sorts first and hashes onto that port, yet the file wins.
  const dir = await mkdtemp(join(tmpdir(), 'kup-stable-state-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const stateFile = join(dir, 'state.json');
  const [ka, kb] = keys as [string, string];
  const taken = want[ka]!;
  await writeFile(stateFile, JSON.stringify({ version: 1, proxyPorts: { [kb]: taken } }));
  const withState = await runProxy(groups.flat(), keys.length, [...range, `--state-file=${stateFile}`]);
  assert.equal(withState.ports[kb], taken, 'the state file port');
  assert.notEqual(withState.ports[ka], taken);
  for (const k of keys.slice(2)) assert.equal(withState.ports[k], want[k], k);
  const saved = JSON.parse(await readFile(stateFile, 'utf8')) as { proxyPorts: Record<string, number> };
  assert.deepEqual(saved.proxyPorts, withState.ports, 'the file now holds what the proxy used');
});

test("no --proxy-port-range (kube-proxy's default): ports hashed into the kernel's ephemeral range, the same on a restart", async () => {
  const ephemeral = readEphemeralPorts();
  if (ephemeral === undefined) return; // not Linux: kernel-chosen, nothing to compare
  const colliding = collidingNames();
  const keys = KEYS(colliding);
  const groups = manifest(colliding);
  // What the allocator gives on a host where none of the ports is in use.
  const model = createPortAllocator({ base: 0, size: 0 }, silentLogger());
  const want: Record<string, number> = {};
  for (const k of keys) want[k] = model.allocateNext(k);
  const moved = (run: Run) =>
    new Set(run.lines.filter((l) => l.msg === 'Proxy port in use, trying another').map((l) => l.service));
  for (const objects of [groups.flat(), [...groups].reverse().flat()]) {
    const run = await runProxy(objects, keys.length, ['--state-file=']);
    for (const k of keys) {
      const port = run.ports[k]!;
      const { base, size } = ephemeral.range;
      assert.ok(port >= base && port < base + size, `${k}: ${port} in the ephemeral range`);
      // A hashed port an outgoing connection holds right now is passed over (logged): only then may it differ.
      if (!moved(run).has(k)) assert.equal(port, want[k], k);
    }
  }
});

test('a cold start plans the hashed ports for the early restore, in key order whatever the manifest order', async (t) => {
  const size = OVERLAP_MIN_SERVICE_PORTS * 2;
  const base = await freeRange(size);
  const names = Array.from({ length: OVERLAP_MIN_SERVICE_PORTS }, (_, i) => `svc-${i}`);
  const objects = names.map((name, i) => [
    service(name, `10.96.1.${i + 1}`, [{ name: 'http', port: 80, targetPort: 8080 }]),
    slice(name, `${name}-1`, [{ ip: '127.0.0.11' }], [{ name: 'http', port: 8080 }]),
  ]);
  const used = new Set<number>();
  const want = new Map<string, number>();
  for (const key of names.map((n) => `default/${n}:http`).sort()) {
    let offset = proxyPortOffset(`${key}/TCP`, size);
    while (used.has(offset)) offset = (offset + 1) % size;
    used.add(offset);
    want.set(key, base + offset);
  }
  const dir = await mkdtemp(join(tmpdir(), 'kup-stable-cold-'));
  t.after(() => rm(dir, { recursive: true, force: true }));

  for (const order of [objects, [...objects].reverse()]) {
    const file = join(dir, 'm.yaml');
    await writeFile(file, toYaml(order.flat()));
    const restores: string[] = [];
    const iptables: Iptables = {
      restore: async (_family, text) => {
        restores.push(text);
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
      stateFile: '',
      hostnameOverride: 'node-1',
      bindAddress: '0.0.0.0',
      proxyPortRange: `${base}-${base + size - 1}`,
      healthzBindAddress: '',
      metricsBindAddress: '',
      iptablesMinSyncPeriodMs: 0,
    };
    const server = new ProxyServer(config, { log: silentLogger(), iptables, hostInfo: fakeHostInfo });
    try {
      await server.start();
      await waitFor(() => server.proxier.lastSyncMs > 0, 10_000, 'the first sync');
      // The first restore went out with the planned ports, before the listeners were bound.
      const planned = new Map<string, number>();
      for (const m of restores[0]!.matchAll(
        /-A KUBE-PORTALS-CONTAINER-\S+ .*--comment (\S+) .*--to-ports (\d+)/g,
      ))
        planned.set(m[1]!, Number(m[2]));
      assert.deepEqual(new Map([...planned].sort()), want);
      for (const s of server.proxier.status()) assert.equal(s.proxyPort, want.get(s.servicePort.name));
    } finally {
      await server.close();
    }
  }
});
