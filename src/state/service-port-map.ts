// ServicePortMap: the service ports of every applied Service, kept by Service (as ProxyState changes
// them) and read by service port key (as the proxier reads a snapshot: kube-proxy's ServicePortMap),
// without a second map: a key names its Service. Pure: no I/O.
import { itemsOf, keptAs, type OneOrMore } from '../lib/one-or-more.ts';
import type { ServiceKey } from './endpoint-slice-cache.ts';
import type { ServicePort, ServicePortKey } from './service-port.ts';

const NO_PORTS: readonly ServicePort[] = Object.freeze([]);

/**
 * The Service of a service port key (`namespace/name:port/PROTOCOL`): up to its first colon, as the
 * intake lets through only DNS names for namespaces and Services (no colon in them).
 */
export function serviceKeyOf(key: ServicePortKey): ServiceKey {
  return key.slice(0, key.indexOf(':')) as ServiceKey;
}

/**
 * Read-only as a map of service port key → ServicePort (a snapshot's `servicePorts`); ProxyState changes
 * it a Service at a time (setPorts). Iterated a Service at a time, each Service's ports in their order.
 */
export class ServicePortMap implements ReadonlyMap<ServicePortKey, ServicePort> {
  /** The ports of each Service (most have one: kept alone, not in a list of one). */
  readonly #byService = new Map<ServiceKey, OneOrMore<ServicePort>>();
  #size = 0;

  /** Service ports (of every Service). */
  get size(): number {
    return this.#size;
  }

  /** The Services that have ports. */
  services(): MapIterator<ServiceKey> {
    return this.#byService.keys();
  }

  /** The ports of `service` ([] when none). */
  portsOf(service: ServiceKey): readonly ServicePort[] {
    const ports = this.#byService.get(service);
    return ports === undefined ? NO_PORTS : itemsOf(ports);
  }

  /** `service` has `ports` now (each with a key of that Service; [] when it has none any more). */
  setPorts(service: ServiceKey, ports: readonly ServicePort[]): void {
    this.#size += ports.length - this.portsOf(service).length;
    if (ports.length > 0) this.#byService.set(service, keptAs(ports));
    else this.#byService.delete(service);
  }

  get(key: ServicePortKey): ServicePort | undefined {
    const ports = this.#byService.get(serviceKeyOf(key));
    if (ports === undefined) return undefined;
    return Array.isArray(ports)
      ? (ports as readonly ServicePort[]).find((p) => p.key === key)
      : (ports as ServicePort).key === key
        ? (ports as ServicePort)
        : undefined;
  }

  has(key: ServicePortKey): boolean {
    return this.get(key) !== undefined;
  }

  *entries(): MapIterator<[ServicePortKey, ServicePort]> {
    for (const ports of this.#byService.values()) for (const p of itemsOf(ports)) yield [p.key, p];
  }

  *keys(): MapIterator<ServicePortKey> {
    for (const [key] of this.entries()) yield key;
  }

  *values(): MapIterator<ServicePort> {
    for (const [, sp] of this.entries()) yield sp;
  }

  [Symbol.iterator](): MapIterator<[ServicePortKey, ServicePort]> {
    return this.entries();
  }

  forEach(
    fn: (value: ServicePort, key: ServicePortKey, map: ReadonlyMap<ServicePortKey, ServicePort>) => void,
    thisArg?: unknown,
  ): void {
    for (const [key, sp] of this.entries()) fn.call(thisArg, sp, key, this);
  }
}
