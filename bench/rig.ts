// The namespace rig of the benchmark: a client pod, a node (this proxy with real iptables, HAProxy,
// nginx stream), a second node for the proxy with --trace=none, and two backend pods (nginx HTTP,
// iperf3, dnsmasq), all in namespaces made for the run and deleted after it (also on failure and
// SIGINT). Every address below lives inside those namespaces; nothing is sent anywhere else.
import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync, rmSync } from 'node:fs';
import { mkdtemp, rename, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { createRun, type RunResult } from '../src/netfilter/iptables.ts';
import { createSandbox, type Sandbox } from '../test/helpers/netns.ts';
import { backendNginxConf, haproxyConf, NET, serviceYaml, sliceYaml, streamNginxConf } from './configs.ts';
import { Daemon, JsonLineChannel, Probe } from './processes.ts';

export { NET } from './configs.ts';
/** The CLI as installed (compiled dist/); the harness builds dist/ before it starts. */
export const PROXY_BIN = fileURLToPath(new URL('./cli.js', import.meta.url));
const API_AGENT = fileURLToPath(new URL('apiserver-agent.ts', import.meta.url));

/**
 * `proxy-w1` (the traced proxy with `--workers 1`) runs only when asked for; `proxy-listener` is the
 * traced proxy reached at its listeners (the node's address and the ports its rules REDIRECT to: the
 * same process, without the NAT), only when asked for; `nginx-sessions` is nginx stream's second UDP
 * configuration (sessions kept), a DNS-only target.
 */
export type TargetName =
  | 'direct'
  | 'proxy'
  | 'proxy-listener'
  | 'proxy-notrace'
  | 'proxy-w1'
  | 'haproxy'
  | 'nginx'
  | 'nginx-sessions';
/** The targets that are this proxy's CLI. */
export type ProxyTargetName = 'proxy' | 'proxy-notrace' | 'proxy-w1';

/**
 * Where the two proxies run. `normal`: `proxy` (--trace=protocols) on the node, `proxy-notrace`
 * (--trace=none) on node2. `swap`: the other way round, so that a normal and a swapped run together
 * cancel whatever the two nodes differ in. `control`: as normal but both --trace=none (an A/A control).
 */
export type TraceLayout = 'normal' | 'swap' | 'control';
export type HostPort = { host: string; port: number };

/** One way from the client pod to the backends; `pids` are the processes in between (none for direct). */
export type Target = {
  readonly name: TargetName;
  readonly http: HostPort;
  readonly iperf: HostPort;
  /** Undefined when the target has no UDP (HAProxy). */
  readonly dns: HostPort | undefined;
  pids(): number[];
};

/** A way to the DNS backends over UDP (every target but HAProxy, and nginx's second UDP configuration). */
export type DnsTarget = { readonly name: TargetName; readonly dns: HostPort; pids(): number[] };

export type RigOptions = {
  /** Cores given to HAProxy (nbthread) and nginx (worker_processes). */
  cores: number;
  /**
   * Flags appended to a proxy target's own. An entry for `proxy-w1` adds that target: the `proxy`
   * target's flags plus these, on a third node (node3, ClusterIPs 10.98/16).
   */
  proxyArgs?: Partial<Record<ProxyTargetName, readonly string[]>>;
  /** Adds `proxy-listener`: the traced proxy without the REDIRECT (what the NAT costs, in the same run). */
  listenerTarget?: boolean;
  log: (line: string) => void;
};

/** The ports a proxy's listeners took, by the traffic manifest's service (read from its REDIRECT rules). */
type ListenerPorts = { http: number; iperf: number; dns: number };

/** The ports `iptables-save -t nat` shows the bench Services' portals REDIRECT to; undefined when one is missing. */
function redirectPorts(natRules: string): ListenerPorts | undefined {
  const port = (service: string, proto: string): number | undefined => {
    const re = new RegExp(`-p ${proto} .*--comment "bench/${service}:p".* -j REDIRECT --to-ports (\\d+)`);
    const m = re.exec(natRules);
    return m ? Number(m[1]) : undefined;
  };
  const http = port('http', 'tcp');
  const iperf = port('iperf', 'tcp');
  const dns = port('dns', 'udp');
  return http && iperf && dns ? { http, iperf, dns } : undefined;
}

/** The namespaces, the backends, the peers and the proxies of one benchmark run. */
export class Rig {
  readonly sandbox: Sandbox;
  readonly dir: string;
  readonly client: string;
  readonly node: string;
  readonly node2: string;
  /** Undefined unless `proxy-w1` was asked for. */
  readonly node3: string | undefined;
  readonly backendNs: readonly string[];
  readonly clientProbe: Probe;
  readonly nodeProbe: Probe;
  readonly node2Probe: Probe;
  /** The agent in each namespace that has one (client, node, node2, node3). */
  readonly #probes: Map<string, Probe>;
  readonly #proxyArgs: Partial<Record<ProxyTargetName, readonly string[]>>;

  /** The extra flags of a proxy target (RigOptions.proxyArgs); undefined when the target does not run. */
  proxyArgsOf(target: ProxyTargetName): readonly string[] | undefined {
    return target === 'proxy' ? (this.#proxyArgs.proxy ?? []) : this.#proxyArgs[target];
  }
  /** Where each proxy target runs now (the layout decides for `proxy` and `proxy-notrace`). */
  readonly #proxyNs = new Map<string, string>();
  readonly daemons = new Map<string, Daemon>();
  /** Every process started, also those replaced since (for the report's warnings and crashes). */
  readonly #all: Daemon[] = [];
  readonly #log: (line: string) => void;
  readonly #cores: number;
  readonly #manifests = new Map<string, number>();
  #apiServer: ApiServerAgent | undefined;
  #layout: TraceLayout = 'normal';
  readonly #listenerTarget: boolean;
  /** The traced proxy's listener ports, read after each start (listenerTarget). */
  #listenerPorts: ListenerPorts | undefined;

  private constructor(
    sandbox: Sandbox,
    dir: string,
    names: Topology,
    probes: Map<string, Probe>,
    options: RigOptions,
  ) {
    this.sandbox = sandbox;
    this.dir = dir;
    this.client = names.client;
    this.node = names.node;
    this.node2 = names.node2;
    this.node3 = names.node3;
    this.backendNs = names.backends;
    this.#probes = probes;
    this.clientProbe = probes.get(names.client)!;
    this.nodeProbe = probes.get(names.node)!;
    this.node2Probe = probes.get(names.node2)!;
    this.#proxyArgs = options.proxyArgs ?? {};
    this.#listenerTarget = options.listenerTarget === true;
    this.#log = options.log;
    this.#cores = options.cores;
  }

  /**
   * Builds the namespaces (`buildTopology`: a switch; node 10.244.0.1 with node IP 192.168.50.2;
   * node2 10.244.0.2, the client's route to 10.97.0.0/16; node3 10.244.0.3 and 10.98.0.0/16 only for
   * `proxy-w1`; pods 10.244.0.10-12) and starts the backends and the peers. The proxies are started by
   * `startTrafficProxies` / `startProxy`.
   */
  static async create(options: RigOptions): Promise<Rig> {
    const sandbox = await createSandbox();
    const dir = await mkdtemp(join(tmpdir(), 'kup-bench-'));
    removeOnExit(dir);
    try {
      const t = await buildTopology(sandbox, options.proxyArgs?.['proxy-w1'] !== undefined);
      const nodes = [t.node, t.node2, ...(t.node3 ? [t.node3] : [])];
      for (const ns of [...nodes, t.client, ...t.backends]) {
        // Many short connections in a row reuse ports: allow TIME_WAIT reuse (only in our namespaces).
        await sandbox.exec(ns, 'sysctl', ['-q', '-w', 'net.ipv4.tcp_tw_reuse=1']);
      }
      const probes = new Map<string, Probe>();
      await Promise.all(
        [t.client, ...nodes].map(async (ns) => probes.set(ns, await Probe.start(sandbox, ns))),
      );
      const rig = new Rig(sandbox, dir, t, probes, options);
      await rig.#startBackends();
      await rig.#startPeers();
      return rig;
    } catch (err) {
      sandbox.cleanup();
      rmSync(dir, { recursive: true, force: true });
      throw err;
    }
  }

  /**
   * The TCP targets (direct, the proxies, HAProxy, nginx; `proxy-w1` when asked for); the proxies need
   * `startTrafficProxies` first.
   */
  targets(): Target[] {
    const backend = NET.backends[0];
    const d = (name: string) => this.daemons.get(name);
    const pidsOf = (name: string) => () => d(name)?.pids() ?? [];
    // The node's proxy serves 10.96/16, node2's 10.97/16 (the client's route).
    const swapped = this.#layout === 'swap';
    const ips = {
      proxy: swapped ? NET.clusterIPs2 : NET.clusterIPs,
      notrace: swapped ? NET.clusterIPs : NET.clusterIPs2,
      // The traced proxy's node, as the client reaches it (it listens on every address).
      proxyNode: swapped ? NET.node2IP : NET.nodeIP,
    };
    return [
      {
        name: 'direct',
        http: { host: backend, port: NET.httpPort },
        iperf: { host: backend, port: NET.iperfPort },
        dns: { host: backend, port: NET.dnsPort },
        pids: () => [],
      },
      {
        name: 'proxy',
        http: { host: ips.proxy.http, port: 80 },
        iperf: { host: ips.proxy.iperf, port: NET.iperfPort },
        dns: { host: ips.proxy.dns, port: 53 },
        pids: pidsOf('proxy'),
      },
      ...(this.#listenerPorts === undefined
        ? []
        : [
            {
              name: 'proxy-listener' as const,
              http: { host: ips.proxyNode, port: this.#listenerPorts.http },
              iperf: { host: ips.proxyNode, port: this.#listenerPorts.iperf },
              dns: { host: ips.proxyNode, port: this.#listenerPorts.dns },
              pids: pidsOf('proxy'),
            },
          ]),
      {
        name: 'proxy-notrace',
        http: { host: ips.notrace.http, port: 80 },
        iperf: { host: ips.notrace.iperf, port: NET.iperfPort },
        dns: { host: ips.notrace.dns, port: 53 },
        pids: pidsOf('proxy-notrace'),
      },
      ...(this.node3 === undefined
        ? []
        : [
            {
              name: 'proxy-w1' as const,
              http: { host: NET.clusterIPs3.http, port: 80 },
              iperf: { host: NET.clusterIPs3.iperf, port: NET.iperfPort },
              dns: { host: NET.clusterIPs3.dns, port: 53 },
              pids: pidsOf('proxy-w1'),
            },
          ]),
      {
        name: 'haproxy',
        http: { host: NET.nodeIP, port: NET.haproxy.http },
        iperf: { host: NET.nodeIP, port: NET.haproxy.iperf },
        dns: undefined,
        pids: pidsOf('haproxy'),
      },
      {
        name: 'nginx',
        http: { host: NET.nodeIP, port: NET.nginx.http },
        iperf: { host: NET.nodeIP, port: NET.nginx.iperf },
        dns: { host: NET.nodeIP, port: NET.nginx.dns },
        pids: pidsOf('nginx'),
      },
    ];
  }

  /** The UDP targets: every TCP target with DNS, then nginx stream keeping UDP sessions (same process as `nginx`). */
  dnsTargets(): DnsTarget[] {
    const out: DnsTarget[] = [];
    for (const t of this.targets()) if (t.dns) out.push({ name: t.name, dns: t.dns, pids: t.pids });
    out.push({
      name: 'nginx-sessions',
      dns: { host: NET.nodeIP, port: NET.nginx.dnsSessions },
      pids: () => this.daemons.get('nginx')?.pids() ?? [],
    });
    return out;
  }

  /** This process and every process the rig started (with their children): not "other work". */
  ourPids(): Set<number> {
    const out = new Set<number>([process.pid, ...[...this.#probes.values()].map((p) => p.pid)]);
    if (this.#apiServer?.running) out.add(this.#apiServer.pid);
    for (const d of this.#all) if (d.running) for (const pid of d.pids()) out.add(pid);
    return out;
  }

  /** Runs a program inside `ns` to completion (load generators). */
  runIn(ns: string, cmd: string, args: string[], timeoutMs = 60_000): Promise<RunResult> {
    return createRun({ timeoutMs })('ip', ['netns', 'exec', ns, cmd, ...args]);
  }

  /** Writes (atomically, as editors do) a manifest file named `name` in the run's directory. */
  async writeManifest(name: string, text: string): Promise<string> {
    const file = join(this.dir, name);
    const n = (this.#manifests.get(name) ?? 0) + 1;
    this.#manifests.set(name, n);
    const tmp = join(this.dir, `.${name}.${n}`);
    await writeFile(tmp, text);
    await rename(tmp, file);
    return file;
  }

  /**
   * Starts the Kubernetes API stand-in (bench/apiserver-agent.ts) on the node namespace's 127.0.0.1,
   * replacing one started before; `cleanup` stops it. Feed a proxy from it with `startProxy(…,
   * { master: api.url }, …)`.
   */
  async startApiServer(): Promise<ApiServerAgent> {
    await this.stopApiServer();
    this.#apiServer = await ApiServerAgent.start(this.sandbox, this.node, this.#log);
    return this.#apiServer;
  }

  async stopApiServer(): Promise<void> {
    const api = this.#apiServer;
    this.#apiServer = undefined;
    await api?.stop();
  }

  /**
   * Starts the CLI in `ns` (`--hostname-override node-1`, metrics on the namespace's 127.0.0.1:10249)
   * fed by a manifest file (`source` a path: `--manifest FILE`) or by an API server (`{ master: URL }`:
   * `--master URL`, no kubeconfig), and waits until /debug/services lists `expectPorts` open ports.
   */
  async startProxy(
    key: string,
    ns: string,
    source: string | { master: string },
    args: string[],
    expectPorts: number,
    pollMs = 100,
  ): Promise<{ daemon: Daemon; spawnedAt: number; listedAt: number }> {
    await this.daemons.get(key)?.stop();
    const from = typeof source === 'string' ? ['--manifest', source] : ['--master', source.master];
    const spawnedAt = Date.now();
    // KUP_INSPECTOR_SIGNAL=1: the proxy lets SIGUSR1 open its inspector (collectGarbage); off otherwise.
    const daemon = this.#spawn(key, ns, 'env', [
      'KUP_INSPECTOR_SIGNAL=1',
      process.execPath,
      PROXY_BIN,
      ...from,
      '--hostname-override',
      'node-1',
      '--metrics-bind-address',
      `127.0.0.1:${NET.metricsPort}`,
      '--healthz-bind-address',
      `127.0.0.1:${NET.metricsPort + 7}`,
      ...args,
    ]);
    this.#proxyNs.set(key, ns);
    let listedAt = Number.NaN;
    const probe = this.#probes.get(ns);
    if (probe && expectPorts > 0) {
      const r = await probe.request<{ ok: boolean; t: number; error?: string }>(
        'pollServices',
        { host: '127.0.0.1', port: NET.metricsPort, count: expectPorts, maxMs: 120_000, intervalMs: pollMs },
        130_000,
      );
      if (!r.ok) throw new Error(`${key} did not open its ports: ${r.error}\n${daemon.tail()}`);
      listedAt = r.t;
    }
    return { daemon, spawnedAt, listedAt };
  }

  /** The manifest of the traffic measures: http (2 backends), iperf (1 backend: iperf3 pairs its connections), dns. */
  trafficManifest(ips: { http: string; iperf: string; dns: string }): string {
    const [b1, b2] = NET.backends;
    return [
      serviceYaml('http', ips.http, 'TCP', 80, NET.httpPort),
      sliceYaml('http', [b1, b2], 'TCP', NET.httpPort),
      serviceYaml('iperf', ips.iperf, 'TCP', NET.iperfPort, NET.iperfPort),
      sliceYaml('iperf', [b1], 'TCP', NET.iperfPort),
      serviceYaml('dns', ips.dns, 'UDP', 53, NET.dnsPort),
      sliceYaml('dns', [b1, b2], 'UDP', NET.dnsPort),
    ].join('---\n');
  }

  /**
   * `proxy` (the default --trace=protocols) and `proxy-notrace` (--trace=none), on the node and node2
   * as `layout` says (kept for later restarts), and `proxy-w1` on node3 when asked for, all with real
   * iptables and their `proxyArgs`; resolves once a client request through each ClusterIP is answered.
   */
  async startTrafficProxies(layout: TraceLayout = this.#layout): Promise<void> {
    this.#layout = layout;
    // No per-service connection cap: the memory measure holds 5,000 connections on one Service, past the
    // default (an eighth of the descriptor limit, per process).
    const common = ['--proxy-port-range', NET.proxyPortRange, '--max-connections-per-service=0'];
    const traced = [...common, layout === 'control' ? '--trace=none' : '--trace=protocols'];
    const untraced = [...common, '--trace=none'];
    const swapped = layout === 'swap';
    const specs: { key: ProxyTargetName; ns: string; ips: ClusterIPs; args: string[] }[] = [
      {
        key: 'proxy',
        ns: swapped ? this.node2 : this.node,
        ips: swapped ? NET.clusterIPs2 : NET.clusterIPs,
        args: traced,
      },
      {
        key: 'proxy-notrace',
        ns: swapped ? this.node : this.node2,
        ips: swapped ? NET.clusterIPs : NET.clusterIPs2,
        args: untraced,
      },
    ];
    if (this.node3 !== undefined)
      specs.push({ key: 'proxy-w1', ns: this.node3, ips: NET.clusterIPs3, args: traced });
    for (const s of specs) {
      // One manifest per node: its own ClusterIP range (the client routes each range to its node).
      const manifest = await this.writeManifest(`traffic-${s.ips.http}.yaml`, this.trafficManifest(s.ips));
      await this.startProxy(s.key, s.ns, manifest, [...s.args, ...(this.#proxyArgs[s.key] ?? [])], 3);
    }
    for (const { ips } of specs) {
      const ip = ips.http;
      const r = await this.clientProbe.request<{ ok: boolean; error?: string }>('pollHttp', {
        host: ip,
        port: 80,
        maxMs: 20_000,
        intervalMs: 50,
      });
      if (!r.ok) throw new Error(`no answer through ${ip}: ${r.error}`);
    }
    if (this.#listenerTarget) {
      const ns = swapped ? this.node2 : this.node;
      const rules = await this.sandbox.exec(ns, 'iptables-save', ['-t', 'nat']);
      this.#listenerPorts = redirectPorts(rules.stdout);
      if (this.#listenerPorts === undefined)
        throw new Error(`proxy-listener: no REDIRECT for the bench Services in ${ns}'s nat table`);
    }
  }

  /**
   * For a proxy (a Node process): opens its inspector (SIGUSR1, 127.0.0.1:9229 in its namespace) and
   * runs a full garbage collection, so RSS can be compared without garbage in it; then the same in each
   * worker process (--workers), whose inspector takes a port of the kernel's choosing, read from the
   * "Debugger listening" line it prints. Other daemons: no-op. heapUsed: of every process.
   */
  async collectGarbage(key: string): Promise<{ heapUsed?: number }> {
    const d = this.daemons.get(key);
    if (!d?.running || !/^(proxy|scale)/.test(key)) return {};
    const probe = this.#probes.get(this.#proxyNs.get(key) ?? this.node) ?? this.nodeProbe;
    const gc = async (port: number) => {
      const r = await probe.request<{ ok: boolean; heapUsed?: number; error?: string }>(
        'gc',
        { port },
        30_000,
      );
      if (!r.ok) throw new Error(`garbage collection in ${key} (inspector port ${port}): ${r.error}`);
      return r.heapUsed ?? Number.NaN;
    };
    d.child.kill('SIGUSR1');
    let heapUsed = await gc(9229);
    // Its worker processes only: the proxy also keeps a /bin/sh (for iptables), which SIGUSR1 would kill.
    const workers = d.pids().filter((pid) => /worker-process\.[jt]s/.test(cmdlineOf(pid)));
    for (const pid of workers) {
      // An inspector stays open: a second collection reuses the port the first one found.
      let port = d.inspectors.get(pid);
      if (port === undefined) {
        const seen = new Set(d.inspectorPorts());
        process.kill(pid, 'SIGUSR1');
        for (let i = 0; i < 100 && port === undefined; i++) {
          port = d.inspectorPorts().find((p) => !seen.has(p));
          if (port === undefined) await sleep(20);
        }
        if (port === undefined)
          throw new Error(`${key}: worker ${pid} opened no inspector on SIGUSR1: ${d.tail(8)}`);
        d.inspectors.set(pid, port);
      }
      heapUsed += await gc(port);
    }
    return { heapUsed };
  }

  /** Fresh processes for every target in between (the memory measures start from a clean slate). */
  async restartMiddles(): Promise<void> {
    await this.stopTrafficProxies();
    for (const key of ['haproxy', 'nginx']) await this.daemons.get(key)?.stop();
    await this.#startPeers();
    await this.startTrafficProxies();
  }

  async stopTrafficProxies(): Promise<void> {
    for (const key of ['proxy', 'proxy-notrace', 'proxy-w1']) await this.daemons.get(key)?.stop();
  }

  /** Per proxy (all its starts): the warning and error lines it logged, and whether it ever died on its own. */
  proxyHealth(): { name: string; crashed: boolean; warnings: number; sample: string[] }[] {
    const out = new Map<string, { name: string; crashed: boolean; warnings: number; sample: string[] }>();
    for (const d of this.#all) {
      if (!/^(proxy|scale)/.test(d.name)) continue;
      const h = out.get(d.name) ?? { name: d.name, crashed: false, warnings: 0, sample: [] };
      h.crashed ||= !d.running && !d.stopping;
      h.warnings += d.warnings;
      h.sample.push(...d.lines.filter((l) => /"level":\s*([4-9]\d)/.test(l)).slice(0, 5 - h.sample.length));
      if (h.crashed && h.sample.length < 5) h.sample.push(...d.lines.slice(-3));
      out.set(d.name, h);
    }
    return [...out.values()];
  }

  /**
   * What the peers and backends said (HAProxy's output, nginx error logs, dnsmasq and iperf3 output):
   * a misconfigured or failing peer shows here. One entry per source that said anything.
   */
  peerMessages(): string[] {
    const out: string[] = [];
    for (const d of this.#all) {
      if (/^(proxy|scale)/.test(d.name)) continue;
      const lines = d.lines.filter((l) => !IPERF_CHATTER.test(l));
      if (lines.length > 0) out.push(`${d.name}: ${lines.slice(-3).join(' | ')}`);
    }
    for (const name of readdirSync(this.dir).filter((n) => n.endsWith('error.log'))) {
      const lines = readFileSync(join(this.dir, name), 'utf8')
        .split('\n')
        .filter((l) => l.trim() !== '' && !IPERF_TEARDOWN.test(l));
      if (lines.length > 0) out.push(`${name} (${lines.length} lines): ${lines.slice(-3).join(' | ')}`);
    }
    return [...new Set(out)].map((m) => m.slice(0, 400));
  }

  /** Stops every process (the API stand-in too), deletes the namespaces and the run's directory. */
  async cleanup(): Promise<void> {
    await Promise.all([
      ...[...this.daemons.values()].map((d) => d.stop(3_000)),
      this.stopApiServer().catch((err: Error) => this.#log(`! stopping the API stand-in: ${err.message}`)),
    ]);
    // Kills whatever is still running (SIGKILL), also the stand-in if it did not stop.
    this.sandbox.cleanup();
    rmSync(this.dir, { recursive: true, force: true });
  }

  #spawn(key: string, ns: string, cmd: string, args: string[]): Daemon {
    const daemon = new Daemon(key, this.sandbox.spawnIn(ns, cmd, args));
    daemon.child.stdin?.end();
    this.daemons.set(key, daemon);
    this.#all.push(daemon);
    daemon.exited.then((code) => {
      if (!daemon.stopping)
        this.#log(`! ${key} exited on its own (${code ?? daemon.child.signalCode}): ${daemon.tail(5)}`);
    });
    return daemon;
  }

  async #startBackends(): Promise<void> {
    for (const [i, ns] of this.backendNs.entries()) {
      const ip = NET.backends[i]!;
      const name = `pod${i + 1}`;
      const conf = join(this.dir, `${name}-nginx.conf`);
      await writeFile(conf, backendNginxConf(this.dir, name, ip, NET.secondaryIPs[i] ?? []));
      this.#spawn(`${name}-nginx`, ns, 'nginx', [
        '-c',
        conf,
        '-p',
        `${this.dir}/`,
        '-e',
        join(this.dir, `${name}-error.log`),
      ]);
      this.#spawn(`${name}-dnsmasq`, ns, 'dnsmasq', [
        '--keep-in-foreground',
        '--conf-file=/dev/null',
        '--no-resolv',
        '--no-hosts',
        `--listen-address=${ip}`,
        '--bind-interfaces',
        `--port=${NET.dnsPort}`,
        '--address=/bench.test/10.1.2.3',
        '--cache-size=0',
        '--user=root',
        '--group=root',
        '--pid-file=',
        '--log-facility=/dev/null',
      ]);
      if (i === 0) this.#spawn(`${name}-iperf3`, ns, 'iperf3', ['-s', '-B', ip, '-p', String(NET.iperfPort)]);
    }
    for (const ip of NET.backends) {
      const r = await this.clientProbe.request<{ ok: boolean; error?: string }>('pollHttp', {
        host: ip,
        port: NET.httpPort,
        maxMs: 10_000,
        intervalMs: 50,
      });
      if (!r.ok) throw new Error(`backend ${ip} does not answer: ${r.error}`);
    }
  }

  async #startPeers(): Promise<void> {
    const hcfg = join(this.dir, 'haproxy.cfg');
    await writeFile(hcfg, haproxyConf(this.#cores));
    const check = spawnSync('haproxy', ['-c', '-f', hcfg], { encoding: 'utf8' });
    if (check.status !== 0) throw new Error(`haproxy -c: ${check.stdout}${check.stderr}`);
    this.#spawn('haproxy', this.node, 'haproxy', ['-db', '-f', hcfg]);
    const ncfg = join(this.dir, 'nginx-stream.conf');
    await writeFile(ncfg, streamNginxConf(this.dir, this.#cores));
    this.#spawn('nginx', this.node, 'nginx', [
      '-c',
      ncfg,
      '-p',
      `${this.dir}/`,
      '-e',
      join(this.dir, 'stream-error.log'),
    ]);
    for (const port of [NET.haproxy.http, NET.nginx.http]) {
      const r = await this.clientProbe.request<{ ok: boolean; error?: string }>('pollHttp', {
        host: NET.nodeIP,
        port,
        maxMs: 10_000,
        intervalMs: 50,
      });
      if (!r.ok) throw new Error(`peer on ${NET.nodeIP}:${port} does not answer: ${r.error}`);
    }
  }
}

/**
 * The Kubernetes API stand-in (bench/apiserver-agent.ts) running in a namespace: `url` is its
 * http://127.0.0.1:PORT there; `request` sends one op (load, upsert, remove) and resolves with the answer.
 */
export class ApiServerAgent {
  readonly url: string;
  readonly #daemon: Daemon;
  readonly #channel: JsonLineChannel;

  private constructor(daemon: Daemon, url: string, channel: JsonLineChannel) {
    this.#daemon = daemon;
    this.url = url;
    this.#channel = channel;
  }

  /** Spawns the agent in `ns` and waits for its ready line (which carries the chosen port). */
  static async start(sandbox: Sandbox, ns: string, log: (line: string) => void): Promise<ApiServerAgent> {
    const daemon = new Daemon('apiserver', sandbox.spawnIn(ns, process.execPath, [API_AGENT]));
    const channel = new JsonLineChannel(daemon, `API stand-in in ${ns}`);
    daemon.exited.then((code) => {
      if (!daemon.stopping) log(`! API stand-in exited on its own (${code}): ${daemon.tail(5)}`);
      channel.answerPending({ ok: false, error: 'API stand-in exited' });
    });
    const ready = await channel.ready;
    return new ApiServerAgent(daemon, String(ready['url']), channel);
  }

  get pid(): number {
    return this.#daemon.pid;
  }

  get running(): boolean {
    return this.#daemon.running;
  }

  /** One op; rejects when no answer comes within `deadlineMs`. */
  request<T = Record<string, unknown>>(op: string, args: object = {}, deadlineMs = 60_000): Promise<T> {
    if (!this.#daemon.running) return Promise.reject(new Error('API stand-in is not running'));
    return this.#channel.request<T>(op, args, deadlineMs);
  }

  /** Asks it to stop (closing the proxy's watches), then SIGTERM/SIGKILL if it does not exit. */
  async stop(): Promise<void> {
    this.#daemon.stopping = true;
    if (!this.#daemon.running) return;
    await Promise.race([this.request('stop', {}, 2_000).catch(() => {}), this.#daemon.exited]);
    this.#daemon.child.stdin?.end();
    await this.#daemon.stop(2_000);
  }

  tail(n = 20): string {
    return this.#daemon.tail(n);
  }
}

/** iperf3 server's normal output, and HAProxy's start-up notice: not worth a report line. */
const IPERF_CHATTER =
  /^\s*$|^(Server listening|Accepted connection|iperf Done|\[NOTICE\])|^[\s-]+$|^\s*\[\s*(\d+|ID|SUM)\]/;
/** An iperf3 test ends by closing its data connections under a sender: nginx logs a broken pipe or reset. */
const IPERF_TEARDOWN = new RegExp(`(Broken pipe|reset by peer).*upstream: "[\\d.]+:${NET.iperfPort}"`);

type ClusterIPs = { readonly http: string; readonly iperf: string; readonly dns: string };
type Topology = {
  node: string;
  node2: string;
  node3: string | undefined;
  client: string;
  backends: string[];
};

/**
 * A switch namespace with a bridge, and every other namespace on it through its own veth pair: node
 * (10.244.0.1, the pods' gateway), node2 (10.244.0.2) and, with `withNode3`, node3 (10.244.0.3) are
 * reached the same way, so the proxies (and the peers on the node) pay the same hops. The nodes also
 * get an "ext0" that leads nowhere, with the default route, for the proxy's node-IP detection.
 */
async function buildTopology(sb: Sandbox, withNode3: boolean): Promise<Topology> {
  const sw = await sb.createNamespace('switch');
  await sb.bridge(sw, 'br0');
  let port = 0;
  const plug = async (name: string, ip: string) => {
    const ns = await sb.createNamespace(name);
    const p = `p${port++}`;
    await sb.veth({ ns, name: 'eth0' }, { ns: sw, name: p });
    await sb.attach(sw, p, 'br0');
    await sb.addAddress(ns, 'eth0', `${ip}/24`);
    return ns;
  };
  const nodes: string[] = [];
  const nodeSpecs: (readonly [string, string, string])[] = [
    ['node', '10.244.0.1', NET.nodeIP],
    ['node2', NET.node2IP, '192.168.51.2'],
  ];
  if (withNode3) nodeSpecs.push(['node3', NET.node3IP, '192.168.52.2']);
  for (const [name, ip, ext] of nodeSpecs) {
    const ns = await plug(name, ip);
    await sb.dummy(ns, 'ext0');
    await sb.addAddress(ns, 'ext0', `${ext}/24`);
    await sb.defaultRoute(ns, ext.replace(/\.\d+$/, '.1'), 'ext0');
    nodes.push(ns);
  }
  const pods: string[] = [];
  for (const [i, ip] of [NET.client, ...NET.backends].entries()) {
    const ns = await plug(`pod${i}`, ip);
    await sb.defaultRoute(ns, '10.244.0.1', 'eth0');
    pods.push(ns);
  }
  const [client, ...backends] = pods;
  for (const [i, ns] of backends.entries())
    for (const ip of NET.secondaryIPs[i] ?? []) await sb.addAddress(ns, 'eth0', `${ip}/24`);
  await sb.exec(client!, 'ip', ['route', 'add', '10.97.0.0/16', 'via', NET.node2IP, 'dev', 'eth0']);
  if (withNode3)
    await sb.exec(client!, 'ip', ['route', 'add', '10.98.0.0/16', 'via', NET.node3IP, 'dev', 'eth0']);
  return { node: nodes[0]!, node2: nodes[1]!, node3: nodes[2], client: client!, backends };
}

/** A process's command line ('' once it is gone). */
function cmdlineOf(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ');
  } catch {
    return '';
  }
}

function removeOnExit(dir: string): void {
  const rm = () => rmSync(dir, { recursive: true, force: true });
  process.once('exit', rm);
  // Removes itself, so the sandbox's handler (which re-raises the signal) still ends the process.
  for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
    const onSignal = () => {
      rm();
      process.removeListener(signal, onSignal);
    };
    process.prependListener(signal, onSignal);
  }
}
