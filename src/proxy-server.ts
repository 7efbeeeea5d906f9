// Builds the parts from a Config, starts them in order (servers, proxier, source, sync loop) and closes
// them in reverse. The only place that knows how the parts fit together.
import net from 'node:net';
import type { Config } from './config/config.ts';
import { ProxyError } from './lib/errors.ts';
import { closeParts, type Part, startParts } from './lib/lifecycle.ts';
import type { Logger } from './lib/log.ts';
import { MallocTrimmer, processMallocTrim } from './lib/malloc-trim.ts';
import { parsePortRange } from './lib/port-range.ts';
import { applyConntrackSettings, realSysctl, type Sysctl } from './netfilter/conntrack-settings.ts';
import { createIptables, type Iptables, run } from './netfilter/iptables.ts';
import { IptablesPortals } from './netfilter/iptables-portals.ts';
import { Netfilter } from './netfilter/netfilter.ts';
import { type HostInfo, nodePortClaimHosts, readHostInfo } from './netfilter/node-ip.ts';
import { NodeNetwork } from './netfilter/node-network.ts';
import { createShellRun, type ShellRun } from './netfilter/shell-run.ts';
import type { BoundedFrequencyRunner } from './proxier/bounded-frequency-runner.ts';
import { createPortAllocator } from './proxier/port-allocator.ts';
import type { PortalProgrammer } from './proxier/portal-programmer.ts';
import {
  CAP_NET_ADMIN,
  hasCapability,
  readEffectiveCapabilities,
  readFdLimits,
  tcpConnectionCap,
} from './proxier/process-limits.ts';
import { Proxier } from './proxier/proxier.ts';
import { proxierOptions, workerCount } from './proxier/proxier-options.ts';
import { registerResourceMetrics } from './proxier/resource-metrics.ts';
import { resolveStateFile, StateFile } from './proxier/state-file.ts';
import { lockStateFile, type StateFileLock } from './proxier/state-file-lock.ts';
import { SyncLoop } from './proxier/sync-loop.ts';
import type { ServicePortStats } from './relay/service-context.ts';
import { processTcpAcceptSupport } from './relay/tcp-accept.ts';
import { processTcpFin } from './relay/tcp-fin.ts';
import { processTcpOffload } from './relay/tcp-offload.ts';
import { processUdpFast } from './relay/udp-fast.ts';
import { debugRoutes } from './server/debug.ts';
import { healthRoutes } from './server/health-routes.ts';
import type { HttpServer, Route } from './server/http.ts';
import { startHttpServer } from './server/http.ts';
import { type HttpLimits, PROBE_CLIENT_LIMIT } from './server/http-guard.ts';
import type { ProxyMetrics } from './server/metrics.ts';
import { createMetrics, metricsRoutes } from './server/metrics.ts';
import { ProxyHealth } from './server/proxy-health.ts';
import { ServiceHealthServer } from './server/service-health.ts';
import { registerTraceMetrics } from './server/trace-metrics.ts';
import { traceRoutes } from './server/trace-routes.ts';
import { uiRoutes } from './server/ui-routes.ts';
import { KubernetesSource, loadApiCredentials } from './source/kubernetes.ts';
import { ManifestSource } from './source/manifest.ts';
import { isNodeEligible, nodeInternalIP, nodePodCIDRs } from './source/node-info.ts';
import type { Node } from './source/objects.ts';
import { ProxyState } from './state/proxy-state.ts';
import { type ServicePortKey, servicePortKey } from './state/service-port.ts';
import type { Snapshot } from './state/snapshot.ts';
import type { ConnectionListing, ListOptions } from './trace/connection-table.ts';
import { ConnectionTable } from './trace/connection-table.ts';
import { createTracer, type Tracer } from './trace/tracer.ts';
import { mergeListings, mergeStats } from './workers/merge.ts';
import { fullTable, tableDelta } from './workers/messages.ts';
import { WorkerPool } from './workers/worker-pool.ts';

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

