// The Kubernetes source: three reflectors (Services and EndpointSlices with kube-proxy's label selector,
// and this Node) feeding the intake, which hands the handlers validated, selected objects. Reflection
// (list, watch, recovery) is reflector.ts; the kubeconfig is api-credentials.ts, requests api-session.ts.
import { PROXY_LABEL_SELECTOR } from '../lib/kubernetes-labels.ts';
import type { Logger } from '../lib/log.ts';
import { DEFAULT_LIMITS, type Limits } from './api-limits.ts';
import type { ApiCredentials } from './api-session.ts';
import type { BackoffPolicy } from './backoff.ts';
import type { ProxyHandlers } from './handlers.ts';
import { check, Intake, type Kind, type KubeObject } from './intake.ts';
import type { Node } from './objects.ts';
import { type ApiObject, Reflector, type Resource, type Sink, type Timing } from './reflector.ts';

export { loadApiCredentials } from './api-credentials.ts';

export type KubernetesSourceOptions = {
  credentials: ApiCredentials;
  handlers: ProxyHandlers;
  /** This node's name: its Node object (and only it) feeds onNodeUpdate/onNodeDelete. '' = no Node watch. */
  nodeName: string;
  log: Logger;
  /** A full relist of every resource this often, reconciling anything a watch missed; 0 disables. */
  configSyncPeriodMs: number;
  /** Restart a list or watch that received no bytes for this long (default 5 min). */
  watchdogMs?: number;
  /**
   * Delay before retrying a failed list or watch: doubles per failure, capped, with jitter; the count
   * starts over after `resetMs` (default 4 × maxMs, client-go's 2 min for 30 s) without a failure.
   */
  backoff?: Omit<BackoffPolicy, 'resetMs'> & { resetMs?: number };
  /** Bounds on what one list or watch may hold or read (default DEFAULT_LIMITS). */
  limits?: Partial<Limits>;
  /** Objects per list page (default 500, as client-go's pager); 0 lists in one response. */
  pageSize?: number;
  /** This Node changed (after the handlers were called); undefined = it was deleted. */
  onNode?: (node: Node | undefined) => void;
};

const DEFAULT_WATCHDOG_MS = 5 * 60_000;
/** client-go's reflector: 800 ms doubling to 30 s, reset after 2 min without failure. */
const DEFAULT_BACKOFF: NonNullable<KubernetesSourceOptions['backoff']> = { initialMs: 800, maxMs: 30_000 };
const DEFAULT_PAGE_SIZE = 500;

const SERVICES: Resource = {
  kind: 'Service',
  apiVersion: 'v1',
  path: '/api/v1/services',
  labelSelector: PROXY_LABEL_SELECTOR,
};
const ENDPOINT_SLICES: Resource = {
  kind: 'EndpointSlice',
  apiVersion: 'discovery.k8s.io/v1',
  path: '/apis/discovery.k8s.io/v1/endpointslices',
  labelSelector: PROXY_LABEL_SELECTOR,
};
const NODES: Resource = { kind: 'Node', apiVersion: 'v1', path: '/api/v1/nodes' };

/**
 * Services, EndpointSlices and this Node from the API server, as ProxyHandlers events. Each resource runs
 * its own list+watch loop that survives any failure; nothing is emitted after stop().
 */
export class KubernetesSource {
  readonly #reflectors: Reflector[] = [];
  readonly #synced = new Set<Kind>();
  #started = false;
  #node: Node | undefined;
  #nodeListed!: () => void;
  /**
   * Resolves once this Node has been listed completely (whether or not it exists), at once without a
   * node name, and at stop(): what the proxy waits for (bounded) before its first sync.
   */
  readonly nodeListed: Promise<void> = new Promise((resolve) => {
    this.#nodeListed = resolve;
  });

  constructor(options: KubernetesSourceOptions) {
    const { log, nodeName } = options;
    const intake = new Intake(options.handlers, { warn: (msg, fields) => log.warn(fields, msg), nodeName });
    const backoff = options.backoff ?? DEFAULT_BACKOFF;
    const timing: Timing = {
      watchdogMs: options.watchdogMs ?? DEFAULT_WATCHDOG_MS,
      backoff: { ...backoff, resetMs: backoff.resetMs ?? 4 * backoff.maxMs },
      relistMs: options.configSyncPeriodMs,
      pageSize: options.pageSize ?? DEFAULT_PAGE_SIZE,
    };
    const limits: Limits = { ...DEFAULT_LIMITS, ...options.limits };
    const reflect = (resource: Resource, sink: Sink) =>
      this.#reflectors.push(
        new Reflector(
          resource,
          sink,
          options.credentials,
          log.child({ kind: resource.kind }),
          timing,
          limits,
        ),
      );
    // Every change goes through the intake; `then` sees it afterwards (this Node, for onNode).
    const into = (kind: Kind, synced: () => void, then?: Sink['receive']): Sink => ({
      receive(op, obj, old) {
        intake.receive(op, check(kind, obj as KubeObject), old as KubeObject | undefined);
        then?.(op, obj, old);
      },
      synced,
    });
    const listed = (kind: 'Service' | 'EndpointSlice') => () => {
      this.#synced.add(kind);
      intake.synced(kind);
    };
    reflect(SERVICES, into('Service', listed('Service')));
    reflect(ENDPOINT_SLICES, into('EndpointSlice', listed('EndpointSlice')));
    if (nodeName === '') this.#nodeListed();
    else {
      const node: Resource = { ...NODES, fieldSelector: `metadata.name=${nodeName}` };
      const changed = (op: string, obj: ApiObject) => {
        this.#node = op === 'delete' ? undefined : (obj as Node);
        options.onNode?.(this.#node);
      };
      reflect(
        node,
        into('Node', () => this.#nodeListed(), changed),
      );
    }
  }

  /** This Node as last listed or watched; undefined before, when it does not exist, or without a node name. */
  get node(): Node | undefined {
    return this.#node;
  }

  /** True once Services and EndpointSlices have each been listed completely. */
  get synced(): boolean {
    return this.#synced.has('Service') && this.#synced.has('EndpointSlice');
  }

  /** Starts the loops and resolves at once: it does not wait for the API server. A second call is a no-op. */
  async start(): Promise<void> {
    if (this.#started) return;
    this.#started = true;
    for (const r of this.#reflectors) r.start();
  }

  /** Aborts every request and timer and resolves when all are released. Idempotent; final. */
  async stop(): Promise<void> {
    this.#started = true;
    this.#nodeListed();
    await Promise.all(this.#reflectors.map((r) => r.stop()));
  }
}
