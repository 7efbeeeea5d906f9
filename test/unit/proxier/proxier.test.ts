// The proxier alone: a fake listener factory (no sockets; a port can be held by "another process", binds
// can be held back), a recording portal programmer (what the rules would hold) and a scripted source.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ProxyError } from '../../../src/lib/errors.ts';
import { silentLogger } from '../../../src/lib/log.ts';
import { DEFAULT_OUTLIER_OPTIONS } from '../../../src/loadbalancer/outlier.ts';
import { LoopGuard, type OwnPortsOptions } from '../../../src/proxier/loop-guard.ts';
import { PortAllocator } from '../../../src/proxier/port-allocator.ts';
import type { PortalProgrammer, PortalSpec } from '../../../src/proxier/portal-programmer.ts';
import {
  Proxier,
  type ProxierDeps,
  type ProxierOptions,
  type SnapshotSource,
} from '../../../src/proxier/proxier.ts';
import type { ListenerFactory, ServicePortListener } from '../../../src/proxier/service-port-listener.ts';
import { SyncLoop } from '../../../src/proxier/sync-loop.ts';
import { IDLE_STATS, type ServicePortContext } from '../../../src/relay/service-context.ts';
import { DEFAULT_TCP_OPTIONS } from '../../../src/relay/tcp.ts';
import { DEFAULT_UDP_OPTIONS } from '../../../src/relay/udp.ts';
import type { Endpoint, EndpointKey, ServicePortEndpoints } from '../../../src/state/endpoint.ts';
import type { ServicePort, ServicePortKey } from '../../../src/state/service-port.ts';
import type { Snapshot } from '../../../src/state/snapshot.ts';
import { ep } from '../../helpers/endpoints.ts';
import { FakeClock } from '../../helpers/fake-clock.ts';
import { collectGarbage, liveObjects } from '../../helpers/heap.ts';
import { type PortalOptions, portal } from '../../helpers/portals.ts';

const BASE = 30000;

/** `default/<name>:http/TCP` on 10.96.0.1:80 (the helpers' builder), with `extra` on top. */
function servicePort(name: string, extra: PortalOptions = {}): ServicePort {
  return portal('default', name, 'http', { clusterIPs: ['10.96.0.1'], ...extra }).servicePort;
}

function endpoints(list: readonly Endpoint[]): ServicePortEndpoints {
  const local = list.filter((e) => e.isLocal);
  return { all: list, cluster: list, local, hasAnyEndpoints: list.length > 0, localReadyCount: local.length };
}

function keyOf(name: string): ServicePortKey {
  return servicePort(name).key;
}

/** The desired state, changed by the script; checkout() hands out what changed since the last one. */
class ScriptedSource implements SnapshotSource {
  isInitialized = true;
  readonly #servicePorts = new Map<ServicePortKey, ServicePort>();
  readonly #endpoints = new Map<ServicePortKey, ServicePortEndpoints>();
  #changedServicePorts = new Set<ServicePortKey>();
  #changedEndpoints = new Set<ServicePortKey>();

  serviceChangesTotal = 0;
  endpointChangesTotal = 0;

  get onlyEndpointsPending(): boolean {
    return this.#changedServicePorts.size === 0 && this.#changedEndpoints.size > 0;
  }

  get pendingServiceChanges(): number {
    return this.#changedServicePorts.size;
  }

  get pendingEndpointChanges(): number {
    return this.#changedEndpoints.size;
  }

  set(sp: ServicePort, eps?: readonly Endpoint[]): void {
    this.#servicePorts.set(sp.key, sp);
    this.#changedServicePorts.add(sp.key);
    this.serviceChangesTotal++;
    if (eps !== undefined) this.setEndpoints(sp.key, eps);
  }

  remove(key: ServicePortKey): void {
    this.#servicePorts.delete(key);
    this.#endpoints.delete(key);
    this.#changedServicePorts.add(key);
    this.#changedEndpoints.add(key);
  }

  setEndpoints(key: ServicePortKey, eps: readonly Endpoint[]): void {
    this.#endpoints.set(key, endpoints(eps));
    this.#changedEndpoints.add(key);
    this.endpointChangesTotal++;
  }