/** The metrics server's routes that read service port counters (Proxier.status()). */
const COUNTER_ROUTES = ['/metrics', '/debug/services', '/ui/api/overview', '/ui/api/services'] as const;

/** How long the first sync waits for this Node (its InternalIPs are the node IPs); then it goes on without. */
const NODE_WAIT_MS = 5_000;

/** How long a part other than the listeners may take to close before it is destroyed. */
const PART_CLOSE_BOUND_MS = 5_000;

/** The running proxy. */
export class ProxyServer {
  readonly config: Config;
  readonly log: Logger;
  readonly state: ProxyState;
  readonly proxier: Proxier;
  readonly health: ProxyHealth;
  readonly metrics: ProxyMetrics;
  /** The sync loop's runner (start/stop). */
  readonly runner: BoundedFrequencyRunner;
  /** When the proxier syncs, and the endpoint fast path. */
  readonly syncLoop: SyncLoop;
  readonly nodeName: string;
  /** The iptables portals; undefined with --no-iptables. */
  readonly portals: IptablesPortals | undefined;
  readonly #preferredPorts = new Map<string, number>();
  readonly #fdLimits = readFdLimits();
  /** Processes relaying traffic: this one and its workers (--workers). */
  readonly #processes: number;
  /** The worker processes; undefined with one process. */
  readonly workers: WorkerPool | undefined;
  /** Proxy ports that changed since the workers were last told (undefined: gone). */
  readonly #workerPortChanges = new Map<string, number | undefined>();
  /**
   * A sync failed after checking its changes out: the workers never heard of its service ports (a
   * delta names only the next checkout's), so the next sync that succeeds sends them the whole table.
   */
  #workersBehind = false;
  /** The workers were started (after the first sync: #startWorkers). */
  #workersStarted = false;
  // After the cold start's sync (and any other that opened or closed many listeners), malloc's free pages go back.
  readonly #trimmer = new MallocTrimmer(processMallocTrim().calls);
  /** The workers' counters as of the last request that read them, by service port. */
  #workerStats = new Map<ServicePortKey, ServicePortStats[]>();
  #workerStatsRefresh: Promise<void> | undefined;
  /** The real iptables runs as this process: it needs NET_ADMIN (an injected one, in tests, does not). */
  readonly #needsNetAdmin: boolean;
  #stateFile: StateFile | undefined;
  #stateFileLock: StateFileLock | undefined;
  #stateFilePath: string | undefined;
  /** Active and recently closed connections, and the live trace stream (--trace). */
  readonly connections: ConnectionTable;
  readonly tracer: Tracer;
  manifest: ManifestSource | undefined;
  kubernetes: KubernetesSource | undefined;
  /** Health check node ports of LoadBalancer services with externalTrafficPolicy: Local. */
  readonly serviceHealth: ServiceHealthServer;
  healthServer: HttpServer | undefined;
  metricsServer: HttpServer | undefined;
  #closing: Promise<ProxyError[]> | undefined;
  /** The parts start() has started, in order: what close() closes. */
  readonly #started: Part[] = [];
  #starting: Promise<void> | undefined;
  /** Starts iptables and friends (undefined when tests inject an Iptables). */
  #shellRun: ShellRun | undefined;
  /** The node's addresses for the rules (iptables only); a Node change updates it in place. */
  #network: NodeNetwork | undefined;
  readonly #sysctl: Sysctl | undefined;

