// Builds the parts from a Config, starts them in order (servers, proxier, source, sync loop) and closes
// them in reverse. The only place that knows how the parts fit together.
import net from 'node:net';
import type { Config } from './config/config.ts';
import { ProxyError } from './lib/errors.ts';
import type { Logger } from './lib/log.ts';
import { parsePortRange } from './lib/port-range.ts';
import { DEFAULT_OUTLIER_OPTIONS } from './loadbalancer/outlier.ts';
import { applyConntrackSettings, realSysctl, type Sysctl } from './netfilter/conntrack-settings.ts';
import { createIptables, type Iptables, run } from './netfilter/iptables.ts';
import { IptablesPortals } from './netfilter/iptables-portals.ts';
import {
  type LocalTrafficDetector,
  localDetectOptions,
  localTrafficDetector,
} from './netfilter/local-detect.ts';
import type { FamilyConfig } from './netfilter/netfilter.ts';
import { Netfilter } from './netfilter/netfilter.ts';
import {
  chooseNodeIP,
  type HostInfo,
  nodePortClaimHosts,
  readHostInfo,
  resolveNodePortAddresses,
} from './netfilter/node-ip.ts';
import { createShellRun, type ShellRun } from './netfilter/shell-run.ts';
import { BoundedFrequencyRunner } from './proxier/bounded-frequency-runner.ts';
import { PortAllocator } from './proxier/port-allocator.ts';
import type { PortalProgrammer } from './proxier/portal-programmer.ts';
import {
  CAP_NET_ADMIN,
  hasCapability,
  readEffectiveCapabilities,
  readFdLimits,
  udpSessionCap,
} from './proxier/process-limits.ts';
import { Proxier } from './proxier/proxier.ts';
import { registerResourceMetrics } from './proxier/resource-metrics.ts';
import { resolveStateFile, StateFile } from './proxier/state-file.ts';
import { DEFAULT_TCP_OPTIONS } from './relay/tcp.ts';
import { DEFAULT_UDP_OPTIONS } from './relay/udp.ts';
import { debugServices } from './server/debug.ts';
import type { HttpServer } from './server/http.ts';
import { sendJSON, sendText, startHttpServer } from './server/http.ts';
import type { ProxyMetrics } from './server/metrics.ts';
import { createMetrics } from './server/metrics.ts';
import { ProxyHealth } from './server/proxy-health.ts';
import { ServiceHealthServer, type ServiceName } from './server/service-health.ts';
import { traceRoutes } from './server/trace-routes.ts';
import { KubernetesSource, loadKubeConfig } from './source/kubernetes.ts';
import { ManifestSource } from './source/manifest.ts';
import { isNodeEligible, nodeInternalIP, nodePodCIDRs } from './source/node-info.ts';
import type { Node } from './source/objects.ts';
import { ProxyState } from './state/proxy-state.ts';
import type { IPFamily } from './state/service-port.ts';
import type { Snapshot } from './state/snapshot.ts';
import { ConnectionTable } from './trace/connection-table.ts';
import { createTracer, type Tracer } from './trace/tracer.ts';

export type ProxyServerDeps = {
  log: Logger;
  hostname?: string;
  /** The iptables runner (tests inject one that runs inside a network namespace). */
  iptables?: Iptables;
  /** The host's routes and interfaces (tests inject them). */
  hostInfo?: () => HostInfo;
  /** Conntrack sysctls (--conntrack-*). Default: the real /proc/sys with the real iptables, none otherwise. */
  sysctl?: Sysctl;
};

/** How long the first sync waits for this Node (its InternalIPs are the node IPs); then it goes on without. */
const NODE_WAIT_MS = 5_000;

/**
 * The families to program and their node IPs: the bind IP's family, or every family the host has. The
 * node IP of a family is the bind IP, else `node`'s InternalIP (when the host has it), else the
 * default-route guess; `--nodeport-addresses primary` resolves to those IPs.
 */
