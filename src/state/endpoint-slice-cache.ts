// EndpointSliceCache: the EndpointSlices of each Service, kept by slice name, merged into endpoints per
// service port (kube-proxy's endpointslicecache.go). Pure: no I/O, no clock.

import { canonicalIP, ipFamilyOf } from '../lib/ip.ts';
import { LABEL_SERVICE_NAME } from '../lib/kubernetes-labels.ts';
import type { EndpointSlice, EndpointSliceEndpoint } from '../source/objects.ts';
import { sameHints } from './categorize-endpoints.ts';
import { type Endpoint, type EndpointKey, endpointKey } from './endpoint.ts';
import {
  type IPFamily,
  type Protocol,
  type ServicePortKey,
  servicePortKey,
  servicePortName,
} from './service-port.ts';

/** `namespace/name` of a Service. */
export type ServiceKey = string & { readonly __brand: 'ServiceKey' };

export function serviceKey(namespace: string, name: string): ServiceKey {
  return `${namespace}/${name}` as ServiceKey;
}

/**
 * The Service a slice belongs to: its namespace and `kubernetes.io/service-name` label. Undefined when
 * kube-proxy ignores the slice: FQDN (or unknown) address type, no label, no name or namespace.
 */
export function sliceServiceKey(slice: EndpointSlice): ServiceKey | undefined {
  const meta = slice.metadata;
  const service = meta?.labels?.[LABEL_SERVICE_NAME];
  if (slice.addressType !== 'IPv4' && slice.addressType !== 'IPv6') return undefined;
  if (!meta?.name || !meta.namespace || typeof service !== 'string' || service === '') return undefined;
  return serviceKey(meta.namespace, service);
}

type SlicePort = { readonly name: string; readonly protocol: Protocol; readonly port: number };

// One endpoint of a slice, before it is paired with the slice's ports.
type SliceEndpoint = {
  readonly ip: string;
  readonly family: IPFamily;
  readonly ready: boolean;
  readonly serving: boolean;
  readonly terminating: boolean;
  readonly nodeName: string | undefined;
  readonly zoneHints: readonly string[] | undefined;
  readonly nodeHints: readonly string[] | undefined;
};

type SliceInfo = { readonly ports: readonly SlicePort[]; readonly endpoints: readonly SliceEndpoint[] };

type ServiceSlices = {
  readonly namespace: string;
  readonly name: string;
  readonly slices: Map<string, SliceInfo>;
};

export class EndpointSliceCache {
  readonly #nodeName: string;
  readonly #services = new Map<ServiceKey, ServiceSlices>();
  // `namespace/sliceName` → the Service it is stored under (the label could change between updates).
  readonly #owners = new Map<string, ServiceKey>();

  constructor(nodeName: string) {
    this.#nodeName = nodeName;
  }

  /**
   * Stores or replaces a slice (an ignored slice removes any stored version of the same name). Returns the
   * Services whose merged endpoints may have changed: empty when the slice means what was stored already.
   */
  update(slice: EndpointSlice): ServiceKey[] {
    const service = sliceServiceKey(slice);
    if (service === undefined) return this.delete(slice);
    const sliceName = slice.metadata!.name!;
    const id = `${slice.metadata!.namespace}/${sliceName}`;
    const info = parseSlice(slice);
    const changed: ServiceKey[] = [];
    const owner = this.#owners.get(id);
    if (owner !== undefined && owner !== service) changed.push(...this.delete(slice));
    let entry = this.#services.get(service);
    if (entry === undefined) {
      const namespace = slice.metadata!.namespace!;
      entry = { namespace, name: service.slice(namespace.length + 1), slices: new Map() };
      this.#services.set(service, entry);
    }
    const stored = entry.slices.get(sliceName);
    if (stored !== undefined && sameSliceInfo(stored, info)) return changed;
    entry.slices.set(sliceName, info);
    this.#owners.set(id, service);
    changed.push(service);
    return changed;
  }

  /** Removes the slice with this namespace and name. Returns the Service it belonged to, if it was stored. */
  delete(slice: EndpointSlice): ServiceKey[] {
    const id = `${slice.metadata?.namespace}/${slice.metadata?.name}`;
    const owner = this.#owners.get(id);
    if (owner === undefined) return [];
    this.#owners.delete(id);
    const entry = this.#services.get(owner)!;
    entry.slices.delete(slice.metadata!.name!);
    if (entry.slices.size === 0) this.#services.delete(owner);
    return [owner];
  }

  /** Number of Services with at least one slice. */
  get size(): number {
    return this.#services.size;
  }