  constructor(config: Config, deps: ProxyServerDeps) {
    this.config = config;
    this.log = deps.log;
    this.nodeName = config.hostnameOverride || (deps.hostname ?? '').toLowerCase();
    this.#needsNetAdmin = config.iptables && deps.iptables === undefined;
    this.#processes = workerCount(config.workers);
    this.workers =
      this.#processes > 1
        ? new WorkerPool({
            count: this.#processes - 1,
            config,
            log: this.log.child({ component: 'workers' }),
            table: () => fullTable(this.proxier.snapshot, this.proxier.proxyPorts()),
            onEjection: (e) => this.proxier.applyEjection(e.key, e.endpoint, e.untilMs, e.ejections),
            listenHost: () => this.proxier.listenHost,
          })
        : undefined;
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
      onFdExhausted: (err) => this.proxier.fdPressure.exhausted('accept', Date.now(), err),
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
    registerTraceMetrics(this.metrics.registry, this.tracer);
    const allocator = createPortAllocator(parsePortRange(config.proxyPortRange), this.log);
    let portals: PortalProgrammer | undefined;
    let nodePortHosts: (() => string[] | undefined) | undefined;
    if (config.iptables) {
      // iptables, iptables-restore and conntrack start from a kept shell: a process start from Node
      // blocks it 5-10 ms at 10,000 service ports (see shell-run.ts).
      if (deps.iptables === undefined) this.#shellRun = createShellRun({ fallback: run });
      const iptables = deps.iptables ?? createIptables(this.#shellRun ?? run);
      const hostInfo = deps.hostInfo ?? readHostInfo;
      const log = this.log.child({ component: 'iptables' });
      const network = new NodeNetwork(config, hostInfo, log);
      this.#network = network;
      const families = network.families;
      this.portals = new IptablesPortals({
        // Read at every sync: under NodeCIDR the Node's podCIDRs may arrive after start-up.
        netfilter: new Netfilter({
          iptables,
          log,
          // Listener ports come from the allocator's range: KUBE-NODEPORT-NON-LOCAL accepts it whole.
          families: families.map((f) => ({ ...f, listenerPorts: allocator.range })),
          localDetector: (f) => network.localDetectorFor(f),
        }),
        iptables,
        families: families.map((f) => f.family),
        log,
        hostInfo,
      });
      portals = this.portals;
      nodePortHosts = () => nodePortClaimHosts(families, hostInfo());
    }
    this.proxier = new Proxier(
      { ...proxierOptions(config, this.#fdLimits, this.#processes), nodePortHosts },
      {
        source: this.state,
        allocator,
        portals,
        log: this.log.child({ component: 'proxier' }),
        preferredPorts: this.#preferredPorts,
        observerFor: this.tracer.observerFor,
        // No process keeps trying an endpoint one of them ejected (--workers).
        onEjection:
          this.workers === undefined
            ? undefined
            : (context, ejection) =>
                this.workers?.send({
                  t: 'ejection',
                  key: servicePortKey(context.name, context.protocol),
                  endpoint: ejection.endpoint,
                  untilMs: ejection.untilMs,
                  ejections: ejection.ejections,
                }),
        onProxyPortsChanged: (changes) => {
          this.#stateFile?.save(this.proxier.proxyPorts());
          if (this.workers !== undefined)
            for (const [key, port] of changes) this.#workerPortChanges.set(key, port);
        },
        onEndpointsApplied: (snapshot) => {
          if (this.workers !== undefined && snapshot.changedEndpoints.size > 0)
            this.workers.send(tableDelta(snapshot, 'endpoints'));
        },
      },
    );
    // What the proxy reports of a service port counts every process's connections (--workers).
    if (this.workers !== undefined)
      this.proxier.setStatsOverlay((key, own) => mergeStats(own, this.#workerStats.get(key) ?? []));
    this.syncLoop = new SyncLoop(
      { minSyncPeriodMs: config.iptablesMinSyncPeriodMs, syncPeriodMs: config.iptablesSyncPeriodMs },
      { proxier: this.proxier, source: this.state, log: this.log },
      {
        onQueued: (now) => {
          this.health.queuedUpdate(now);
          this.metrics.lastQueued.set(now / 1000);
        },
        onSyncStarted: () => this.health.syncStarted(),
        onApplied: ({ snapshot, nowMs, serviceChanges, endpointChanges }) => {
          this.metrics.serviceChangesTotal.inc(serviceChanges);
          this.metrics.endpointChangesTotal.inc(endpointChanges);
          for (const t of snapshot.triggerTimes)
            if (t <= nowMs) this.metrics.networkProgrammingDuration.observe((nowMs - t) / 1000);
        },
        onSynced: async (result, snapshot, now) => {
          if (snapshot !== undefined) this.#tellWorkers(snapshot);
          this.health.updated(now);
          this.metrics.syncDuration.observe(result.durationMs / 1000);
          this.metrics.lastSync.set(now / 1000);
          await this.#syncServiceHealth();
          this.#trimmer.afterSync(result);
          this.#startWorkers();
        },
        onEndpointsApplied: (snapshot) => {
          // Health check node ports report local endpoints: only theirs need a look.
          for (const key of snapshot.changedEndpoints) {
            if ((snapshot.servicePorts.get(key)?.healthCheckNodePort ?? 0) === 0) continue;
            void this.#syncServiceHealth().catch((err: unknown) =>
              this.log.error({ err }, 'Failed to update the service health servers'),
            );
            return;
          }
        },
        onSyncFailed: (err) => {
          this.#workersBehind = this.workers !== undefined;
          this.#startWorkers();
          if (err instanceof ProxyError && err.code === 'KUP_ERR_IPTABLES_RESTORE')
            this.metrics.iptablesRestoreFailures.inc();
        },
      },
    );
    this.runner = this.syncLoop.runner;
  }

  /**
   * The workers start once the first sync has ended (this process serves every port meanwhile): a
   * worker's start (Node's own, then its copy of the table and a listener for every port) would otherwise
   * take the node's cores from the cold start's list, sync and listeners. It is sent the whole table.
   */
  #startWorkers(): void {
    if (this.#workersStarted || this.workers === undefined) return;
    this.#workersStarted = true;
    this.workers.start();
  }

  /**
   * What a sync changed, to the workers: its service ports, and the proxy ports when they moved (its
   * endpoints went to them already, as the main process applied them: onEndpointsApplied).
   */
  #tellWorkers(snapshot: Snapshot): void {
    const pool = this.workers;
    if (pool === undefined) return;
    const changes = this.#workerPortChanges;
    if (this.#workersBehind) {
      // As a revived worker is told: every service port and proxy port, as this sync left them.
      this.#workersBehind = false;
      pool.send(fullTable(snapshot, this.proxier.proxyPorts()));
      changes.clear();
      return;
    }
    if (changes.size === 0 && snapshot.changedServicePorts.size === 0) return;
    pool.send(tableDelta(snapshot, 'service-ports', changes.size === 0 ? undefined : changes));
    changes.clear();
  }

  /** The connection table of the whole proxy: this process's and its workers', newest first. */
  async listConnections(options: ListOptions): Promise<ConnectionListing> {
    const own = this.connections.list(options);
    if (this.workers === undefined) return own;
    return mergeListings([own, ...(await this.workers.connections(options))], options.limit);
  }

  /** Fetches the workers' counters (one request at a time; those waiting share it). */
  refreshWorkerStats(): Promise<void> {
    const pool = this.workers;
    if (pool === undefined) return Promise.resolve();
    this.#workerStatsRefresh ??= pool
      .stats()
      .then((perWorker) => {
        const merged = new Map<ServicePortKey, ServicePortStats[]>();
        for (const stats of perWorker)
          for (const [key, s] of stats) {
            const list = merged.get(key);
            if (list === undefined) merged.set(key, [s]);
            else list.push(s);
          }
        this.#workerStats = merged;
      })
      .finally(() => {
        this.#workerStatsRefresh = undefined;
      });
    return this.#workerStatsRefresh;
  }

  /**
   * The routes that report service port counters get the workers' fresh first; the others (the
   * connection table and trace stream ask the workers themselves, the console's files, /configz) do not
   * pay for a request to every worker.
   */
  #withWorkerStats(routes: Record<string, Route>): Record<string, Route> {
    if (this.workers === undefined) return routes;
    const out: Record<string, Route> = { ...routes };
    for (const path of COUNTER_ROUTES) {
      const route = routes[path];
      if (route === undefined) continue;
      out[path] = async (req, res, url) => {
        await this.refreshWorkerStats();
        await route(req, res, url);
      };
    }
    return out;
  }

  /** A change is pending in the state: the sync loop applies endpoints at once or queues a sync. */
  #onStateChange(): void {
    this.syncLoop.onChange();
  }

  #queueSync(): void {
    this.syncLoop.queue();
  }

