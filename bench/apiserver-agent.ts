// The benchmark's Kubernetes API server: a process started inside a namespace (`node
// bench/apiserver-agent.ts`) that runs the stand-in (test/helpers/fake-apiserver.ts) on that namespace's
// 127.0.0.1 and changes its objects on request (one JSON line in, one out, `{id, ...}`), so the proxy is
// fed by list+watch as in a cluster. Also exports the scale measure's objects (pure).
import { createInterface } from 'node:readline';
import {
  ANNOTATION_LAST_CHANGE_TRIGGER_TIME,
  type EndpointSlice,
  type Service,
} from '../src/source/objects.ts';
import {
  type ApiObject,
  type FakeApiServer,
  type Kind,
  makeEndpointSlice,
  makeNode,
  makeService,
  startFakeApiServer,
} from '../test/helpers/fake-apiserver.ts';
import { NET } from './configs.ts';

/** Namespace of the scale measure's objects. */
export const SCALE_NAMESPACE = 'bench';
/** The node's name (the proxy runs with --hostname-override node-1 and watches this Node). */
export const SCALE_NODE = 'node-1';

/** 10.100.0.1, 10.100.0.2, ...: ClusterIP of scale service i (i ≥ 1). */
export function scaleIP(i: number): string {
  return `10.100.${i >> 8}.${i & 255}`;
}

/** Service svc-i: ClusterIP scaleIP(i), one TCP port 80 (named p) → the backends' HTTP port. */
export function scaleService(i: number): Service {
  const ip = scaleIP(i);
  return makeService(SCALE_NAMESPACE, `svc-${i}`, {
    clusterIP: ip,
    clusterIPs: [ip],
    ports: [{ name: 'p', protocol: 'TCP', port: 80, targetPort: NET.httpPort }],
  });
}

/**
 * EndpointSlice svc-i-1 of Service svc-i: the given pod IPs, ready, port p = the backends' HTTP port;
 * with `triggerTime`, the controller's last-change-trigger-time annotation (network programming latency).
 */
export function scaleSlice(i: number, ips: readonly string[], triggerTime?: Date): EndpointSlice {
  const extras =
    triggerTime === undefined
      ? {}
      : { annotations: { [ANNOTATION_LAST_CHANGE_TRIGGER_TIME]: triggerTime.toISOString() } };
  return makeEndpointSlice(
    SCALE_NAMESPACE,
    `svc-${i}-1`,
    `svc-${i}`,
    [...ips],
    [{ name: 'p', protocol: 'TCP', port: NET.httpPort }],
    extras,
  );
}

/** Every scale Service's endpoints but svc-1's: both pods at each of their addresses (five). */
export const SCALE_ENDPOINTS: readonly string[] = [...NET.backends, ...NET.secondaryIPs.flat()];

/** The scale measure's objects: svc-1..svc-n with SCALE_ENDPOINTS (svc-1: only `endpointOf1`), and the Node. */
export function scaleObjects(n: number, endpointOf1: string): ApiObject[] {
  const out: ApiObject[] = [makeNode(SCALE_NODE)];
  for (let i = 1; i <= n; i++) {
    out.push(scaleService(i), scaleSlice(i, i === 1 ? [endpointOf1] : SCALE_ENDPOINTS));
  }
  return out;
}

type Reply = Record<string, unknown>;
const KINDS: readonly Kind[] = ['Service', 'EndpointSlice', 'Node'];

const keyOf = (o: ApiObject) => `${o.kind}/${o.metadata?.namespace ?? ''}/${o.metadata?.name ?? ''}`;
/** What an update would change: everything but the server-set metadata. */
const content = (o: ApiObject) => {
  const { metadata, kind: _k, apiVersion: _a, ...rest } = o as ApiObject & Record<string, unknown>;
  return JSON.stringify({ labels: metadata?.labels, annotations: metadata?.annotations, ...rest });
};

/** Creates or replaces one object; `t` is taken once the watch events are written. */
function upsert(api: FakeApiServer, obj: ApiObject): { type: 'ADDED' | 'MODIFIED'; rv: string; t: number } {
  const exists =
    api.get(obj.kind as Kind, obj.metadata?.namespace ?? '', obj.metadata?.name ?? '') !== undefined;
  // create/update write the event to every open watch response synchronously.
  const stored = exists ? api.update(obj) : api.create(obj);
  const t = Date.now();
  return { type: exists ? 'MODIFIED' : 'ADDED', rv: stored.metadata?.resourceVersion ?? '', t };
}

/**
 * Makes the store hold exactly the scale objects for `n` services (removes the others, creates the
 * missing, updates the changed), so a round starts from the same state as the first.
 */
function load(api: FakeApiServer, a: { n: number; endpointOf1?: string }): Reply {
  const want = new Map(scaleObjects(a.n, a.endpointOf1 ?? NET.backends[0]).map((o) => [keyOf(o), o]));
  let removed = 0;
  let written = 0;
  for (const kind of KINDS) {
    for (const o of api.list(kind)) {
      if (want.has(keyOf({ ...o, kind }))) continue;
      api.remove(kind, o.metadata?.namespace ?? '', o.metadata?.name ?? '');
      removed++;
    }
  }
  for (const o of want.values()) {
    const had = api.get(o.kind as Kind, o.metadata?.namespace ?? '', o.metadata?.name ?? '');
    if (had !== undefined && content(had) === content(o)) continue;
    upsert(api, o);
    written++;
  }
  return { ok: true, services: a.n, written, removed, rv: api.resourceVersion, t: Date.now() };
}

async function main(): Promise<void> {
  const api = await startFakeApiServer({ host: '127.0.0.1' });
  const ops: Record<string, (a: Record<string, unknown>) => Reply | Promise<Reply>> = {
    load: (a) => load(api, a as { n: number; endpointOf1?: string }),
    upsert: (a) => ({ ok: true, ...upsert(api, a['object'] as ApiObject), watches: api.openWatches }),
    remove: (a) => {
      api.remove(a['kind'] as Kind, String(a['namespace'] ?? SCALE_NAMESPACE), String(a['name']));
      return { ok: true, t: Date.now(), rv: api.resourceVersion };
    },
    stop: async () => {
      await api.close();
      setImmediate(() => process.exit(0));
      return { ok: true };
    },
  };
  const out = (o: Reply) => process.stdout.write(`${JSON.stringify(o)}\n`);
  createInterface({ input: process.stdin }).on('line', async (line) => {
    const { id, op, args } = JSON.parse(line) as { id: number; op: string; args: Record<string, unknown> };
    try {
      const fn = ops[op];
      out({ id, ...(fn ? await fn(args ?? {}) : { ok: false, error: `no op ${op}` }) });
    } catch (err) {
      out({ id, ok: false, error: (err as Error).message });
    }
  });
  process.stdin.on('end', () => void api.close().then(() => process.exit(0)));
  out({ ready: true, port: api.port, url: api.url });
}

if (import.meta.main) await main();
