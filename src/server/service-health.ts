// Per-service health check node ports (kube-proxy's pkg/proxy/healthcheck/service_health.go): one HTTP
// server per healthCheckNodePort and bind address, answering for its Service on any path. Owns those
// sockets only; what to serve comes from the proxier through syncServices/syncEndpoints. Every pod can
// reach these ports: the servers share one connection budget, with a per-client cap (http-guard.ts).
import type http from 'node:http';
import type { Logger } from '../lib/log.ts';
import { readFdLimits } from '../proxier/process-limits.ts';
import type { Snapshot } from '../state/snapshot.ts';
import { ConnectionBudget } from './connection-budget.ts';
import {
  createLimitedServer,
  guardServer,
  type HttpLimits,
  httpLimits,
  PROBE_CLIENT_LIMIT,
  totalHandler,
} from './http-guard.ts';

/**
 * Per client address over every health check node port together: a cloud load balancer probes each
 * Service with a Local policy from one address (Azure: 168.63.129.16), maybe on hundreds of ports at
 * once; one pod still cannot fill the budget alone.
 */
const HEALTH_CHECK_CLIENT_LIMIT = 8 * PROBE_CLIENT_LIMIT;
export type ServiceName = { readonly namespace: string; readonly name: string };

/** A listening server; close() stops it and drops its connections. */
export type HealthListener = { close(): Promise<void> };

/** Opens `handler` on `port` of `host` (undefined = every address); rejects when the port is taken. */
export type Listen = (
  port: number,
  host: string | undefined,
  handler: http.RequestListener,
) => Promise<HealthListener>;

export type ServiceHealthServerOptions = {
  log: Logger;
  /** How to listen (tests, network namespaces); default: a node:http server. */
  listen?: Listen;
  /**
   * The default listen's limits, over httpLimits()'s defaults and a per-client cap of
   * HEALTH_CHECK_CLIENT_LIMIT; maxConnections counts every health check node port together.
   */
  limits?: Partial<HttpLimits>;
  /** The default listen: an accept failed for lack of descriptors. */
  onFdExhausted?: (err: NodeJS.ErrnoException) => void;
  /** Addresses to listen on (kube-proxy: the node IPs matching --nodeport-addresses); default all. */
  bindAddresses?: readonly string[];
  /**
   * The proxy's own health, asked at each request (kube-proxy's healthChecker.IsHealthy(): staleness
   * only, not the Node's eligibility nor the first sync). Default: always healthy.
   */
  proxyHealthy?: () => boolean;
};

type Instance = {
  port: number;
  service: ServiceName;
  /** By bind address ('' = all). */
  readonly listeners: Map<string, HealthListener>;
  /** The last listen error per address, so that a port that stays taken is warned about once. */
  readonly failures: Map<string, string>;
};

/**
 * The health check node port servers. A Service answers 200 when it has local ready endpoints and the
 * proxy is healthy, else 503, with the count in `X-Load-Balancing-Endpoint-Weight`, so that cloud load
 * balancers send traffic only to nodes that can serve it (externalTrafficPolicy: Local).
 */
export class ServiceHealthServer {
  readonly #log: Logger;
  readonly #listen: Listen;
  readonly #hosts: readonly (string | undefined)[];
  readonly #instances = new Map<number, Instance>();
  #endpoints: ReadonlyMap<string, number> = new Map();
  #proxyHealthy: () => boolean;
  #queue: Promise<void> = Promise.resolve();
  #closed = false;

  constructor(options: ServiceHealthServerOptions) {
    this.#log = options.log;
    this.#listen =
      options.listen ??
      limitedListen(
        httpLimits(readFdLimits(), { maxConnectionsPerClient: HEALTH_CHECK_CLIENT_LIMIT, ...options.limits }),
        options.log,
        options.onFdExhausted,
      );
    this.#proxyHealthy = options.proxyHealthy ?? (() => true);
    const addresses = options.bindAddresses ?? [];
    this.#hosts = addresses.length > 0 ? [...addresses] : [undefined];
  }

  /**
   * Makes the servers match `ports` (healthCheckNodePort → Service): closes those no longer wanted,
   * opens new ones, and retries any that failed to listen before. Resolves when done; never rejects.
   * Calls run one after another.
   */
  syncServices(ports: ReadonlyMap<number, ServiceName>): Promise<void> {
    const wanted = new Map(ports);
    this.#queue = this.#queue.then(() => this.#sync(wanted));
    return this.#queue;
  }

  /**
   * Makes the servers and their answers match a snapshot: one per healthCheckNodePort (LoadBalancer
   * Services with externalTrafficPolicy Local), answering with the Service's local ready endpoints.
   */
  syncSnapshot(snapshot: Snapshot): Promise<void> {
    const ports = new Map<number, ServiceName>();
    const local = new Map<string, number>();
    for (const sp of snapshot.servicePorts.values()) {
      if (sp.healthCheckNodePort === 0) continue;
      ports.set(sp.healthCheckNodePort, { namespace: sp.namespace, name: sp.serviceName });
      const key = `${sp.namespace}/${sp.serviceName}`;
      const count = snapshot.endpoints.get(sp.key)?.localReadyCount ?? 0;
      local.set(key, Math.max(local.get(key) ?? 0, count));
    }
    this.syncEndpoints(local);
    return this.syncServices(ports);
  }

