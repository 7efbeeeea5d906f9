// EndpointSliceCache: the EndpointSlices of each Service, kept by slice name, merged into endpoints per
// service port (kube-proxy's endpointslicecache.go). Pure: no I/O, no clock.

import { flat } from '../lib/flat-string.ts';
import { canonicalIP, ipFamilyOf } from '../lib/ip.ts';
import { LABEL_SERVICE_NAME } from '../lib/kubernetes-labels.ts';
import { itemsOf, keptAs, type OneOrMore } from '../lib/one-or-more.ts';
import type { EndpointSlice, EndpointSliceEndpoint } from '../source/objects.ts';
import { sameHints } from './categorize-endpoints.ts';
import { type Endpoint, type EndpointKey, endpointKey } from './endpoint.ts';
import { EndpointPool } from './endpoint-pool.ts';
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
  return flat(namespace, '/', name) as ServiceKey;
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

// One endpoint of a slice as parsed, before it is paired with each of the slice's ports.
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

/**
 * One port of a slice with the slice's endpoints at it: the Endpoint objects themselves, sorted by key,
 * one per key. A Service with one slice hands these very lists to the state, whose endpoint lists and
 * balancers hold them in turn: an endpoint exists once, not once per layer.
 */
type SlicePort = {
  readonly name: string;
  readonly protocol: Protocol;
  readonly port: number;
  readonly endpoints: readonly Endpoint[];
};

type SliceInfo = { readonly name: string; readonly ports: OneOrMore<SlicePort> };

const NO_ENDPOINTS: readonly Endpoint[] = Object.freeze([]);
const NO_SLICES: readonly SliceInfo[] = Object.freeze([]);

export class EndpointSliceCache {
  readonly #nodeName: string;
  /** The slices of each Service, by name (merge order). */
  readonly #services = new Map<ServiceKey, OneOrMore<SliceInfo>>();
  /**
   * `namespace/sliceName` → the Service it is stored under (the label could change between updates),
   * of the slices not named after it: a slice named `<service>-<suffix>`, as the EndpointSlice controller
   * names them, is found by its name (#ownerOf), without an entry here (~80 bytes a slice).
   */
  readonly #owners = new Map<string, ServiceKey>();
  // An endpoint alike in several slices is one object: the same pods behind many Services cost once.
  readonly #pool = new EndpointPool();

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
    const namespace = slice.metadata!.namespace!;
    const sliceName = slice.metadata!.name!;
    const info = parseSlice(sliceName, slice, this.#nodeName, this.#pool);
    const changed: ServiceKey[] = [];
    const owner = this.#ownerOf(namespace, sliceName);
    if (owner !== undefined && owner !== service) changed.push(...this.delete(slice));
    const entry = this.#services.get(service);
    const slices = entry === undefined ? NO_SLICES : itemsOf(entry);
    const at = indexOf(slices, sliceName);
    const old = slices[at];
    if (old?.name === sliceName) {
      if (sameSliceInfo(old, info)) {
        this.#release(info);
        return changed;
      }
      this.#release(old);
      if (slices.length === 1) this.#services.set(service, info);
      else (slices as SliceInfo[])[at] = info;
    } else {
      // A new list of its length (an insert into [] leaves room for 17); one slice is stored alone.
      this.#services.set(service, keptAs([...slices.slice(0, at), info, ...slices.slice(at)]));
      if (!namedAfter(sliceName, slice.metadata!.labels![LABEL_SERVICE_NAME]!))
        this.#owners.set(flat(namespace, '/', sliceName), service);
    }
    changed.push(service);
    return changed;
  }

  /** Removes the slice with this namespace and name. Returns the Service it belonged to, if it was stored. */
  delete(slice: EndpointSlice): ServiceKey[] {
    const namespace = slice.metadata?.namespace;
    const name = slice.metadata?.name;
    const owner = namespace && name ? this.#ownerOf(namespace, name) : undefined;
    if (owner === undefined) return [];
    this.#owners.delete(`${namespace}/${name}`);
    const slices = itemsOf(this.#services.get(owner)!);
    const at = indexOf(slices, name!);
    this.#release(slices[at]!);
    if (slices.length === 1) this.#services.delete(owner);
    else this.#services.set(owner, keptAs([...slices.slice(0, at), ...slices.slice(at + 1)]));
    return [owner];
  }

  /**
   * The Service the slice `namespace/name` is stored under, if it is: the one #owners names, else the
   * one of a name the slice's starts with, up to a dash, that holds a slice of that name (one at most:
   * slice names are unique in a namespace, and a slice is stored under one Service).
   */
  #ownerOf(namespace: string, name: string): ServiceKey | undefined {
    const listed = this.#owners.get(`${namespace}/${name}`);
    if (listed !== undefined) return listed;
    for (let dash = name.lastIndexOf('-'); dash > 0; dash = name.lastIndexOf('-', dash - 1)) {
      const service = serviceKey(namespace, name.slice(0, dash));
      const slices = this.#services.get(service);
      if (slices !== undefined && itemsOf(slices).some((s) => s.name === name)) return service;
    }
    return undefined;
  }