export function familyConfigs(config: Config, info: HostInfo, log: Logger, node?: Node): FamilyConfig[] {
  const all = config.bindAddress === '0.0.0.0' || config.bindAddress === '::';
  const families: IPFamily[] = all ? ['IPv4', 'IPv6'] : [config.bindAddress.includes(':') ? 'IPv6' : 'IPv4'];
  const hostIPs: Partial<Record<IPFamily, string>> = {};
  for (const family of families) {
    if (!all) {
      hostIPs[family] = config.bindAddress;
      continue;
    }
    const { ip, ignoredNodeIP } = chooseNodeIP(info, family, nodeInternalIP(node, family));
    if (ignoredNodeIP !== undefined)
      log.warn(
        { family, nodeIP: ignoredNodeIP, hostIP: ip },
        "The Node's InternalIP is not on this host; not using it",
      );
    if (ip !== undefined) hostIPs[family] = ip;
  }
  const nodePortAddresses = resolveNodePortAddresses(config.nodePortAddresses, hostIPs);
  const out: FamilyConfig[] = [];
  for (const family of families) {
    const hostIP = hostIPs[family];
    if (hostIP === undefined) {
      log.warn({ family }, 'No node IP of this family; its services get no rules');
      continue;
    }
    const bindAddress = all ? (family === 'IPv4' ? '0.0.0.0' : '::') : config.bindAddress;
    out.push({ family, bindAddress, hostIP, nodePortAddresses });
  }
  return out;
}

/** The running proxy. */
export class ProxyServer {
  readonly config: Config;
  readonly log: Logger;
  readonly state: ProxyState;
  readonly proxier: Proxier;
  readonly health: ProxyHealth;
  readonly metrics: ProxyMetrics;
  readonly runner: BoundedFrequencyRunner;
  readonly nodeName: string;
  /** The iptables portals; undefined with --no-iptables. */
  readonly portals: IptablesPortals | undefined;
  readonly #preferredPorts = new Map<string, number>();
  readonly #fdLimits = readFdLimits();
  /** The real iptables runs as this process: it needs NET_ADMIN (an injected one, in tests, does not). */
  readonly #needsNetAdmin: boolean;
  #stateFile: StateFile | undefined;
  /** Active and recently closed connections, and the live trace stream (--trace). */
  readonly connections: ConnectionTable;
  readonly tracer: Tracer;
  manifest: ManifestSource | undefined;
  kubernetes: KubernetesSource | undefined;
  /** Health check node ports of LoadBalancer services with externalTrafficPolicy: Local. */
  readonly serviceHealth: ServiceHealthServer;
  healthServer: HttpServer | undefined;
  metricsServer: HttpServer | undefined;
  #closing: Promise<void> | undefined;
  /** Starts iptables and friends (undefined when tests inject an Iptables). */
  #shellRun: ShellRun | undefined;
  /** An endpoint-only change is waiting for the next tick (see #onStateChange). */
  #endpointsQueued = false;
  /** The state's change totals already added to the metrics. */
  #countedServiceChanges = 0;
  #countedEndpointChanges = 0;
  /** The families Netfilter programs (its own array: a Node change replaces entries in place). */
  #families: FamilyConfig[] | undefined;
  #hostInfo: () => HostInfo = readHostInfo;
  readonly #sysctl: Sysctl | undefined;
  /** This Node (API source only): node IPs, podCIDRs for NodeCIDR, eligibility for /healthz. */
  #node: Node | undefined;