  /** Local ready endpoint counts by `namespace/name`; a Service not in the map has none. */
  syncEndpoints(localEndpoints: ReadonlyMap<string, number>): void {
    this.#endpoints = new Map(localEndpoints);
  }

  /** Fixes the proxy's health to `healthy` (replacing options.proxyHealthy); while false every Service answers 503. */
  setProxyHealthy(healthy: boolean): void {
    this.#proxyHealthy = () => healthy;
  }

  /** Ports with at least one listening server (tests, debug). */
  get listeningPorts(): number[] {
    return [...this.#instances.values()].filter((i) => i.listeners.size > 0).map((i) => i.port);
  }

  /** Closes every server. Idempotent; later syncs do nothing. */
  async close(): Promise<void> {
    this.#closed = true;
    await this.#queue;
    const all = [...this.#instances.values()];
    this.#instances.clear();
    await Promise.all(all.map((i) => this.#closeInstance(i)));
  }

  async #sync(wanted: Map<number, ServiceName>): Promise<void> {
    if (this.#closed) return;
    const gone = [...this.#instances.values()].filter((i) => !wanted.has(i.port));
    for (const i of gone) this.#instances.delete(i.port);
    await Promise.all(gone.map((i) => this.#closeInstance(i)));
    const opening: Promise<void>[] = [];
    for (const [port, service] of wanted) {
      let instance = this.#instances.get(port);
      if (instance === undefined) {
        instance = { port, service, listeners: new Map(), failures: new Map() };
        this.#instances.set(port, instance);
      }
      // Another Service may now own the port: the handler reads the name at request time.
      instance.service = { namespace: service.namespace, name: service.name };
      for (const host of this.#hosts) {
        if (!instance.listeners.has(host ?? '')) opening.push(this.#open(instance, host));
      }
    }
    await Promise.all(opening);
  }

  async #open(instance: Instance, host: string | undefined): Promise<void> {
    const address = host ?? '';
    const fields = { service: nameOf(instance.service), port: instance.port, address: host ?? '*' };
    try {
      const listener = await this.#listen(
        instance.port,
        host,
        totalHandler((req, res) => this.#respond(instance, req, res), this.#log),
      );
      if (this.#closed || this.#instances.get(instance.port) !== instance) {
        await listener.close();
        return;
      }
      instance.listeners.set(address, listener);
      instance.failures.delete(address);
      this.#log.info(fields, 'Opened service health check');
    } catch (err) {
      // kube-proxy's FailedToStartServiceHealthcheck; retried at the next sync.
      const message = (err as Error).message;
      const level = instance.failures.get(address) === message ? 'debug' : 'warn';
      instance.failures.set(address, message);
      this.#log[level]({ ...fields, err }, 'Failed to start service health check, retrying at the next sync');
    }
  }

  async #closeInstance(instance: Instance): Promise<void> {
    const listeners = [...instance.listeners.values()];
    instance.listeners.clear();
    await Promise.all(listeners.map((l) => l.close().catch(() => {})));
    if (listeners.length > 0) {
      this.#log.info(
        { service: nameOf(instance.service), port: instance.port },
        'Closed service health check',
      );
    }
  }

  #respond(instance: Instance, req: http.IncomingMessage, res: http.ServerResponse): void {
    req.resume();
    const { namespace, name } = instance.service;
    const count = this.#endpoints.get(nameOf(instance.service)) ?? 0;
    const healthy = this.#proxyHealthy();
    const body = JSON.stringify({
      service: { namespace, name },
      localEndpoints: count,
      serviceProxyHealthy: healthy,
    });
    res.writeHead(count > 0 && healthy ? 200 : 503, {
      'Content-Type': 'application/json',
      'X-Content-Type-Options': 'nosniff',
      'X-Load-Balancing-Endpoint-Weight': String(count),
      'Content-Length': Buffer.byteLength(body),
    });
    res.end(body);
  }
}

function nameOf(service: ServiceName): string {
  return `${service.namespace}/${service.name}`;
}

/** The default Listen: node:http servers on host:port, with `limits` (one budget for all of them). */
function limitedListen(
  limits: HttpLimits,
  log: Logger,
  onFdExhausted: ((err: NodeJS.ErrnoException) => void) | undefined,
): Listen {
  const budget = new ConnectionBudget(limits);
  return (port, host, handler) =>
    new Promise((resolve, reject) => {
      const server = createLimitedServer(limits, handler);
      server.once('error', reject);
      server.listen({ port, host }, () => {
        server.off('error', reject);
        guardServer(server, { log: log.child({ port }), budget, onFdExhausted });
        resolve({
          close: () =>
            new Promise<void>((done) => {
              server.close(() => done());
              server.closeAllConnections();
            }),
        });
      });
    });
}