  /**
   * The Service's endpoints per service port key, merged over its slices: one per `ip:port` (the first
   * seen, replaced by a later duplicate that is not terminating), each list sorted by key.
   */
  endpoints(service: ServiceKey): Map<ServicePortKey, Endpoint[]> {
    const out = new Map<ServicePortKey, Endpoint[]>();
    const entry = this.#services.get(service);
    if (entry === undefined) return out;
    const merged = new Map<ServicePortKey, Map<EndpointKey, Endpoint>>();
    // Slice-name order makes the choice between duplicates deterministic (kube-proxy's is map order).
    for (const sliceName of [...entry.slices.keys()].sort()) {
      const info = entry.slices.get(sliceName)!;
      for (const port of info.ports) {
        const key = servicePortKey(servicePortName(entry.namespace, entry.name, port.name), port.protocol);
        let byKey = merged.get(key);
        if (byKey === undefined) {
          byKey = new Map();
          merged.set(key, byKey);
        }
        for (const ep of info.endpoints) {
          const epKey = endpointKey(ep.ip, port.port);
          if (ep.terminating && byKey.has(epKey)) continue;
          byKey.set(epKey, {
            key: epKey,
            ip: ep.ip,
            port: port.port,
            family: ep.family,
            ready: ep.ready,
            serving: ep.serving,
            terminating: ep.terminating,
            isLocal: ep.nodeName !== undefined && ep.nodeName === this.#nodeName,
            nodeName: ep.nodeName,
            zoneHints: ep.zoneHints,
            nodeHints: ep.nodeHints,
          });
        }
      }
    }
    for (const [key, byKey] of merged)
      out.set(
        key,
        [...byKey.values()].sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0)),
      );
    return out;
  }
}

function parseSlice(slice: EndpointSlice): SliceInfo {
  const ports: SlicePort[] = [];
  for (const p of slice.ports ?? []) {
    // kube-proxy skips ports without a name (unnamed ports have name "") and without a port number.
    if (typeof p?.name !== 'string' || !isPort(p.port)) continue;
    const protocol = p.protocol ?? 'TCP';
    if (protocol !== 'TCP' && protocol !== 'UDP') continue;
    ports.push({ name: p.name, protocol, port: p.port });
  }
  const endpoints: SliceEndpoint[] = [];
  for (const ep of slice.endpoints ?? []) {
    const parsed = parseEndpoint(ep, slice.addressType as IPFamily);
    if (parsed !== undefined) endpoints.push(parsed);
  }
  return { ports, endpoints };
}

function parseEndpoint(ep: EndpointSliceEndpoint, family: IPFamily): SliceEndpoint | undefined {
  // Only the first address counts (the API says consumers must use it; the others are reserved).
  const address = ep?.addresses?.[0];
  if (typeof address !== 'string' || ipFamilyOf(address) !== family) return undefined;
  const cond = ep.conditions ?? {};
  const terminating = cond.terminating === true;
  return {
    ip: canonicalIP(address),
    family,
    // Trusted as kube-proxy does: terminating endpoints are published ready:false, except for Services
    // with publishNotReadyAddresses, whose endpoints must keep receiving traffic.
    ready: cond.ready !== false,
    serving: cond.serving !== false,
    terminating,
    nodeName: typeof ep.nodeName === 'string' && ep.nodeName !== '' ? ep.nodeName : undefined,
    zoneHints: hintNames(ep.hints?.forZones),
    nodeHints: hintNames(ep.hints?.forNodes),
  };
}

function hintNames(list: readonly { name?: unknown }[] | undefined): readonly string[] | undefined {
  return Array.isArray(list) && list.length > 0
    ? list.map((h) => (typeof h?.name === 'string' ? h.name : ''))
    : undefined;
}

function isPort(v: unknown): v is number {
  return typeof v === 'number' && Number.isInteger(v) && v >= 1 && v <= 65535;
}

function sameSliceInfo(a: SliceInfo, b: SliceInfo): boolean {
  if (a.ports.length !== b.ports.length || a.endpoints.length !== b.endpoints.length) return false;
  for (let i = 0; i < a.ports.length; i++) {
    const x = a.ports[i]!;
    const y = b.ports[i]!;
    if (x.name !== y.name || x.protocol !== y.protocol || x.port !== y.port) return false;
  }
  for (let i = 0; i < a.endpoints.length; i++) {
    const x = a.endpoints[i]!;
    const y = b.endpoints[i]!;
    if (
      x.ip !== y.ip ||
      x.ready !== y.ready ||
      x.serving !== y.serving ||
      x.terminating !== y.terminating ||
      x.nodeName !== y.nodeName ||
      !sameHints(x.zoneHints, y.zoneHints) ||
      !sameHints(x.nodeHints, y.nodeHints)
    )
      return false;
  }
  return true;
}