  constructor(config: Config, deps: ProxyServerDeps) {
    this.config = config;
    this.log = deps.log;
    this.nodeName = config.hostnameOverride || (deps.hostname ?? '').toLowerCase();
    this.#needsNetAdmin = config.iptables && deps.iptables === undefined;
    this.health = new ProxyHealth(2 * config.iptablesSyncPeriodMs);
    this.metrics = createMetrics(() => this.proxier);
    registerResourceMetrics(this.metrics.registry, () => this.proxier);
    this.state = new ProxyState({
      nodeName: this.nodeName,
      warn: (msg, fields) => this.log.child({ component: 'state' }).warn(fields, msg),
      onChange: () => this.#onStateChange(),
    });
    this.serviceHealth = new ServiceHealthServer({
      log: this.log.child({ component: 'service-health' }),
      proxyHealthy: () => this.health.isLive(Date.now()),
    });
    this.#sysctl = config.iptables
      ? (deps.sysctl ?? (deps.iptables === undefined ? realSysctl : undefined))
      : undefined;
    this.connections = new ConnectionTable({ maxRecent: config.traceRecentConnections });
    this.tracer = createTracer({
      mode: config.trace,
      table: this.connections,
      accessLog: config.accessLog ? this.log.child({ component: 'access' }) : undefined,
    });
    const allocator = new PortAllocator(parsePortRange(config.proxyPortRange));
    let portals: PortalProgrammer | undefined;
    let nodePortHosts: (() => string[] | undefined) | undefined;
    if (config.iptables) {
      // iptables, iptables-restore and conntrack start from a kept shell: a process start from Node
      // blocks it 5-10 ms at 10,000 service ports (see shell-run.ts).
      if (deps.iptables === undefined) this.#shellRun = createShellRun({ fallback: run });
      const iptables = deps.iptables ?? createIptables(this.#shellRun ?? run);
      const hostInfo = deps.hostInfo ?? readHostInfo;
      this.#hostInfo = hostInfo;
      const log = this.log.child({ component: 'iptables' });
      const families = familyConfigs(config, hostInfo(), log);
      this.#families = families;
      this.portals = new IptablesPortals({
        // Read at every sync: under NodeCIDR the Node's podCIDRs may arrive after start-up.
        netfilter: new Netfilter({ iptables, log, families, localDetector: (f) => this.localDetectorFor(f) }),
        iptables,
        families: families.map((f) => f.family),
        log,
        hostInfo,
      });
      portals = this.portals;
      nodePortHosts = () => nodePortClaimHosts(families, hostInfo());
    }
    this.proxier = new Proxier(
      {
        listenHost: config.bindAddress === '0.0.0.0' ? '::' : config.bindAddress,
        syncPeriodMs: config.iptablesSyncPeriodMs,
        tcp: {
          ...DEFAULT_TCP_OPTIONS,
          idleTimeoutMs: config.tcpIdleTimeoutMs,
          halfCloseTimeoutMs: config.tcpHalfCloseTimeoutMs,
          maxConnections: config.maxConnectionsPerService,
        },
        udp: {
          ...DEFAULT_UDP_OPTIONS,
          idleTimeoutMs: config.udpTimeoutMs,
          maxSessions: config.udpMaxSessions,
        },
        udpMaxTotalSessions: udpSessionCap(config.udpMaxSessionsTotal, this.#fdLimits),
        claimNodePorts: config.iptables,
        outlier:
          config.outlierConsecutiveFailures > 0
            ? {
                ...DEFAULT_OUTLIER_OPTIONS,
                consecutiveFailures: config.outlierConsecutiveFailures,
                baseEjectionMs: config.outlierBaseEjectionMs,
              }
            : undefined,
        nodePortHosts,
      },
      {
        source: this.state,
        allocator,
        portals,
        log: this.log.child({ component: 'proxier' }),
        preferredPorts: this.#preferredPorts,
        observerFor: this.tracer.observerFor,
        onProxyPortsChanged: (ports) => this.#stateFile?.save(ports),
      },
    );
    this.runner = new BoundedFrequencyRunner(
      'userspace-proxy-sync-runner',
      () => this.#sync(),
      config.iptablesMinSyncPeriodMs,
      config.iptablesSyncPeriodMs,
      {
        onError: (err) => {
          if (err instanceof ProxyError && err.code === 'KUP_ERR_IPTABLES_RESTORE')
            this.metrics.iptablesRestoreFailures.inc();
          this.proxier.requestFullSync();
          this.log.error({ err }, 'Sync failed');
        },
      },
    );
  }

  /**
   * A change is pending. Endpoint-only changes are applied straight away (once per tick: a watch chunk
   * often carries several events); everything else goes through the rate-limited sync runner.
   */
  #onStateChange(): void {
    if (this.state.onlyEndpointsPending && this.proxier.lastSyncMs !== 0 && !this.proxier.syncing) {
      if (!this.#endpointsQueued) {
        this.#endpointsQueued = true;
        setImmediate(() => this.#applyEndpointChanges());
      }
      return;
    }
    this.#queueSync();
  }

  #applyEndpointChanges(): void {
    this.#endpointsQueued = false;
    const snapshot = this.proxier.applyEndpointChanges();
    if (snapshot === undefined) {
      // A Service changed meanwhile, or a sync started: the runner takes it all.
      if (this.state.pendingEndpointChanges > 0 || this.state.pendingServiceChanges > 0) this.#queueSync();
      return;
    }
    this.#recordApplied(snapshot);
    // A list that became empty or stopped being empty changes the rules (REJECT / DROP): a sync.
    if (this.proxier.portalsPending) this.#queueSync();
    // Health check node ports report local endpoints: only theirs need a look.
    let healthChecked = false;
    for (const key of snapshot.changedEndpoints)
      if ((snapshot.servicePorts.get(key)?.healthCheckNodePort ?? 0) !== 0) healthChecked = true;
    if (healthChecked)
      void this.#syncServiceHealth().catch((err: unknown) =>
        this.log.error({ err }, 'Failed to update the service health servers'),
      );
  }