  /** Lets the pool know the slice's lists are dropped. */
  #release(info: SliceInfo): void {
    for (const port of itemsOf(info.ports)) for (const ep of port.endpoints) this.#pool.release(ep);
  }

  /** Distinct endpoints (by key) the stored slices share. */
  get pooledEndpoints(): number {
    return this.#pool.size;
  }

  /** Number of Services with at least one slice. */
  get size(): number {
    return this.#services.size;
  }

  /**
   * The Service's endpoints per service port key, merged over its slices: one per `ip:port` (the first
   * seen, replaced by a later duplicate that is not terminating), each list sorted by key. A port only
   * one slice has is that slice's own list (not a copy): callers must not change the lists.
   */
  endpoints(service: ServiceKey): Map<ServicePortKey, readonly Endpoint[]> {
    const out = new Map<ServicePortKey, readonly Endpoint[]>();
    const slices = this.#services.get(service);
    if (slices === undefined) return out;
    const slash = service.indexOf('/');
    const namespace = service.slice(0, slash);
    const name = service.slice(slash + 1);
    // Slice-name order makes the choice between duplicates deterministic (kube-proxy's is map order).
    for (const info of itemsOf(slices)) {
      for (const port of itemsOf(info.ports)) {
        const key = servicePortKey(servicePortName(namespace, name, port.name), port.protocol);
        const merged = out.get(key);
        out.set(key, merged === undefined ? port.endpoints : mergeEndpoints(merged, port.endpoints));
      }
    }
    return out;
  }
}

/** True when `sliceName` is `<serviceName>-<suffix>`, as the EndpointSlice controller names slices. */
function namedAfter(sliceName: string, serviceName: string): boolean {
  return (
    sliceName.length > serviceName.length + 1 &&
    sliceName.startsWith(serviceName) &&
    sliceName[serviceName.length] === '-'
  );
}

/** Where the slice named `name` is in `slices` (sorted by name), or where it would go. */
function indexOf(slices: readonly SliceInfo[], name: string): number {
  let i = 0;
  while (i < slices.length && slices[i]!.name < name) i++;
  return i;
}

/**
 * Two lists sorted by key with one endpoint per key, as one: for a key in both, `later`'s endpoint unless
 * it is terminating (the fold of endpoints() over the slices in order).
 */
function mergeEndpoints(earlier: readonly Endpoint[], later: readonly Endpoint[]): readonly Endpoint[] {
  if (later.length === 0) return earlier;
  if (earlier.length === 0) return later;
  const out: Endpoint[] = [];
  let i = 0;
  let j = 0;
  while (i < earlier.length || j < later.length) {
    const a = earlier[i];
    const b = later[j];
    if (b === undefined || (a !== undefined && a.key < b.key)) {
      out.push(a!);
      i++;
    } else if (a === undefined || b.key < a.key) {
      out.push(b);
      j++;
    } else {
      out.push(b.terminating ? a : b);
      i++;
      j++;
    }
  }
  // push leaves room for 17 or more; the list lives as long as the slices.
  return out.slice();
}

function parseSlice(name: string, slice: EndpointSlice, nodeName: string, pool: EndpointPool): SliceInfo {
  const family = slice.addressType as IPFamily;
  const parsed: SliceEndpoint[] = [];
  for (const ep of slice.endpoints ?? []) {
    const endpoint = parseEndpoint(ep, family);
    if (endpoint !== undefined) parsed.push(endpoint);
  }
  const ports: SlicePort[] = [];
  for (const p of slice.ports ?? []) {
    // kube-proxy skips ports without a name (unnamed ports have name "") and without a port number.
    if (typeof p?.name !== 'string' || !isPort(p.port)) continue;
    const protocol = p.protocol ?? 'TCP';
    if (protocol !== 'TCP' && protocol !== 'UDP') continue;
    ports.push({
      name: p.name,
      protocol,
      port: p.port,
      endpoints: endpointsAt(parsed, p.port, nodeName, pool),
    });
  }
  return { name, ports: keptAs(ports.slice()) };
}

/**
 * The slice's endpoints at `port`, sorted by key, one per key (the first, replaced by a later one that is
 * not terminating), each the pool's object when an equal one is pooled: released with the list.
 */
function endpointsAt(
  parsed: readonly SliceEndpoint[],
  port: number,
  nodeName: string,
  pool: EndpointPool,
): readonly Endpoint[] {
  if (parsed.length === 0) return NO_ENDPOINTS;
  const byKey = new Map<EndpointKey, Endpoint>();
  for (const ep of parsed) {
    const key = endpointKey(ep.ip, port);
    if (ep.terminating && byKey.has(key)) continue;
    byKey.set(key, {
      key,
      ip: ep.ip,
      port,
      family: ep.family,
      ready: ep.ready,
      serving: ep.serving,
      terminating: ep.terminating,
      isLocal: ep.nodeName !== undefined && ep.nodeName === nodeName,
      nodeName: ep.nodeName,
      zoneHints: ep.zoneHints,
      nodeHints: ep.nodeHints,
    });
  }
  // Spreading an iterator allocates exactly its length (push would leave room for 17).
  const list = [...byKey.values()].sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
  for (let i = 0; i < list.length; i++) list[i] = pool.acquire(list[i]!);
  return list;
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
  const as = itemsOf(a.ports);
  const bs = itemsOf(b.ports);
  if (as.length !== bs.length) return false;
  for (let i = 0; i < as.length; i++) {
    const x = as[i]!;
    const y = bs[i]!;
    if (x.name !== y.name || x.protocol !== y.protocol || x.port !== y.port) return false;
    if (!sameSliceEndpoints(x.endpoints, y.endpoints)) return false;
  }
  return true;
}

function sameSliceEndpoints(a: readonly Endpoint[], b: readonly Endpoint[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) {
    const x = a[i]!;
    const y = b[i]!;
    if (
      x.key !== y.key ||
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