  /** kube-proxy's per-service health check node ports: opened, closed and answered after each sync. */
  async #syncServiceHealth(): Promise<void> {
    const snapshot = this.proxier.snapshot;
    if (snapshot !== undefined) await this.serviceHealth.syncSnapshot(snapshot);
  }

  /**
   * Checks what the proxy needs (NET_ADMIN), applies the conntrack settings, then starts the parts in
   * order (see #parts); a part that fails to start closes the ones before it.
   */
  async start(): Promise<void> {
    this.log.info(
      {
        soft: this.#fdLimits?.soft,
        hard: this.#fdLimits?.hard,
        udpMaxSessionsTotal: this.proxier.udpBudget?.max,
        maxConnectionsPerService: tcpConnectionCap(this.config.maxConnectionsPerService, this.#fdLimits),
      },
      'File descriptor limit',
    );
    const tcpFin = processTcpFin();
    if (tcpFin.error !== undefined)
      this.log.warn(
        { reason: tcpFin.error },
        "An endpoint's FIN follows its last bytes a loop turn late: clients that close on the answer keep the TIME_WAIT",
      );
    const tcpOffload = processTcpOffload();
    if (tcpOffload.error !== undefined)
      this.log.warn(
        { reason: tcpOffload.error },
        'TCP bytes are relayed through Node streams (more CPU per request and memory per connection)',
      );
    const tcpAccept = processTcpAcceptSupport();
    if (tcpAccept.error !== undefined)
      this.log.warn(
        { reason: tcpAccept.error },
        'TCP service ports listen with net.Server (more CPU per new connection and memory per service port)',
      );
    const mallocTrim = processMallocTrim();
    if (mallocTrim.error !== undefined)
      this.log.warn(
        { reason: mallocTrim.error },
        'Memory freed after the cold start stays with the process (malloc keeps its free pages)',
      );
    const udpFast = processUdpFast();
    if (udpFast.error !== undefined)
      this.log.warn(
        { reason: udpFast.error },
        'UDP sessions are relayed by JavaScript, every datagram: about a third less throughput a core',
      );
    const caps = readEffectiveCapabilities();
    if (this.#needsNetAdmin && caps !== undefined && !hasCapability(caps, CAP_NET_ADMIN))
      throw new ProxyError(
        'KUP_ERR_PERMISSION',
        'missing capability NET_ADMIN, needed to write iptables rules (grant it, or run with --no-iptables)',
      );
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
    this.#starting = startParts(this.#parts(), {
      log: this.log,
      boundMs: PART_CLOSE_BOUND_MS,
      started: this.#started,
      stopped: () => this.#closing !== undefined,
    });
    await this.#starting;
  }

  /**
   * The parts of the running proxy, in start order; close() closes them in reverse: the sync loop
   * stops, then the source, then the listeners drain (for up to --shutdown-grace-period), the proxy
   * ports are saved, and the servers and the iptables shell go last.
   */
  #parts(): Part[] {
    const parts: Part[] = [];
    // First: a second proxy on the same state file stops here, before it binds or writes anything.
    parts.push({
      name: 'state file lock',
      start: () => this.#lockStateFile(),
      close: async () => this.#stateFileLock?.release(),
    });
    const shell = this.#shellRun;
    // The shell is started while this process is small (its own start is a fork of this process).
    if (shell !== undefined)
      parts.push({
        name: 'iptables shell',
        start: async () => shell.start(),
        close: async () => shell.close(),
      });
    parts.push(
      this.#httpServer(
        'healthz',
        this.config.healthzBindAddress,
        () => healthRoutes(this.health),
        (s) => {
          this.healthServer = s;
        },
        // Every pod reaches it: one client cannot fill it.
        { maxConnectionsPerClient: PROBE_CLIENT_LIMIT },
      ),
      this.#httpServer(
        'metrics',
        this.config.metricsBindAddress,
        () =>
          this.#withWorkerStats({
            ...metricsRoutes(this.metrics, this.config),
            ...traceRoutes(
              this.tracer,
              this.connections,
              (options) => this.listConnections(options),
              this.workers === undefined
                ? undefined
                : {
                    recentLines: (filter, limit) => this.workers!.recentTraceLines(filter, limit),
                    follow: (filter, onLines) => this.workers!.followTrace(filter, onLines),
                  },
            ),
            ...debugRoutes(() => this.proxier),
            ...uiRoutes(this),
          }),
        (s) => {
          this.metricsServer = s;
        },
      ),
      { name: 'service health checks', close: () => this.serviceHealth.close() },
      {
        name: 'proxy ports',
        start: () => this.#loadPreferredPorts(),
        // After the listeners closed: what the next process reads back.
        close: async () => this.#stateFile?.flush(),
      },
      {
        name: 'service port listeners',
        start: async () => {
          if (this.config.bindAddress === '0.0.0.0' && !(await canListenDualStack())) {
            this.log.warn('IPv6 is not available; listening on IPv4 only');
            this.proxier.setListenHost('0.0.0.0');
          }
        },
        // Stops accepting; established connections finish within the grace period, then are torn down;
        // the workers drain alike, at the same time.
        close: async () => {
          await Promise.all([
            this.workers?.drain(this.config.shutdownGracePeriodMs),
            this.proxier.close().then(() => this.proxier.drained()),
          ]);
        },
        destroy: () => {
          const left = this.proxier.activeConnections();
          if (left > 0) this.log.warn({ connections: left }, 'Grace period over, closing connections');
          this.proxier.destroy();
          this.workers?.kill();
        },
        closeBoundMs: this.config.shutdownGracePeriodMs,
      },
      { name: 'source', start: () => this.#startSource(), close: () => this.#stopSource() },
      { name: 'sync loop', start: async () => this.#startSyncing(), close: () => this.runner.stop() },
    );
    return parts;
  }

  /** A health or metrics server part; `""` disables it. With --bind-address-hard-fail a failure is fatal. */
  #httpServer(
    name: string,
    address: string,
    routes: () => Record<string, Route>,
    started: (s: HttpServer) => void,
    limits: Partial<HttpLimits> = {},
  ): Part {
    let server: HttpServer | undefined;
    return {
      name: `${name} server`,
      start: async () => {
        if (address === '') return;
        try {
          server = await startHttpServer(address, routes(), {
            log: this.log.child({ component: `${name}-server` }),
            limits,
            onFdExhausted: (err) => this.proxier.fdPressure.exhausted('accept', Date.now(), err),
          });
          started(server);
        } catch (err) {
          if (this.config.bindAddressHardFail)
            throw new ProxyError(
              'KUP_ERR_LISTEN',
              `cannot start the ${name} server on ${address}: ${(err as Error).message}`,
              { cause: err },
            );
          this.log.error({ err, address }, `Failed to start the ${name} server`);
        }
      },
      close: async () => server?.close(),
    };
  }

  /** The proxy ports a previous process used: from the rules in place, then the state file (which wins). */
  async #loadPreferredPorts(): Promise<void> {
    if (this.portals !== undefined) {
      for (const [key, port] of await this.portals.previousProxyPorts()) this.#preferredPorts.set(key, port);
      if (this.#preferredPorts.size > 0) {
        this.log.info(
          { servicePorts: this.#preferredPorts.size },
          'Reusing the proxy ports of the rules in place',
        );
      }
    }
    // It also covers --no-iptables, where there are no rules.
    const stateFile = this.#stateFilePath;
    if (stateFile !== undefined) {
      this.#stateFile = new StateFile(stateFile, this.log.child({ component: 'state-file' }));
      const ports = await this.#stateFile.load();
      for (const [key, port] of ports) this.#preferredPorts.set(key, port);
      this.log.info(
        { file: stateFile, servicePorts: ports.size },
        'Reusing the proxy ports of the state file',
      );
    }
  }

  /** Resolves the state file and takes it for this process (state-file-lock.ts). */
  async #lockStateFile(): Promise<void> {
    this.#stateFilePath = await resolveStateFile(this.config.stateFile);
    if (this.#stateFilePath !== undefined) this.#stateFileLock = await lockStateFile(this.#stateFilePath);
  }

  async #startSource(): Promise<void> {
    if (this.config.manifest !== undefined) {
      this.manifest = new ManifestSource(
        this.config.manifest,
        this.state,
        this.log.child({ component: 'manifest' }),
        { nodeName: this.nodeName },
      );
      await this.manifest.start();
      return;
    }
    // Nothing is programmed until Services and EndpointSlices are listed; health says not ready until then.
    this.kubernetes = new KubernetesSource({
      credentials: await loadApiCredentials({
        kubeconfig: this.config.kubeconfig,
        master: this.config.master,
      }),
      handlers: this.state,
      nodeName: this.nodeName,
      log: this.log.child({ component: 'kubernetes' }),
      configSyncPeriodMs: this.config.configSyncPeriodMs,
      onNode: (node) => this.#onNode(node),
    });
    await this.kubernetes.start();
  }

  async #stopSource(): Promise<void> {
    await this.manifest?.stop();
    await this.kubernetes?.stop();
  }

  /**
   * Starts the sync runner. With the API and iptables, the first sync waits (bounded) for this Node:
   * its InternalIPs are the node IPs of the rules.
   */
  #startSyncing(): void {
    const source = this.kubernetes;
    if (source === undefined || this.#network === undefined) {
      this.runner.start();
      return;
    }
    let timer: NodeJS.Timeout | undefined;
    const waited = new Promise<void>((r) => {
      timer = setTimeout(r, NODE_WAIT_MS);
    });
    void Promise.race([source.nodeListed, waited]).then(() => {
      clearTimeout(timer);
      if (this.#closing === undefined) this.runner.start();
    });
  }

  /**
   * This Node changed: its eligibility goes to /healthz at once; changed node IPs (InternalIPs, and
   * `--nodeport-addresses primary`) or podCIDRs (NodeCIDR) are logged and used from the next sync, which
   * is full. (kube-proxy exits and is restarted instead.)
   */
  #onNode(node: Node | undefined): void {
    this.health.setNodeEligible(node !== undefined && isNodeEligible(node));
    const addresses =
      node === undefined
        ? undefined
        : {
            internalIPs: { IPv4: nodeInternalIP(node, 'IPv4'), IPv6: nodeInternalIP(node, 'IPv6') },
            podCIDRs: nodePodCIDRs(node),
          };
    if (this.#network?.nodeChanged(addresses) === true && this.proxier.lastSyncMs !== 0) {
      this.proxier.requestFullSync();
      this.#queueSync();
    }
  }

  /** The node's addresses and local traffic detection for the rules; undefined with --no-iptables. */
  get network(): NodeNetwork | undefined {
    return this.#network;
  }

  /**
   * Closes the parts in reverse order, each within its bound (the listeners within
   * --shutdown-grace-period, then their connections are torn down). Rules stay in place (the next
   * process replaces them). Resolves with the parts that had to be destroyed (KUP_ERR_SHUTDOWN_TIMEOUT).
   */
  close(): Promise<ProxyError[]> {
    // A start under way finishes the part it is starting first (it starts no other).
    this.#closing ??= (this.#starting ?? Promise.resolve())
      .catch(() => {})
      .then(() => closeParts(this.#started, this.log, PART_CLOSE_BOUND_MS));
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
