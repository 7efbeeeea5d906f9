// The harness of the Kubernetes source tests: handlers that record every call and the picture they add
// up to, a pino logger into an array, waiting with deadlines, and a KubernetesSource against the stand-in
// API server released in t.after.
import type { TestContext } from 'node:test';
import { KubeConfig } from '@kubernetes/client-node';
import { pino } from 'pino';
import type { ProxyHandlers } from '../../src/source/handlers.ts';
import { kubeConfigCredentials } from '../../src/source/kubeconfig-credentials.ts';
import { KubernetesSource, type KubernetesSourceOptions } from '../../src/source/kubernetes.ts';
import {
  type EndpointSlice,
  LABEL_HEADLESS,
  LABEL_SERVICE_PROXY_NAME,
  type Node,
  type Service,
} from '../../src/source/objects.ts';
import {
  type ApiObject,
  type FakeApiServer,
  type FakeApiServerOptions,
  type Kind,
  makeEndpointSlice,
  makeNode,
  makeService,
  startFakeApiServer,
} from './fake-apiserver.ts';

export const NODE = 'node-1';
export const DEADLINE_MS = 5000;

/** Calls `check` after every change until it returns true; rejects with `describe()` after the deadline. */
export class Waiters {
  #waiters: { check: () => boolean; resolve: () => void }[] = [];

  notify(): void {
    for (const w of this.#waiters.filter((w) => w.check())) {
      this.#waiters = this.#waiters.filter((x) => x !== w);
      w.resolve();
    }
  }

  until(check: () => boolean, describe: () => string, timeoutMs = DEADLINE_MS): Promise<void> {
    if (check()) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#waiters = this.#waiters.filter((w) => w !== waiter);
        reject(new Error(`timed out after ${timeoutMs} ms: ${describe()}`));
      }, timeoutMs);
      const waiter = {
        check,
        resolve: () => {
          clearTimeout(timer);
          resolve();
        },
      };
      this.#waiters.push(waiter);
    });
  }
}

export type Op = 'add' | 'update' | 'delete' | 'synced';
export type Seen = { op: Op; kind: Kind; key: string; rv: string; oldRv?: string; object?: ApiObject };
export type Obj = {
  kind?: string;
  metadata?: { namespace?: string; name?: string; resourceVersion?: string };
};

export const keyOf = (o: Obj) => `${o.metadata?.namespace ?? ''}/${o.metadata?.name ?? ''}`;

/** ProxyHandlers that record every call and keep the picture the calls add up to. */
export class RecordingHandlers implements ProxyHandlers {
  readonly events: Seen[] = [];
  readonly objects: Record<Kind, Map<string, ApiObject>> = {
    Service: new Map(),
    EndpointSlice: new Map(),
    Node: new Map(),
  };
  readonly waiters = new Waiters();
  throwOnAdd = false;

  #record(op: Op, kind: Kind, obj?: Obj, old?: Obj): void {
    const seen: Seen = { op, kind, key: obj ? keyOf(obj) : '', rv: obj?.metadata?.resourceVersion ?? '' };
    if (old) seen.oldRv = old.metadata?.resourceVersion ?? '';
    if (obj) {
      seen.object = obj as ApiObject;
      if (op === 'delete') this.objects[kind].delete(seen.key);
      else if (op !== 'synced') this.objects[kind].set(seen.key, obj as ApiObject);
    }
    this.events.push(seen);
    this.waiters.notify();
    if (this.throwOnAdd && op === 'add') throw new Error('handler exploded');
  }

  onServiceAdd(s: Service) {
    this.#record('add', 'Service', s);
  }
  onServiceUpdate(old: Service, s: Service) {
    this.#record('update', 'Service', s, old);
  }
  onServiceDelete(s: Service) {
    this.#record('delete', 'Service', s);
  }
  onServicesSynced() {
    this.#record('synced', 'Service');
  }
  onEndpointSliceAdd(s: EndpointSlice) {
    this.#record('add', 'EndpointSlice', s);
  }
  onEndpointSliceUpdate(old: EndpointSlice, s: EndpointSlice) {
    this.#record('update', 'EndpointSlice', s, old);
  }
  onEndpointSliceDelete(s: EndpointSlice) {
    this.#record('delete', 'EndpointSlice', s);
  }
  onEndpointSlicesSynced() {
    this.#record('synced', 'EndpointSlice');
  }
  onNodeUpdate(n: Node) {
    this.#record('update', 'Node', n);
  }
  onNodeDelete(n: Node) {
    this.#record('delete', 'Node', n);
  }

  find(test: (s: Seen) => boolean): Seen | undefined {
    return this.events.find(test);
  }

  waitFor(test: (s: Seen) => boolean, timeoutMs?: number): Promise<Seen> {
    return this.waiters
      .until(
        () => this.events.some(test),
        () => JSON.stringify(this.events.map(({ object: _, ...s }) => s)),
        timeoutMs,
      )
      .then(() => this.events.find(test)!);
  }

  /** Names and resourceVersions we hold for `kind`. */
  picture(kind: Kind): string[] {
    return [...this.objects[kind].values()].map((o) => `${keyOf(o)}@${o.metadata?.resourceVersion}`).sort();
  }
}