  checkout(): Snapshot {
    const snapshot: Snapshot = {
      servicePorts: new Map(this.#servicePorts),
      endpoints: new Map(this.#endpoints),
      changedServicePorts: this.#changedServicePorts,
      changedEndpoints: this.#changedEndpoints,
      triggerTimes: [],
    };
    this.#changedServicePorts = new Set();
    this.#changedEndpoints = new Set();
    return snapshot;
  }
}

type Bind = { host: string; port: number; ipv6Only: boolean; ok: boolean };

/** Listeners without sockets: records binds and closes; `held` ports belong to another process. */
class FakeListeners {
  /** Ports someone else holds: a bind on them fails with EADDRINUSE. */
  readonly held = new Set<number>();
  readonly binds: Bind[] = [];
  readonly all: FakeListener[] = [];
  /** While set, binds wait for it (a slow bind, to change things meanwhile). */
  gate: Promise<void> | undefined;
  #kernelPort = 40000;

  readonly factory: ListenerFactory = (context, host, ipv6Only) => {
    const l = new FakeListener(this, context, host, ipv6Only);
    this.all.push(l);
    return l;
  };

  /** Listeners bound and not closed, by port. */
  open(): Map<number, FakeListener> {
    const out = new Map<number, FakeListener>();
    for (const l of this.all) if (l.state === 'listening') out.set(l.port, l);
    return out;
  }

  async bind(host: string, port: number, ipv6Only: boolean): Promise<number> {
    if (this.gate !== undefined) await this.gate;
    const ok = port === 0 || (!this.held.has(port) && !this.open().has(port));
    this.binds.push({ host, port, ipv6Only, ok });
    if (!ok)
      throw Object.assign(new Error(`listen EADDRINUSE: address already in use ${host}:${port}`), {
        code: 'EADDRINUSE',
      });
    return port === 0 ? this.#kernelPort++ : port;
  }
}

class FakeListener implements ServicePortListener {
  readonly context: ServicePortContext;
  readonly host: string;
  readonly ipv6Only: boolean;
  state: 'new' | 'listening' | 'closed' | 'destroyed' = 'new';
  endpointChanges = 0;
  #port = 0;
  readonly #owner: FakeListeners;

  constructor(owner: FakeListeners, context: ServicePortContext, host: string, ipv6Only: boolean) {
    this.#owner = owner;
    this.context = context;
    this.host = host;
    this.ipv6Only = ipv6Only;
  }

  get port(): number {
    return this.#port;
  }

  async listen(host: string, port: number, ipv6Only = false): Promise<void> {
    this.#port = await this.#owner.bind(host, port, ipv6Only);
    this.state = 'listening';
  }

  async close(): Promise<void> {
    if (this.state === 'listening' || this.state === 'new') this.state = 'closed';
  }

  destroy(): void {
    this.state = 'destroyed';
    this.connections = 0;
    this.#flushDrained();
  }

  /** Established connections the test pretends are open (drained() waits for them). */
  connections = 0;
  readonly #drainWaiters: (() => void)[] = [];

  drained(): Promise<void> {
    if (this.connections === 0) return Promise.resolve();
    return new Promise((resolve) => this.#drainWaiters.push(resolve));
  }

  /** One of the pretended connections ends. */
  connectionEnded(): void {
    this.connections--;
    if (this.connections === 0) this.#flushDrained();
  }

  #flushDrained(): void {
    for (const w of this.#drainWaiters.splice(0)) w();
  }

  endpointsChanged(): number {
    this.endpointChanges++;
    return 0;
  }
}

/** Records what it is asked to program, and keeps what the rules would hold. */
class RecordingPortals implements PortalProgrammer {
  readonly calls: { kind: 'sync' | 'update'; full: boolean; keys: ServicePortKey[] }[] = [];
  readonly rules = new Map<ServicePortKey, PortalSpec>();
  /** The next call throws (say iptables-restore failed). */
  failNext = false;
  /** While set, sync() and update() wait for it (say iptables-restore waits for the xtables lock). */
  hold: Promise<void> | undefined;

  async sync(portals: readonly PortalSpec[], options: { full: boolean; initial: boolean }): Promise<void> {
    this.calls.push({ kind: 'sync', full: options.full, keys: portals.map((p) => p.servicePort.key) });
    await this.hold;
    this.#fail();
    this.rules.clear();
    for (const p of portals) this.rules.set(p.servicePort.key, p);
  }

  async update(changed: ReadonlyMap<ServicePortKey, PortalSpec | undefined>): Promise<void> {
    this.calls.push({ kind: 'update', full: false, keys: [...changed.keys()] });
    await this.hold;
    this.#fail();
    for (const [key, p] of changed) {
      if (p === undefined) this.rules.delete(key);
      else this.rules.set(key, p);
    }
  }

  #fail(): void {
    if (!this.failNext) return;
    this.failNext = false;
    throw new ProxyError('KUP_ERR_IPTABLES_RESTORE', 'iptables-restore failed');
  }
}

/** A loop guard that counts the endpoint lists it filters, by service port. */
class CountingLoopGuard extends LoopGuard {
  readonly filtered = new Map<ServicePortKey, number>();

  constructor(options: OwnPortsOptions) {
    super(silentLogger(), options);
  }

  override filter(
    sp: ServicePort,
    list: readonly Endpoint[],
    refused: Set<EndpointKey>,
  ): readonly Endpoint[] {
    this.filtered.set(sp.key, (this.filtered.get(sp.key) ?? 0) + 1);
    return super.filter(sp, list, refused);
  }
}

/** A proxier harness with 200 service ports (`s0`…`s199`), each with one pod on `port`; its loop guard counts. */
function twoHundredServicePorts(port: number) {
  let guard = new CountingLoopGuard({ nodePorts: false, portals: false });
  const h = harness({}, new Map(), 1000, undefined, {
    loopGuard: (options) => (guard = new CountingLoopGuard(options)),
    localAddresses: () => [],
  });
  for (let i = 0; i < 200; i++)
    h.source.set(servicePort(`s${i}`, { clusterIPs: [`10.96.1.${i}`] }), [ep(`10.1.0.${i}`, port)]);
  return { h, guard: () => guard };
}

type Harness = {
  proxier: Proxier;
  source: ScriptedSource;
  listeners: FakeListeners;
  portals: RecordingPortals;
  allocator: PortAllocator;
  sync(): Promise<void>;
};

function harness(
  options: Partial<ProxierOptions> = {},
  preferredPorts: ReadonlyMap<string, number> = new Map(),
  rangeSize = 100,
  onProxyPortsChanged?: (changes: ReadonlyMap<string, number | undefined>) => void,
  deps: Partial<ProxierDeps> = {},
): Harness {
  const source = new ScriptedSource();
  const listeners = new FakeListeners();
  const portals = new RecordingPortals();
  // random() = 0: the allocator hands out ports in order from the base.
  const allocator = new PortAllocator({ base: BASE, size: rangeSize }, () => 0);
  const proxier = new Proxier(
    {
      listenHost: '::',
      tcp: DEFAULT_TCP_OPTIONS,
      udp: DEFAULT_UDP_OPTIONS,
      syncPeriodMs: 30_000,
      ...options,
    },
    {
      source,
      allocator,
      portals,
      log: silentLogger(),
      listeners: listeners.factory,
      preferredPorts,
      onProxyPortsChanged,
      ...deps,
    },
  );
  const sync = async () => {
    assert.notEqual(await proxier.sync(), undefined, 'the sync ran');
  };
  return { proxier, source, listeners, portals, allocator, sync };
}

const cases: { name: string; run(t: test.TestContext): Promise<void> }[] = [
  {
    name: "the loop guard follows each sync: another service port's ClusterIP or proxy port is left out while it runs, and back once it stops",
    async run() {
      const h = harness({}, new Map([[keyOf('d'), BASE + 50]]), 100, undefined, { localAddresses: () => [] });
      const pod = ep('10.0.0.1', 8080);
      h.source.set(servicePort('a'), [pod, ep('10.96.0.99', 80), ep('127.0.0.1', BASE + 50)]);
      await h.sync();
      const loops = () => h.proxier.get(keyOf('a'))?.loopEndpoints;
      const served = () => h.proxier.get(keyOf('a'))?.endpoints.map((e) => e.key);
      assert.deepEqual(loops(), []);
      h.source.set(servicePort('b', { clusterIPs: ['10.96.0.99'] }), [pod]);
      await h.sync();
      assert.deepEqual(loops(), ['10.96.0.99:80'], "b's ClusterIP is b's portal");
      h.source.set(servicePort('d', { clusterIPs: ['10.96.0.98'] }), [pod]);
      await h.sync();
      assert.equal(h.proxier.get(keyOf('d'))?.proxyPort, BASE + 50);
      assert.deepEqual(loops(), ['10.96.0.99:80', `127.0.0.1:${BASE + 50}`], "d's proxy port on loopback");
      assert.deepEqual(served(), ['10.0.0.1:8080']);
      h.source.remove(keyOf('b'));
      await h.sync();
      assert.deepEqual(loops(), [`127.0.0.1:${BASE + 50}`], 'b stopped');
      h.source.set(servicePort('d', { clusterIPs: ['10.96.0.99'] }), [pod]);
      await h.sync();
      assert.deepEqual(loops(), ['10.96.0.99:80', `127.0.0.1:${BASE + 50}`], "d took b's ClusterIP");
      h.source.remove(keyOf('d'));
      await h.sync();
      assert.deepEqual(loops(), [], 'd stopped');
      assert.deepEqual(served()?.sort(), ['10.0.0.1:8080', '10.96.0.99:80', `127.0.0.1:${BASE + 50}`].sort());
    },
  },
  {
    name: 'a service port that starts anew on the proxy port it had (it became dual-stack) still leaves out an endpoint there',
    async run() {
      const h = harness({}, new Map([[keyOf('d'), BASE + 50]]), 100, undefined, { localAddresses: () => [] });
      const eps = [ep('10.0.0.1', 8080), ep('127.0.0.1', BASE + 50)];
      h.source.set(servicePort('d'), eps);
      await h.sync();
      assert.deepEqual(h.proxier.get(keyOf('d'))?.loopEndpoints, [`127.0.0.1:${BASE + 50}`]);
      // The Service changes, not its endpoints.
      h.source.set(servicePort('d', { clusterIPs: ['10.96.0.1', 'fd00::1'] }));
      await h.sync();
      assert.equal(h.proxier.get(keyOf('d'))?.proxyPort, BASE + 50);
      assert.deepEqual(h.proxier.get(keyOf('d'))?.loopEndpoints, [`127.0.0.1:${BASE + 50}`]);
      assert.deepEqual(
        h.proxier.get(keyOf('d'))?.endpoints.map((e) => e.key),
        ['10.0.0.1:8080'],
      );
    },
  },
  {
    name: "the host's addresses change: an endpoint at our proxy port on a new address is left out at the next sync",
    async run() {
      let addresses: string[] = [];
      const h = harness({}, new Map([[keyOf('d'), BASE + 50]]), 100, undefined, {
        localAddresses: () => addresses,
      });
      h.source.set(servicePort('a'), [ep('10.0.0.1', 8080), ep('192.168.7.7', BASE + 50)]);
      h.source.set(servicePort('d', { clusterIPs: ['10.96.0.98'] }), [ep('10.0.0.1', 8080)]);
      await h.sync();
      assert.deepEqual(h.proxier.get(keyOf('a'))?.loopEndpoints, [], 'not one of our addresses');
      addresses = ['192.168.7.7'];
      await h.sync();
      assert.deepEqual(h.proxier.get(keyOf('a'))?.loopEndpoints, [`192.168.7.7:${BASE + 50}`]);
      addresses = [];
      await h.sync();
      assert.deepEqual(h.proxier.get(keyOf('a'))?.loopEndpoints, []);
    },
  },
  {
    name: 'one service port added among 200, or one endpoint change: only its endpoints are filtered, not the others',
    async run() {
      const { h, guard } = twoHundredServicePorts(8080);
      await h.sync();
      assert.equal(h.proxier.status().length, 200);
      guard().filtered.clear();
      h.source.set(servicePort('new', { clusterIPs: ['10.96.2.1'] }), [ep('10.2.0.1', 8080)]);
      await h.sync();
      assert.deepEqual([...guard().filtered.keys()], [keyOf('new')], 'the 200 others are not looked at');
      guard().filtered.clear();
      h.source.setEndpoints(keyOf('s7'), [ep('10.1.0.7', 8080), ep('10.1.1.7', 8080)]);
      assert.notEqual(h.proxier.applyEndpointChanges(), undefined);
      assert.deepEqual([...guard().filtered.keys()], [keyOf('s7')]);
    },
  },
  {
    name: "the 200 others list pods on port 80, a new ClusterIP's port: only the list that names that ClusterIP is filtered again",
    async run() {
      const { h, guard } = twoHundredServicePorts(80);
      h.source.set(servicePort('lists'), [ep('10.1.1.1', 80), ep('10.96.2.1', 80)]);
      await h.sync();
      guard().filtered.clear();
      h.source.set(servicePort('new', { clusterIPs: ['10.96.2.1'] }), [ep('10.2.0.1', 80)]);
      await h.sync();
      assert.deepEqual([...guard().filtered.keys()].sort(), [keyOf('lists'), keyOf('new')].sort());
      assert.deepEqual(h.proxier.get(keyOf('lists'))?.loopEndpoints, ['10.96.2.1:80'], "new's ClusterIP");
    },
  },
  {
    name: 'proxy ports moved: only those that changed are reported (one added among 200 is one entry), proxyPorts() has all',
    async run() {
      const changes: ReadonlyMap<string, number | undefined>[] = [];
      const preferred = new Map([[keyOf('new'), BASE + 900]]);
      const h = harness({}, preferred, 1000, (c) => changes.push(c));
      for (let i = 0; i < 200; i++)
        h.source.set(servicePort(`s${i}`, { clusterIPs: [`10.96.1.${i}`] }), [ep(`10.1.0.${i}`, 8080)]);
      await h.sync();
      assert.equal(changes.at(-1)?.size, 200);
      h.source.set(servicePort('new', { clusterIPs: ['10.96.2.1'] }), [ep('10.2.0.1', 8080)]);
      await h.sync();
      assert.deepEqual([...changes.at(-1)!], [[keyOf('new'), BASE + 900]]);
      assert.equal(h.proxier.proxyPorts().size, 201);
      // A second listener (a Local policy beside Cluster) comes, then the service port goes.
      const local = { externalPolicyLocal: true, externallyAccessible: true, nodePort: 30081 };
      h.source.set(servicePort('new', { clusterIPs: ['10.96.2.1'], ...local }), [ep('10.2.0.1', 8080)]);
      await h.sync();
      const localPort = h.proxier.proxyPorts().get(`${keyOf('new')}/local`);
      assert.ok(localPort !== undefined);
      assert.deepEqual([...changes.at(-1)!], [[`${keyOf('new')}/local`, localPort]]);
      h.source.remove(keyOf('new'));
      await h.sync();
      assert.deepEqual([...changes.at(-1)!].sort(), [
        [keyOf('new'), undefined],
        [`${keyOf('new')}/local`, undefined],
      ]);
      assert.equal(h.proxier.proxyPorts().size, 200);
      // Nothing moved (an endpoint-only sync): not called.
      const calls = changes.length;
      h.source.setEndpoints(keyOf('s1'), [ep('10.1.9.1', 8080)]);
      await h.sync();
      assert.equal(changes.length, calls);
    },
  },
  {
    name: 'the addresses NodePorts are held on change: every NodePort is held again on the new ones',
    async run() {
      let hosts = ['192.168.7.7'];
      const h = harness({ claimNodePorts: true, nodePortHosts: () => hosts });
      h.source.set(servicePort('a', { nodePort: 30080, externallyAccessible: true }), [ep('10.0.0.1', 8080)]);
      h.source.set(servicePort('b', { nodePort: 30081, clusterIPs: ['10.96.0.2'] }), [ep('10.0.0.2', 8080)]);
      await h.sync();
      const claims = () =>
        [...h.listeners.open()].filter(([port]) => port >= 30080).map(([port, l]) => [port, l.host]);
      assert.deepEqual(claims(), [
        [30080, '192.168.7.7'],
        [30081, '192.168.7.7'],
      ]);
      hosts = ['192.168.7.8'];
      await h.sync();
      assert.deepEqual(claims(), [
        [30080, '192.168.7.8'],
        [30081, '192.168.7.8'],
      ]);
    },
  },
  {
    name: 'ClientIP affinity entries past their timeout are dropped at a sync; those of a None service port go at once',
    async run() {
      const clock = new FakeClock();
      const h = harness({}, new Map(), 100, undefined, { clock });
      const sticky = { sessionAffinity: 'ClientIP' as const, stickyMaxAgeSeconds: 10 };
      h.source.set(servicePort('a', sticky), [ep('10.0.0.1', 8080)]);
      h.source.set(servicePort('b', { ...sticky, clusterIPs: ['10.96.0.2'] }), [ep('10.0.0.2', 8080)]);
      await h.sync();
      const balancer = (name: string) =>
        h.proxier.get(keyOf(name))!.context.balancer as never as {
          pick(ip: string, now: number): unknown;
          stickyEntries: number;
        };
      balancer('a').pick('10.9.0.1', clock.now());
      balancer('b').pick('10.9.0.1', clock.now());
      await clock.advance(5_000);
      balancer('b').pick('10.9.0.2', clock.now());
      await clock.advance(6_000);
      await h.sync();
      assert.equal(balancer('a').stickyEntries, 0, 'past 10 s');
      assert.equal(balancer('b').stickyEntries, 1, 'one entry 6 s old');
      h.source.set(servicePort('b', { clusterIPs: ['10.96.0.2'] }), [ep('10.0.0.2', 8080)]);
      await h.sync();
      assert.equal(balancer('b').stickyEntries, 0);
    },
  },
  {
    name: 'closed while a sync writes the rules: the proxy ports saved for a restart are not emptied',
    async run() {
      const saved: ReadonlyMap<string, number | undefined>[] = [];
      const h = harness({}, new Map(), 100, (ports) => saved.push(ports));
      h.source.set(servicePort('a'), [ep('10.0.0.1', 8080)]);
      await h.sync();
      assert.deepEqual([...saved.at(-1)!.keys()], [keyOf('a')]);
      h.source.set(servicePort('b'), [ep('10.0.0.2', 8080)]);
      let release: () => void = () => {};
      h.portals.hold = new Promise((r) => {
        release = r;
      });
      const syncing = h.proxier.sync();
      await new Promise((r) => setImmediate(r));
      await h.proxier.close();
      release();
      assert.equal(await syncing, undefined, 'the sync reports nothing once closed');
      assert.equal(saved.length, 1, 'no empty port map after the close');
    },
  },
  {
    name: 'after close(), drained() waits for the last connection of every listener, then resolves',
    async run() {
      const h = harness();
      h.source.set(servicePort('a'), [ep('10.0.0.1', 8080)]);
      h.source.set(
        servicePort('b', { externalPolicyLocal: true, externallyAccessible: true, nodePort: 30081 }),
        [ep('10.0.0.2', 8080, { isLocal: true })],
      );
      await h.sync();
      const open = h.listeners.all.filter((l) => l.state === 'listening');
      assert.equal(open.length, 3, 'a, and b with its local-list listener');
      for (const l of open) l.connections = 1;
      await h.proxier.close();
      let drained = false;
      const waiting = h.proxier.drained().then(() => (drained = true));
      for (const l of open.slice(0, 2)) l.connectionEnded();
      await new Promise((r) => setImmediate(r));
      assert.equal(drained, false, 'one listener still has a connection');
      open[2]!.connectionEnded();
      await waiting;
    },
  },
  {
    name: 'a proxy port held elsewhere: the listener moves to another port and the rules follow',
    async run() {
      const h = harness({}, new Map([[keyOf('a'), BASE + 5]]));
      h.listeners.held.add(BASE + 5);
      h.source.set(servicePort('a'), [ep('10.0.0.1', 8080)]);
      await h.sync();
      const proxyPort = h.proxier.get(keyOf('a'))?.proxyPort;
      assert.equal(proxyPort, BASE);
      assert.deepEqual(
        h.listeners.binds.map((b) => [b.port, b.ok]),
        [
          [BASE + 5, false],
          [BASE, true],
        ],
      );
      assert.equal(h.portals.rules.get(keyOf('a'))?.proxyPort, proxyPort);
      assert.equal(h.proxier.failures().size, 0);
      // The preferred port went back to the allocator: only the one in use is taken.
      assert.equal(h.allocator.free, 99);
    },
  },
  {
    name: 'a cold start: a planned port held elsewhere moves, and the delta after the early restore follows',
    async run() {
      const h = harness({}, new Map(), 200);
      h.listeners.held.add(BASE);
      const names = Array.from({ length: 64 }, (_, i) => `s${String(i).padStart(2, '0')}`);
      for (const name of names) h.source.set(servicePort(name), [ep('10.0.0.1', 8080)]);
      await h.sync();
      // The early restore wrote the planned ports (s00 on BASE), then a delta put s00 right.
      assert.equal(h.portals.calls[0]?.kind, 'sync');
      assert.equal(h.portals.calls[0]?.keys.length, 64);
      assert.equal(h.portals.calls[1]?.kind, 'update');
      const moved = h.proxier.get(keyOf('s00'))?.proxyPort;
      assert.equal(moved, BASE + 64);
      assert.equal(h.portals.rules.get(keyOf('s00'))?.proxyPort, moved);
      for (const s of h.proxier.status())
        assert.equal(h.portals.rules.get(s.servicePort.key)?.proxyPort, s.proxyPort, s.servicePort.key);
      assert.equal(h.allocator.free, 200 - 64);
    },
  },
  {
    name: 'a NodePort held elsewhere gets no NodePort rule and an error, until it is free',
    async run() {
      const h = harness({ claimNodePorts: true });
      h.listeners.held.add(30080);
      h.source.set(servicePort('a', { nodePort: 30080, externallyAccessible: true }), [ep('10.0.0.1', 8080)]);
      await h.sync();
      assert.ok(h.proxier.get(keyOf('a')) !== undefined, 'the service port itself runs');
      assert.equal(h.portals.rules.get(keyOf('a'))?.servicePort.nodePort, 0);
      assert.equal(h.proxier.nodePortErrors().get(keyOf('a'))?.code, 'KUP_ERR_PORT_CONFLICT');
      // The other process lets go: the next sync holds it and writes its rule.
      h.listeners.held.delete(30080);
      await h.sync();
      assert.equal(h.portals.rules.get(keyOf('a'))?.servicePort.nodePort, 30080);
      assert.equal(h.proxier.nodePortErrors().size, 0);
      const claim = h.listeners.open().get(30080);
      assert.equal(claim?.host, '0.0.0.0', 'an IPv4 service port is held on IPv4 only');
    },
  },
  {
    name: 'a service removed while its listener binds: the next sync closes it and releases its port',
    async run() {
      const h = harness();
      let release: () => void = () => {};
      h.listeners.gate = new Promise<void>((r) => {
        release = r;
      });
      h.source.set(servicePort('a'), [ep('10.0.0.1', 8080)]);
      const first = h.proxier.sync();
      h.source.remove(keyOf('a'));
      assert.equal(await h.proxier.sync(), undefined, 'no second sync while one runs');
      h.listeners.gate = undefined;
      release();
      await first;
      assert.equal(h.allocator.free, 99);
      await h.sync();
      assert.equal(h.proxier.get(keyOf('a')), undefined);
      assert.equal(h.allocator.free, 100);
      assert.equal(h.listeners.open().size, 0);
      assert.equal(h.portals.rules.has(keyOf('a')), false);
      assert.deepEqual(h.proxier.proxyPorts(), new Map());
    },
  },
  {
    name: 'the proxier closed while a listener binds: the listener is torn down and its port released',
    async run() {
      const h = harness();
      let release: () => void = () => {};
      h.listeners.gate = new Promise<void>((r) => {
        release = r;
      });
      h.source.set(servicePort('a'), [ep('10.0.0.1', 8080)]);
      const first = h.proxier.sync();
      await h.proxier.close();
      release();
      assert.equal(await first, undefined);
      assert.equal(h.allocator.free, 100);
      assert.deepEqual(
        h.listeners.all.map((l) => l.state),
        ['destroyed'],
      );
      assert.equal(h.proxier.status().length, 0);
    },
  },
  {
    name: 'a service port that gains, then loses, a Local policy opens and closes its second listener',
    async run() {
      const h = harness();
      const external = { externalIPs: ['192.0.2.10'], externallyAccessible: true };
      const local = ep('10.0.0.1', 8080, { isLocal: true });
      h.source.set(servicePort('a', external), [local, ep('10.0.0.2', 8080)]);
      await h.sync();
      assert.equal(h.proxier.get(keyOf('a'))?.localProxyPort, 0);
      assert.equal(h.portals.rules.get(keyOf('a'))?.localProxyPort, 0);
      assert.equal(h.listeners.open().size, 1);

      h.source.set(servicePort('a', { ...external, externalPolicyLocal: true }));
      await h.sync();
      const status = h.proxier.get(keyOf('a'));
      assert.equal(status?.localProxyPort, BASE + 1);
      assert.deepEqual(
        status?.localEndpoints.map((e) => e.key),
        [local.key],
      );
      assert.equal(h.portals.rules.get(keyOf('a'))?.localProxyPort, BASE + 1);
      assert.equal(h.listeners.open().size, 2);
      assert.equal(h.proxier.proxyPorts().get(`${keyOf('a')}/local`), BASE + 1);

      h.source.set(servicePort('a', external));
      await h.sync();
      assert.equal(h.proxier.get(keyOf('a'))?.localProxyPort, 0);
      assert.equal(h.portals.rules.get(keyOf('a'))?.localProxyPort, 0);
      assert.equal(h.listeners.open().get(BASE + 1), undefined, 'the local listener is closed');
      assert.equal(h.allocator.free, 99);
    },
  },
  {
    name: 'an endpoint 0 -> N flip marks portals pending; N -> M does not',
    async run() {
      const h = harness();
      h.source.set(servicePort('a'));
      await h.sync();
      assert.equal(h.portals.rules.get(keyOf('a'))?.endpoints.IPv4.cluster, false);
      assert.equal(h.proxier.portalsPending, false);

      h.source.setEndpoints(keyOf('a'), [ep('10.0.0.1', 8080)]);
      assert.notEqual(h.proxier.applyEndpointChanges(), undefined, 'applied without a sync');
      assert.equal(h.proxier.get(keyOf('a'))?.endpoints.length, 1);
      assert.equal(h.proxier.portalsPending, true);
      await h.sync();
      assert.equal(h.proxier.portalsPending, false);
      assert.equal(h.portals.rules.get(keyOf('a'))?.endpoints.IPv4.cluster, true);

      h.source.setEndpoints(keyOf('a'), [ep('10.0.0.1', 8080), ep('10.0.0.2', 8080)]);
      assert.notEqual(h.proxier.applyEndpointChanges(), undefined);
      assert.equal(h.proxier.get(keyOf('a'))?.endpoints.length, 2);
      assert.equal(h.proxier.portalsPending, false);
    },
  },
  {
    name: 'an unchanged portal is the same object from sync to sync (the delta skips it by identity)',
    async run() {
      const h = harness();
      h.source.set(servicePort('a'), [ep('10.0.0.1', 8080)]);
      h.source.set(servicePort('b', { clusterIPs: ['10.96.0.2'] }), [ep('10.0.0.2', 8080)]);
      await h.sync();
      const before = h.proxier.portals();
      h.source.set(servicePort('b', { clusterIPs: ['10.96.0.2'], sessionAffinity: 'ClientIP' }));
      await h.sync();
      const after = h.proxier.portals();
      assert.equal(after[0], before[0]);
      assert.notEqual(after[1], before[1]);
      assert.deepEqual(h.portals.calls.at(-1), { kind: 'update', full: false, keys: [keyOf('b')] });
    },
  },
  {
    name: 'idle service ports hold no collection of their own, and share their endpoint flags',
    async run() {
      const h = harness({ outlier: DEFAULT_OUTLIER_OPTIONS }, new Map(), 300);
      const open = async (from: number, to: number) => {
        for (let i = from; i < to; i++)
          h.source.set(servicePort(`s${i}`, { clusterIPs: [`10.96.1.${i}`] }), [
            ep('10.0.0.1', 8080),
            ep('10.0.0.2', 8080),
          ]);
        await h.sync();
      };
      await open(0, 1);
      const maps = liveObjects(Map);
      const sets = liveObjects(Set);
      await open(1, 201);
      assert.equal(h.proxier.status().length, 201);
      // Balancers (affinity, health), counters (picks) and listeners of external destinations: none yet.
      assert.ok(liveObjects(Map) - maps < 20, `${liveObjects(Map) - maps} Maps for 200 service ports`);
      assert.ok(liveObjects(Set) - sets < 20, `${liveObjects(Set) - sets} Sets for 200 service ports`);
      const [a, b] = h.proxier.status();
      assert.equal(a?.portalEndpoints, b?.portalEndpoints, 'the same flags, one shared object');
    },
  },
  {
    name: 'an idle TCP service port holds no counters of its own, and a bounded amount of heap',
    async run() {
      const n = 1000;
      const h = harness({ outlier: DEFAULT_OUTLIER_OPTIONS }, new Map(), n + 10);
      const open = async (from: number, to: number) => {
        for (let i = from; i < to; i++)
          h.source.set(servicePort(`s${i}`, { clusterIPs: [`10.96.${i >> 8}.${i & 255}`] }), [
            ep('10.0.0.1', 8080),
            ep('10.0.0.2', 8080),
          ]);
        await h.sync();
      };
      await open(0, 1);
      await collectGarbage();
      const before = process.memoryUsage().heapUsed;
      await open(1, n + 1);
      await collectGarbage();
      const each = (process.memoryUsage().heapUsed - before) / n;
      const statuses = h.proxier.status();
      assert.equal(statuses.length, n + 1);
      assert.ok(
        statuses.every((s) => s.context.stats === IDLE_STATS),
        'the shared idle counters',
      );
      // The proxier's own (the runtime, the balancers, the contexts, its Maps) and this test's source and
      // fake listeners: ~2,670 bytes a service port (~2,810 with counters of its own each).
      assert.ok(each < 2740, `${each.toFixed(0)} bytes of heap per idle service port`);
    },
  },
];

for (const c of cases) test(c.name, (t) => c.run(t));

/** A sync loop around a harness's proxier, on a fake clock; the fast path runs when the script says. */
function loopHarness(): Harness & { loop: SyncLoop; clock: FakeClock; events: string[]; tick(): void } {
  const clock = new FakeClock();
  const h = harness();
  const events: string[] = [];
  let deferred: (() => void)[] = [];
  const loop = new SyncLoop(
    { minSyncPeriodMs: 1000, syncPeriodMs: 30_000 },
    { proxier: h.proxier, source: h.source, log: silentLogger(), clock, defer: (fn) => deferred.push(fn) },
    {
      onQueued: () => events.push('queued'),
      onSyncStarted: () => events.push('started'),
      onApplied: (a) => events.push(`applied services=${a.serviceChanges} endpoints=${a.endpointChanges}`),
      onSynced: (r) => void events.push(`synced full=${r.full} opened=${r.opened}`),
      onEndpointsApplied: () => events.push('endpoints applied'),
      onSyncFailed: (err) => events.push(`failed ${(err as ProxyError).code}`),
    },
  );
  const tick = () => {
    const fns = deferred;
    deferred = [];
    for (const fn of fns) fn();
  };
  return { ...h, loop, clock, events, tick };
}

const loopCases: { name: string; run(): Promise<void> }[] = [
  {
    name: 'sync loop: a service change goes through the runner; change counts are those since the last report',
    async run() {
      const h = loopHarness();
      h.source.set(servicePort('a'), [ep('10.0.0.1', 8080)]);
      h.loop.start();
      await h.clock.advance(0); // t=0: the first sync
      h.source.set(servicePort('b', { clusterIPs: ['10.96.0.2'] }));
      h.loop.onChange();
      await h.clock.advance(0); // t=0: the second of the burst
      assert.deepEqual(h.events, [
        'started',
        'applied services=1 endpoints=1',
        'synced full=true opened=1',
        'queued',
        'started',
        'applied services=1 endpoints=0',
        'synced full=false opened=1',
      ]);
      await h.loop.stop();
    },
  },
  {
    name: 'sync loop: an endpoint-only change is applied on the next tick without a sync; a 0 -> N flip queues one',
    async run() {
      const h = loopHarness();
      h.source.set(servicePort('a'));
      h.loop.start();
      await h.clock.advance(0);
      h.events.length = 0;
      h.source.setEndpoints(keyOf('a'), [ep('10.0.0.1', 8080)]);
      h.loop.onChange();
      h.loop.onChange(); // a watch chunk with several events: one application
      assert.deepEqual(h.events, []);
      h.tick();
      assert.equal(h.proxier.get(keyOf('a'))?.endpoints.length, 1);
      assert.deepEqual(h.events, ['applied services=0 endpoints=1', 'queued', 'endpoints applied']);
      await h.clock.advance(0);
      assert.equal(h.portals.rules.get(keyOf('a'))?.endpoints.IPv4.cluster, true);
      h.events.length = 0;
      h.source.setEndpoints(keyOf('a'), [ep('10.0.0.1', 8080), ep('10.0.0.2', 8080)]);
      h.loop.onChange();
      h.tick();
      assert.deepEqual(h.events, ['applied services=0 endpoints=1', 'endpoints applied']);
      await h.loop.stop();
      // Stopped: a change from a source that is still closing is neither applied nor reported.
      h.events.length = 0;
      h.source.setEndpoints(keyOf('a'), [ep('10.0.0.1', 8080)]);
      h.loop.onChange();
      h.tick();
      assert.deepEqual(h.events, []);
      assert.equal(h.proxier.get(keyOf('a'))?.endpoints.length, 2);
    },
  },
  {
    name: 'sync loop: a failed sync is reported, retried after the retry interval, and the retry is full',
    async run() {
      const h = loopHarness();
      h.source.set(servicePort('a'), [ep('10.0.0.1', 8080)]);
      h.loop.start();
      await h.clock.advance(0);
      h.events.length = 0;
      h.portals.failNext = true;
      h.source.set(servicePort('a', { port: 81 }));
      h.loop.onChange();
      await h.clock.advance(0);
      assert.deepEqual(h.events, ['queued', 'started', 'failed KUP_ERR_IPTABLES_RESTORE']);
      // t=1000: the retry; the failed sync's change is counted with it (nothing was reported applied).
      await h.clock.advance(1000);
      assert.deepEqual(h.events.slice(3), [
        'started',
        'applied services=1 endpoints=0',
        'synced full=true opened=0',
      ]);
      assert.equal(h.portals.calls.at(-1)?.kind, 'sync');
      assert.equal(h.portals.rules.get(keyOf('a'))?.servicePort.port, 81);
      await h.loop.stop();
    },
  },
];

for (const c of loopCases) test(c.name, () => c.run());

test('sync loop: the last snapshot keeps its change sets only until its callbacks have read them', async () => {
  const clock = new FakeClock();
  const h = harness();
  const seen: string[] = [];
  const sizes = (s: Snapshot | undefined) => `${s?.changedServicePorts.size}/${s?.changedEndpoints.size}`;
  const deferred: (() => void)[] = [];
  const loop = new SyncLoop(
    { minSyncPeriodMs: 1000, syncPeriodMs: 30_000 },
    { proxier: h.proxier, source: h.source, log: silentLogger(), clock, defer: (fn) => deferred.push(fn) },
    {
      onSynced: async (_r, snapshot) => {
        await Promise.resolve();
        seen.push(`synced ${sizes(snapshot)} ${sizes(h.proxier.snapshot)}`);
      },
      onEndpointsApplied: (snapshot) => void seen.push(`endpoints ${sizes(snapshot)}`),
    },
  );
  h.source.set(servicePort('a'), [ep('10.0.0.1', 8080)]);
  h.source.set(servicePort('b', { clusterIPs: ['10.96.0.2'] }), [ep('10.0.0.2', 8080)]);
  loop.start();
  await clock.advance(0);
  assert.deepEqual(seen, ['synced 2/2 2/2'], 'the callbacks see every change');
  assert.equal(sizes(h.proxier.snapshot), '0/0', 'then the sets are let go');
  assert.equal(
    h.proxier.snapshot?.servicePorts.size,
    2,
    'the service ports stay (a starting worker is sent them)',
  );
  assert.equal(h.proxier.snapshot?.endpoints.size, 2);
  h.source.setEndpoints(keyOf('a'), [ep('10.0.0.1', 8080), ep('10.0.0.3', 8080)]);
  loop.onChange();
  for (const fn of deferred.splice(0)) fn();
  assert.deepEqual(seen.slice(1), ['endpoints 0/1']);
  assert.equal(sizes(h.proxier.snapshot), '0/0', 'the fast path lets them go too');
  assert.equal(h.proxier.snapshot?.endpoints.get(keyOf('a'))?.all.length, 2);
  await loop.stop();
});