  #queueSync(): void {
    const now = Date.now();
    this.health.queuedUpdate(now);
    this.metrics.lastQueued.set(now / 1000);
    if (this.state.isInitialized) this.runner.run();
  }

  async #sync(): Promise<void> {
    // proxier.sync() checks the state out synchronously, before its first await.
    this.health.syncStarted();
    const result = await this.proxier.sync();
    if (result === undefined) return;
    const now = Date.now();
    this.health.updated(now);
    this.metrics.syncDuration.observe(result.durationMs / 1000);
    this.metrics.lastSync.set(now / 1000);
    const snapshot = this.proxier.snapshot;
    if (snapshot !== undefined) this.#recordApplied(snapshot);
    await this.#syncServiceHealth();
    if (this.log.isLevelEnabled('debug')) this.log.debug({ ...result }, 'Synced');
  }

  /** Change counters (every handler call up to now) and network programming latency of an applied checkout. */
  #recordApplied(snapshot: Snapshot): void {
    const now = Date.now();
    const { serviceChangesTotal, endpointChangesTotal } = this.state;
    this.metrics.serviceChangesTotal.inc(serviceChangesTotal - this.#countedServiceChanges);
    this.metrics.endpointChangesTotal.inc(endpointChangesTotal - this.#countedEndpointChanges);
    this.#countedServiceChanges = serviceChangesTotal;
    this.#countedEndpointChanges = endpointChangesTotal;
    for (const t of snapshot.triggerTimes) {
      if (t <= now) this.metrics.networkProgrammingDuration.observe((now - t) / 1000);
    }
  }

  /** kube-proxy's per-service health check node ports: opened, closed and answered after each sync. */
  async #syncServiceHealth(): Promise<void> {
    const snapshot = this.proxier.snapshot;
    if (snapshot === undefined) return;
    const ports = new Map<number, ServiceName>();
    const local = new Map<string, number>();
    for (const sp of snapshot.servicePorts.values()) {
      if (sp.healthCheckNodePort === 0) continue;
      ports.set(sp.healthCheckNodePort, { namespace: sp.namespace, name: sp.serviceName });
      const key = `${sp.namespace}/${sp.serviceName}`;
      const count = snapshot.endpoints.get(sp.key)?.localReadyCount ?? 0;
      local.set(key, Math.max(local.get(key) ?? 0, count));
    }
    this.serviceHealth.syncEndpoints(local);
    await this.serviceHealth.syncServices(ports);
  }

  /** Starts the servers, the listener for the default IPv6 check, the source and the sync loop. */
  async start(): Promise<void> {
    this.log.info(
      {
        soft: this.#fdLimits?.soft,
        hard: this.#fdLimits?.hard,
        udpMaxSessionsTotal: this.proxier.udpBudget?.max,
      },
      'File descriptor limit',
    );
    const caps = readEffectiveCapabilities();
    if (this.#needsNetAdmin && caps !== undefined && !hasCapability(caps, CAP_NET_ADMIN))
      throw new ProxyError(
        'KUP_ERR_PERMISSION',
        'missing capability NET_ADMIN, needed to write iptables rules (grant it, or run with --no-iptables)',
      );
    // The shell is started while this process is small (its own start is a fork of this process).
    this.#shellRun?.start();
    if (this.#sysctl !== undefined)
      await applyConntrackSettings(
        {
          maxPerCore: this.config.conntrackMaxPerCore,
          min: this.config.conntrackMin,
          tcpEstablishedTimeoutMs: this.config.conntrackTcpEstablishedTimeoutMs,
          tcpCloseWaitTimeoutMs: this.config.conntrackTcpCloseWaitTimeoutMs,
        },
        { sysctl: this.#sysctl, log: this.log.child({ component: 'conntrack' }) },
      );
    await this.#startServers();
    if (this.config.bindAddress === '0.0.0.0' && !(await canListenDualStack())) {
      this.log.warn('IPv6 is not available; listening on IPv4 only');
      this.proxier.setListenHost('0.0.0.0');
    }
    if (this.portals !== undefined) {
      for (const [key, port] of await this.portals.previousProxyPorts()) this.#preferredPorts.set(key, port);
      if (this.#preferredPorts.size > 0) {
        this.log.info(
          { servicePorts: this.#preferredPorts.size },
          'Reusing the proxy ports of the rules in place',
        );
      }
    }
    // After the rules: the file wins, and it also covers --no-iptables, where there are no rules.
    const stateFile = await resolveStateFile(this.config.stateFile);
    if (stateFile !== undefined) {
      this.#stateFile = new StateFile(stateFile, this.log.child({ component: 'state-file' }));
      const ports = await this.#stateFile.load();
      for (const [key, port] of ports) this.#preferredPorts.set(key, port);
      this.log.info(
        { file: stateFile, servicePorts: ports.size },
        'Reusing the proxy ports of the state file',
      );
    }
    if (this.config.manifest !== undefined) {
      this.manifest = new ManifestSource(
        this.config.manifest,
        this.state,
        this.log.child({ component: 'manifest' }),
        { nodeName: this.nodeName },
      );
      await this.manifest.start();
    } else {
      // Nothing is programmed until Services and EndpointSlices are listed; health says not ready until then.
      this.kubernetes = new KubernetesSource({
        kubeConfig: loadKubeConfig({ kubeconfig: this.config.kubeconfig, master: this.config.master }),
        handlers: this.state,
        nodeName: this.nodeName,
        log: this.log.child({ component: 'kubernetes' }),
        configSyncPeriodMs: this.config.configSyncPeriodMs,
        onNode: (node) => this.#onNode(node),
      });
      await this.kubernetes.start();
      if (this.#families !== undefined) {
        // The first sync waits (bounded) for this Node: its InternalIPs are the node IPs of the rules.
        const source = this.kubernetes;
        let timer: NodeJS.Timeout | undefined;
        const waited = new Promise<void>((r) => {
          timer = setTimeout(r, NODE_WAIT_MS);
        });
        void Promise.race([source.nodeListed, waited]).then(() => {
          clearTimeout(timer);
          if (this.#closing === undefined) this.runner.start();
        });
        return;
      }
    }
    this.runner.start();
  }

  /**
   * This Node changed: its eligibility goes to /healthz at once; changed node IPs (InternalIPs, and
   * `--nodeport-addresses primary`) or podCIDRs (NodeCIDR) are logged and used from the next sync, which
   * is full. (kube-proxy exits and is restarted instead.)
   */
  #onNode(node: Node | undefined): void {
    const before = this.#node;
    this.#node = node;
    this.health.setNodeEligible(node !== undefined && isNodeEligible(node));
    const families = this.#families;
    let changed =
      nodePodCIDRs(before).join() !== nodePodCIDRs(node).join() && this.config.detectLocalMode === 'NodeCIDR';
    const ipsOf = (n: Node | undefined) => `${nodeInternalIP(n, 'IPv4')} ${nodeInternalIP(n, 'IPv6')}`;
    if (families !== undefined && ipsOf(before) !== ipsOf(node)) {
      const log = this.log.child({ component: 'iptables' });
      const next = familyConfigs(this.config, this.#hostInfo(), log, node);
      for (const [i, f] of families.entries()) {
        const n = next.find((x) => x.family === f.family);
        if (
          n === undefined ||
          (n.hostIP === f.hostIP && n.nodePortAddresses.join() === f.nodePortAddresses.join())
        )
          continue;
        this.log.info(
          { family: f.family, nodeIP: n.hostIP, nodePortAddresses: n.nodePortAddresses },
          'Node IP changed',
        );
        families[i] = { ...f, hostIP: n.hostIP, nodePortAddresses: n.nodePortAddresses };
        changed = true;
      }
    }
    if (changed && this.proxier.lastSyncMs !== 0) {
      this.proxier.requestFullSync();
      this.#queueSync();
    }
  }

  /**
   * The local traffic detector of `family` (--detect-local-mode), for the rules; undefined when the
   * mode has nothing for that family. NodeCIDR reads the Node's spec.podCIDRs as known now.
   */
  localDetectorFor(family: IPFamily): LocalTrafficDetector | undefined {
    return localTrafficDetector(localDetectOptions(this.config, nodePodCIDRs(this.#node)), family);
  }

  /** The families programmed now, with their node IPs and resolved nodePortAddresses ([] with --no-iptables). */
  get families(): readonly FamilyConfig[] {
    return this.#families ?? [];
  }

  async #startServers(): Promise<void> {
    const hardFail = this.config.bindAddressHardFail;
    const start = async (name: string, address: string, routes: Parameters<typeof startHttpServer>[1]) => {
      if (address === '') return undefined;
      try {
        return await startHttpServer(address, routes);
      } catch (err) {
        if (hardFail)
          throw new ProxyError(
            'KUP_ERR_LISTEN',
            `cannot start the ${name} server on ${address}: ${(err as Error).message}`,
            { cause: err },
          );
        this.log.error({ err, address }, `Failed to start the ${name} server`);
        return undefined;
      }
    };
    this.healthServer = await start('healthz', this.config.healthzBindAddress, {
      '/healthz': (_req, res) => {
        const s = this.health.status(Date.now());
        sendJSON(res, s.healthy ? 200 : 503, {
          lastUpdated: s.lastUpdated,
          currentTime: s.currentTime,
          healthy: s.healthy,
          nodeEligible: s.nodeEligible,
          reason: s.reason,
        });
      },
      '/livez': (_req, res) => {
        const now = Date.now();
        const s = this.health.status(now, { requireSynced: false });
        sendJSON(res, s.healthy ? 200 : 503, {
          lastUpdated: s.lastUpdated,
          currentTime: s.currentTime,
          healthy: s.healthy,
        });
      },
    });
    this.metricsServer = await start('metrics', this.config.metricsBindAddress, {
      '/metrics': async (_req, res) =>
        sendText(res, 200, await this.metrics.registry.metrics(), this.metrics.registry.contentType),
      '/proxyMode': (_req, res) => sendText(res, 200, 'userspace'),
      // As kube-proxy's /configz: the effective configuration, keyed by its API group.
      '/configz': (_req, res) => sendJSON(res, 200, { 'kubeproxy.config.k8s.io': this.config }),
      '/healthz': (_req, res) => sendText(res, 200, 'ok'),
      ...traceRoutes(this.tracer, this.connections),
      '/debug/services': (_req, res) =>
        sendJSON(
          res,
          200,
          debugServices(this.proxier.status(), this.proxier.failures(), this.proxier.nodePortErrors()),
        ),
    });
  }

  /**
   * Stops accepting, lets established connections finish for up to the grace period, then closes
   * everything in reverse order. Rules stay in place (the next process replaces them).
   */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      await this.manifest?.stop();
      await this.kubernetes?.stop();
      await this.runner.stop();
      await this.proxier.close();
      const deadline = Date.now() + this.config.shutdownGracePeriodMs;
      while (this.proxier.activeConnections() > 0 && Date.now() < deadline)
        await new Promise((r) => setTimeout(r, 50));
      const left = this.proxier.activeConnections();
      if (left > 0) this.log.warn({ connections: left }, 'Grace period over, closing connections');
      this.proxier.destroy();
      await this.#stateFile?.flush();
      await Promise.all([
        this.metricsServer?.close(),
        this.healthServer?.close(),
        this.serviceHealth.close(),
      ]);
      this.#shellRun?.close();
    })();
    return this.#closing;
  }
}

async function canListenDualStack(): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.once('error', () => resolve(false));
    s.listen({ host: '::', port: 0 }, () => s.close(() => resolve(true)));
  });
}