export type LogLine = { level: number; msg: string; [k: string]: unknown };

/** A pino logger writing into an array, with waitFor. */
export function recordingLogger() {
  const lines: LogLine[] = [];
  const waiters = new Waiters();
  const logger = pino(
    { level: 'debug' },
    {
      write(text: string) {
        lines.push(JSON.parse(text) as LogLine);
        waiters.notify();
      },
    },
  );
  const waitFor = (test: (l: LogLine) => boolean, timeoutMs?: number) =>
    waiters
      .until(
        () => lines.some(test),
        () => lines.map((l) => `${l.msg} ${JSON.stringify(l.err ?? '')}`).join('\n'),
        timeoutMs,
      )
      .then(() => lines.find(test)!);
  return { logger, lines, waitFor };
}

/** What the handlers should hold for `kind`: the stand-in's objects that pass kube-proxy's selector. */
export function expected(server: FakeApiServer, kind: Kind): string[] {
  return server
    .list(kind)
    .filter((o) => kind === 'Node' || !Object.keys(o.metadata?.labels ?? {}).some(isExcludedLabel))
    .filter((o) => kind !== 'Node' || o.metadata?.name === NODE)
    .map((o) => `${keyOf(o)}@${o.metadata?.resourceVersion}`)
    .sort();
}
const isExcludedLabel = (k: string) => k === LABEL_HEADLESS || k === LABEL_SERVICE_PROXY_NAME;

export async function converged(h: RecordingHandlers, server: FakeApiServer): Promise<void> {
  for (const kind of ['Service', 'EndpointSlice', 'Node'] as const) {
    await h.waiters.until(
      () => JSON.stringify(h.picture(kind)) === JSON.stringify(expected(server, kind)),
      () => `${kind}: have ${h.picture(kind)}, want ${expected(server, kind)}`,
    );
  }
}

export type Setup = {
  server?: FakeApiServerOptions;
  source?: Partial<KubernetesSourceOptions>;
  seed?: (server: FakeApiServer) => void;
  /** Take the server down before the source starts. */
  serverDown?: boolean;
  handlers?: ProxyHandlers;
};

export async function setup(t: TestContext, o: Setup = {}) {
  const server = await startFakeApiServer(o.server);
  t.after(() => server.close());
  o.seed?.(server);
  const kc = new KubeConfig();
  kc.loadFromString(server.kubeconfigYaml());
  const h = new RecordingHandlers();
  const log = recordingLogger();
  if (o.serverDown) await server.stop();
  const source = new KubernetesSource({
    credentials: kubeConfigCredentials(kc),
    handlers: o.handlers ?? h,
    nodeName: NODE,
    log: log.logger,
    configSyncPeriodMs: 0,
    watchdogMs: DEADLINE_MS * 2,
    backoff: { initialMs: 20, maxMs: 200 },
    ...o.source,
  });
  t.after(() => source.stop());
  await source.start();
  return { server, source, h, log, kc };
}

export function seedBasic(server: FakeApiServer): void {
  server.create(makeService('default', 'web'));
  server.create(makeService('kube-system', 'kube-dns', { clusterIP: '10.96.0.10' }));
  server.create(makeEndpointSlice('default', 'web-abc', 'web', ['10.244.1.5', '10.244.2.6']));
  server.create(makeEndpointSlice('kube-system', 'kube-dns-xyz', 'kube-dns', ['10.244.1.9']));
  server.create(makeNode(NODE, { 'topology.kubernetes.io/zone': 'zone-a' }));
  server.create(makeNode('node-2'));
}

export const synced = (h: RecordingHandlers) =>
  Promise.all([
    h.waitFor((s) => s.op === 'synced' && s.kind === 'Service'),
    h.waitFor((s) => s.op === 'synced' && s.kind === 'EndpointSlice'),
  ]);

export const watchesOf = (server: FakeApiServer, path: string, from = 0) =>
  server.requests.slice(from).filter((r) => r.verb === 'watch' && r.path === path);
export const listsOf = (server: FakeApiServer, path: string, from = 0) =>
  server.requests.slice(from).filter((r) => r.verb === 'list' && r.path === path);
