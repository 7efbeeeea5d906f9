// A worker's side of the table (--workers): what came over the IPC channel, rebuilt in the shapes the
// state makes. A structured clone gives every object its properties one by one (most of them out of
// line, in a block of their own) and every string a copy of its own: 'TCP', 'IPv4', 'None', the
// namespace, per service port and per endpoint. Rebuilt, a service port's entry and its two endpoints
// hold 1.3 KB instead of 1.7. Pure: no I/O.
import type { Endpoint, ServicePortEndpoints } from '../state/endpoint.ts';
import type { ServicePort } from '../state/service-port.ts';
import type { TableMessage } from './messages.ts';

/** The strings a value can only be one of: the copy that came is swapped for the process's own. */
const CONSTANTS = new Map<string, string>(
  [
    'TCP',
    'UDP',
    'IPv4',
    'IPv6',
    'None',
    'ClientIP',
    'none',
    'connections',
    'protocols',
    'off',
    'v1',
    'v2',
  ].map((s) => [s, s]),
);

/** Strings of few distinct values (namespaces, port names, node names, zones) kept once, up to this many. */
const MAX_SHARED_STRINGS = 4096;

const NO_STRINGS: readonly string[] = Object.freeze([]);
const NO_ENDPOINTS: readonly Endpoint[] = Object.freeze([]);

/** Rebuilds tables for one worker; keeps the strings it shares between them. */
export class TableReviver {
  readonly #shared = new Map<string, string>();

  /** `table` with its service ports and endpoints rebuilt (what else it holds is kept as it came). */
  revive(table: TableMessage): TableMessage {
    // Within one table, what was one object before the clone is one object again (endpoints shared by
    // the lists of a service port, lists shared between `all` and `cluster`).
    const seen = new Map<object, unknown>();
    return {
      ...table,
      servicePorts: table.servicePorts.map(
        ([key, sp]) => [key, sp === null ? null : this.#servicePort(sp)] as const,
      ),
      endpoints: table.endpoints.map(
        ([key, eps]) => [key, eps === null ? null : this.#endpoints(eps, seen)] as const,
      ),
    };
  }

  /** The same fields in the order the state's builder writes them (one shape for all). */
  #servicePort(sp: ServicePort): ServicePort {
    return {
      key: sp.key,
      name: sp.name,
      namespace: this.#shared1(sp.namespace),
      serviceName: sp.serviceName,
      portName: this.#shared1(sp.portName),
      protocol: constant(sp.protocol),
      clusterIPs: strings(sp.clusterIPs),
      port: sp.port,
      nodePort: sp.nodePort,
      externalIPs: strings(sp.externalIPs),
      loadBalancerIPs: strings(sp.loadBalancerIPs),
      loadBalancerSourceRanges: strings(sp.loadBalancerSourceRanges),
      sessionAffinity: constant(sp.sessionAffinity),
      stickyMaxAgeSeconds: sp.stickyMaxAgeSeconds,
      externallyAccessible: sp.externallyAccessible,
      externalPolicyLocal: sp.externalPolicyLocal,
      internalPolicyLocal: sp.internalPolicyLocal,
      healthCheckNodePort: sp.healthCheckNodePort,
      trace: sp.trace === undefined ? undefined : constant(sp.trace),
      proxyProtocol: sp.proxyProtocol === undefined ? undefined : constant(sp.proxyProtocol),
    };
  }

  #endpoints(eps: ServicePortEndpoints, seen: Map<object, unknown>): ServicePortEndpoints {
    return {
      all: this.#list(eps.all, seen),
      cluster: this.#list(eps.cluster, seen),
      local: this.#list(eps.local, seen),
      hasAnyEndpoints: eps.hasAnyEndpoints,
      localReadyCount: eps.localReadyCount,
    };
  }

  #list(list: readonly Endpoint[], seen: Map<object, unknown>): readonly Endpoint[] {
    if (list.length === 0) return NO_ENDPOINTS;
    const done = seen.get(list) as readonly Endpoint[] | undefined;
    if (done !== undefined) return done;
    const out = list.map((ep) => this.#endpoint(ep, seen));
    seen.set(list, out);
    return out;
  }

  /** The fields in the order the slice cache writes them. */
  #endpoint(ep: Endpoint, seen: Map<object, unknown>): Endpoint {
    const done = seen.get(ep) as Endpoint | undefined;
    if (done !== undefined) return done;
    const out: Endpoint = {
      key: ep.key,
      ip: ep.ip,
      port: ep.port,
      family: constant(ep.family),
      ready: ep.ready,
      serving: ep.serving,
      terminating: ep.terminating,
      isLocal: ep.isLocal,
      nodeName: ep.nodeName === undefined ? undefined : this.#shared1(ep.nodeName),
      zoneHints: ep.zoneHints === undefined ? undefined : ep.zoneHints.map((z) => this.#shared1(z)),
      nodeHints: ep.nodeHints === undefined ? undefined : ep.nodeHints.map((n) => this.#shared1(n)),
    };
    seen.set(ep, out);
    return out;
  }

  /** A string of few distinct values: the one kept, while there is room for more. */
  #shared1(value: string): string {
    const kept = this.#shared.get(value);
    if (kept !== undefined) return kept;
    if (this.#shared.size < MAX_SHARED_STRINGS) this.#shared.set(value, value);
    return value;
  }
}

function constant<T extends string>(value: T): T {
  return (CONSTANTS.get(value) as T | undefined) ?? value;
}

function strings(list: readonly string[]): readonly string[] {
  return list.length === 0 ? NO_STRINGS : list.slice();
}
