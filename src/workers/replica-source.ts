// A worker's state (--workers): the main process's service ports, endpoints and proxy ports as it sent
// them, checked out by the worker's proxier as snapshots. Only service ports the main process runs (a
// port for its key) are shown; one whose port moved is closed in one checkout and opened on its new
// port in the next. Pure: no I/O.
import type { SnapshotSource } from '../proxier/proxier.ts';
import type { ServicePortEndpoints } from '../state/endpoint.ts';
import type { ServicePort, ServicePortKey } from '../state/service-port.ts';
import type { Snapshot } from '../state/snapshot.ts';
import type { TableMessage } from './messages.ts';

export class ReplicaSource implements SnapshotSource {
  /** The proxy ports, by key (the worker's binder binds exactly these: shared, updated in place). */
  readonly ports = new Map<string, number>();
  readonly #all = new Map<ServicePortKey, ServicePort>();
  readonly #endpoints = new Map<ServicePortKey, ServicePortEndpoints>();
  /** What the proxier sees: the service ports with a port. */
  readonly #visible = new Map<ServicePortKey, ServicePort>();
  #changedServicePorts = new Set<ServicePortKey>();
  #changedEndpoints = new Set<ServicePortKey>();
  /** Closed in the last checkout because their port moved: opened again in the next. */
  #reopen = new Set<ServicePortKey>();
  #initialized = false;

  get isInitialized(): boolean {
    return this.#initialized;
  }

  /** True when a checkout would change anything. */
  get pending(): boolean {
    return this.#changedServicePorts.size > 0 || this.#changedEndpoints.size > 0 || this.#reopen.size > 0;
  }

  get onlyEndpointsPending(): boolean {
    return this.#changedServicePorts.size === 0 && this.#reopen.size === 0 && this.#changedEndpoints.size > 0;
  }

  apply(table: TableMessage): void {
    this.#initialized = true;
    if (table.full) {
      for (const key of this.#all.keys()) this.#changedServicePorts.add(key);
      for (const key of this.#endpoints.keys()) this.#changedEndpoints.add(key);
      this.#all.clear();
      this.#endpoints.clear();
    }
    // Keyed by the service port's own key string: each key came over the channel as a copy of its own.
    for (const [key, sp] of table.servicePorts) {
      if (sp === null) this.#all.delete(key);
      else {
        this.#all.set(sp.key, sp);
        this.#rekeyEndpoints(sp.key);
      }
      this.#changedServicePorts.add(this.#keyOf(key));
    }
    for (const [key, eps] of table.endpoints) {
      if (eps === null) this.#endpoints.delete(key);
      else this.#endpoints.set(this.#keyOf(key), eps);
      this.#changedEndpoints.add(this.#keyOf(key));
    }
    if (table.ports !== undefined) this.#setPorts(table.ports, table.full);
  }

  /**
   * Endpoints that came before their service port (the main process sends them as its balancers get
   * them, before the sync's service ports) are keyed by a copy of the key of their own (40 bytes a port):
   * keyed again by the service port's own string. A Map keeps the first key it was set with.
   */
  #rekeyEndpoints(key: ServicePortKey): void {
    const eps = this.#endpoints.get(key);
    if (eps === undefined) return;
    this.#endpoints.delete(key);
    this.#endpoints.set(key, eps);
  }

  /** `key` as its service port's own string when the service port is known. */
  #keyOf(key: ServicePortKey): ServicePortKey {
    return this.#all.get(key)?.key ?? key;
  }

  /**
   * New ports (`full`: all of them, else those that changed): a service port whose listeners' ports
   * changed is reopened (closed, then opened again).
   */
  #setPorts(ports: readonly (readonly [string, number | null])[], full: boolean): void {
    const moved = new Set<ServicePortKey>();
    if (full) {
      const all = new Map<string, number | null>(ports);
      for (const [key, port] of this.ports) if (all.get(key) !== port) moved.add(servicePortKeyOf(key));
      for (const [key, port] of all) if (this.ports.get(key) !== port) moved.add(servicePortKeyOf(key));
      this.ports.clear();
      for (const [key, port] of all)
        if (port !== null) this.ports.set(this.#keyOf(key as ServicePortKey), port);
    } else {
      for (const [key, port] of ports) {
        if ((this.ports.get(key) ?? null) === port) continue;
        moved.add(servicePortKeyOf(key));
        if (port === null) this.ports.delete(key);
        else this.ports.set(this.#keyOf(key as ServicePortKey), port);
      }
    }
    for (const key of moved) this.#changedServicePorts.add(key);
    for (const key of moved) if (this.#visible.has(key)) this.#reopen.add(key);
  }

  checkout(): Snapshot {
    const changed = this.#changedServicePorts;
    const reopen = this.#reopen;
    this.#changedServicePorts = new Set();
    this.#reopen = new Set();
    for (const key of changed) {
      const sp = this.#all.get(key);
      // A moved one is hidden for this checkout (its old listeners close) and comes back in the next.
      if (sp !== undefined && this.ports.has(key) && !reopen.has(key)) this.#visible.set(sp.key, sp);
      else this.#visible.delete(key);
    }
    for (const key of reopen) this.#changedServicePorts.add(key);
    const changedEndpoints = this.#changedEndpoints;
    this.#changedEndpoints = new Set();
    return {
      servicePorts: this.#visible,
      endpoints: this.#endpoints,
      changedServicePorts: changed,
      changedEndpoints,
      triggerTimes: [],
    };
  }
}

/** `ns/name:port/PROTO` of a listener's key (`…/local`, `…/to/<via>[/local]` are its other listeners). */
export function servicePortKeyOf(listenerKey: string): ServicePortKey {
  // `ns/name:port/PROTO`: the protocol is what follows the second `/`.
  const first = listenerKey.indexOf('/');
  const second = listenerKey.indexOf('/', first + 1);
  const third = listenerKey.indexOf('/', second + 1);
  return (third < 0 ? listenerKey : listenerKey.slice(0, third)) as ServicePortKey;
}
