// ProxyState: folds Service, EndpointSlice and Node events into pending changes and hands the proxier
// immutable Snapshots (kube-proxy's ServiceChangeTracker + EndpointsChangeTracker). Pure: no I/O, no
// clock. Its objects come through the source intake: validated, selected, with a namespace and a name.
// What a valid Service cannot be programmed with is reported through `warn`.

import { ANNOTATION_LAST_CHANGE_TRIGGER_TIME, LABEL_TOPOLOGY_ZONE } from '../lib/kubernetes-labels.ts';
import { type Note, NotesOnce } from '../lib/notes-once.ts';
import type { ProxyHandlers } from '../source/handlers.ts';
import type { EndpointSlice, Node, ObjectMeta, Service } from '../source/objects.ts';
import { categorizeEndpoints, sameServicePortEndpoints } from './categorize-endpoints.ts';
import type { ServicePortEndpoints } from './endpoint.ts';
import { EndpointSliceCache, type ServiceKey, serviceKey, sliceServiceKey } from './endpoint-slice-cache.ts';
import type { ServicePort, ServicePortKey } from './service-port.ts';
import {
  sameServicePort,
  sameServicePorts,
  servicePortsFromService,
  type Warn,
} from './service-port-builder.ts';
import { ServicePortMap } from './service-port-map.ts';
import type { Snapshot } from './snapshot.ts';

export type ProxyStateOptions = {
  /** This node's name: endpoints with this nodeName are local; only this Node's labels are read. */
  nodeName: string;
  warn: Warn;
  /** Called whenever a change becomes pending, and once when both sources have synced. */
  onChange?: () => void;
  /** Trigger times at or before this (epoch ms) are dropped: they predate us (kube-proxy's trackerStartTime). */
  startTimeMs?: number;
};

/** Says when bulk work should give the event loop a turn (a Yielder); injected, so this stays pure. */
export interface TimeSlices {
  readonly due: boolean;
  turn(): Promise<void>;
}

/** One checkout in progress: what it changed so far, and the Services whose endpoints it recomputes. */
type CheckoutWork = {
  readonly changedServicePorts: Set<ServicePortKey>;
  readonly changedEndpoints: Set<ServicePortKey>;
  readonly recompute: Set<ServiceKey>;
  readonly triggerTimes: number[];
};

type ServiceChange = { readonly previous: readonly ServicePort[]; current: readonly ServicePort[] };

export class ProxyState implements ProxyHandlers {
  readonly #nodeName: string;
  /** Notes per Service, so that an update with the same problems does not log again. */
  readonly #notes: NotesOnce;
  readonly #onChange: () => void;
  readonly #startTimeMs: number;

  // The ports of every Service as of the last checkout, what the next snapshot holds (updated in place at
  // checkout). Its objects are not kept: a resync that delivers the same object again makes the same
  // ports, which cancel out as any change back does.
  readonly #servicePorts = new ServicePortMap();
  readonly #pendingServices = new Map<ServiceKey, ServiceChange>();
  readonly #slices: EndpointSliceCache;
  readonly #dirtyEndpoints = new Set<ServiceKey>();
  readonly #triggerTimes = new Map<ServiceKey, number[]>();
  /** Every applied service port's endpoints (ports gone from a Service lose theirs when it is applied). */
  readonly #endpoints = new Map<ServicePortKey, ServicePortEndpoints>();

  #nodeZone: string | undefined;
  #zoneChanged = false;
  #servicesSynced = false;
  #endpointSlicesSynced = false;
  #pendingEndpointChanges = 0;
  #serviceChangesTotal = 0;
  #endpointChangesTotal = 0;

  constructor(options: ProxyStateOptions) {
    this.#nodeName = options.nodeName;
    this.#notes = new NotesOnce(options.warn);
    this.#onChange = options.onChange ?? (() => {});
    this.#startTimeMs = options.startTimeMs ?? Number.NEGATIVE_INFINITY;
    this.#slices = new EndpointSliceCache(options.nodeName);
  }

  /** True once both Services and EndpointSlices have been listed completely (nothing is programmed before). */
  get isInitialized(): boolean {
    return this.#servicesSynced && this.#endpointSlicesSynced;
  }

  /** Services with an uncommitted change (kubeproxy_sync_proxy_rules_service_changes_pending). */
  get pendingServiceChanges(): number {
    return this.#pendingServices.size;
  }

  /** EndpointSlice updates that changed something since the last checkout (..._endpoint_changes_pending). */
  get pendingEndpointChanges(): number {
    return this.#pendingEndpointChanges;
  }

  /**
   * True when something is pending and all of it is EndpointSlice changes (no Service, no zone change):
   * a checkout then changes endpoints only, which the proxier can apply without a sync.
   */
  get onlyEndpointsPending(): boolean {
    return this.#dirtyEndpoints.size > 0 && this.#pendingServices.size === 0 && !this.#zoneChanged;
  }

  /** Every Service handler call (kubeproxy_sync_proxy_rules_service_changes_total). */
  get serviceChangesTotal(): number {
    return this.#serviceChangesTotal;
  }

  /** Every EndpointSlice update kube-proxy would consider, changed or not (..._endpoint_changes_total). */
  get endpointChangesTotal(): number {
    return this.#endpointChangesTotal;
  }

  /** This node's topology.kubernetes.io/zone label, if known. */
  get nodeZone(): string | undefined {
    return this.#nodeZone;
  }

  onServiceAdd(service: Service): void {
    this.#upsertService(service);
  }

  /** `oldService` is not trusted: the change is computed against the last good version we kept. */
  onServiceUpdate(_oldService: Service, service: Service): void {
    this.#upsertService(service);
  }

  onServiceDelete(service: Service): void {
    this.#serviceChangesTotal++;
    this.#deleteService(serviceKeyOf(service.metadata));
  }

  onServicesSynced(): void {
    this.#synced(() => (this.#servicesSynced = true));
  }

  onEndpointSliceAdd(slice: EndpointSlice): void {
    this.#upsertSlice(slice);
  }

  /** `oldSlice` is not trusted: slices are stored by name, so the new one simply replaces ours. */
  onEndpointSliceUpdate(_oldSlice: EndpointSlice, slice: EndpointSlice): void {
    this.#upsertSlice(slice);
  }

  /** `slice` may have only its name (what a source kept of it): the cache knows whose it was. */
  onEndpointSliceDelete(slice: EndpointSlice): void {
    const services = this.#slices.delete(slice);
    if (services.length > 0 || sliceServiceKey(slice) !== undefined) this.#endpointChangesTotal++;
    this.#sliceChanged(services, undefined);
  }

  onEndpointSlicesSynced(): void {
    this.#synced(() => (this.#endpointSlicesSynced = true));
  }

  onNodeUpdate(node: Node): void {
    if (node?.metadata?.name !== this.#nodeName) return;
    this.#setZone(node.metadata.labels?.[LABEL_TOPOLOGY_ZONE]);
  }

  onNodeDelete(node: Node): void {
    if (node?.metadata?.name === this.#nodeName) this.#setZone(undefined);
  }

  /**
   * Applies the pending changes and returns the full picture with what changed since the previous
   * checkout. Only Services that changed (or whose slices did) are recomputed.
   */
  checkout(): Snapshot {
    const work = this.#take();
    for (const service of work.recompute) this.#recompute(service, work);
    return this.#finish(work);
  }

  /**
   * checkout(), giving the event loop a turn whenever `slices` says one is due while endpoints are
   * recomputed (10,000 new Services at once take over 100 ms). The pending changes are taken before the
   * first turn: events that arrive during one are left for the next checkout (a slice change may also
   * show in this one, when its Service is recomputed after it; the next applies it anyway).
   */
  async checkoutAsync(slices: TimeSlices): Promise<Snapshot> {
    const work = this.#take();
    for (const service of work.recompute) {
      this.#recompute(service, work);
      if (slices.due) await slices.turn();
    }
    return this.#finish(work);
  }

  // Applies the pending Service changes to the service ports and takes everything pending, so that
  // events from here on belong to the next checkout.
  #take(): CheckoutWork {
    const work: CheckoutWork = {
      changedServicePorts: new Set(),
      changedEndpoints: new Set(),
      recompute: new Set(this.#zoneChanged ? this.#servicePorts.services() : []),
      triggerTimes: [...this.#triggerTimes.values()].flat(),
    };
    for (const service of this.#dirtyEndpoints) work.recompute.add(service);

    for (const [service, change] of this.#pendingServices) {
      const before = new Map(change.previous.map((p) => [p.key, p]));
      // A port that did not change stays the object it was (the snapshots' readers compare them).
      const ports = change.current.map((port) => {
        const old = before.get(port.key);
        before.delete(port.key);
        if (old !== undefined && sameServicePort(old, port)) return old;
        work.changedServicePorts.add(port.key);
        return port;
      });
      for (const key of before.keys()) {
        work.changedServicePorts.add(key);
        if ((this.#endpoints.get(key)?.all.length ?? 0) > 0) work.changedEndpoints.add(key);
        this.#endpoints.delete(key);
      }
      this.#servicePorts.setPorts(service, ports);
      work.recompute.add(service);
    }

    this.#pendingServices.clear();
    this.#dirtyEndpoints.clear();
    this.#triggerTimes.clear();
    this.#pendingEndpointChanges = 0;
    this.#zoneChanged = false;
    return work;
  }

  // The endpoints of one Service's ports, from the slices as they are now.
  #recompute(service: ServiceKey, work: CheckoutWork): void {
    const ports = this.#servicePorts.portsOf(service);
    const merged = ports.length > 0 ? this.#slices.endpoints(service) : undefined;
    for (const port of ports) {
      const next = categorizeEndpoints(merged?.get(port.key) ?? [], port, {
        nodeName: this.#nodeName,
        zone: this.#nodeZone,
      });
      const old = this.#endpoints.get(port.key);
      if (old !== undefined && sameServicePortEndpoints(old, next)) continue;
      if (old !== undefined || next.all.length > 0) work.changedEndpoints.add(port.key);
      this.#endpoints.set(port.key, next);
    }
  }

  #finish(work: CheckoutWork): Snapshot {
    // The maps themselves, not copies: copying 10,000 entries took ~3 ms per map and checkout, on the
    // path of every change. They only change inside a checkout, and the proxier reads the latest.
    // Not kept here: its change sets are the proxier's to let go (the cold start's name every port).
    return {
      servicePorts: this.#servicePorts,
      endpoints: this.#endpoints,
      changedServicePorts: work.changedServicePorts,
      changedEndpoints: work.changedEndpoints,
      triggerTimes: work.triggerTimes,
    };
  }

  #upsertService(service: Service): void {
    this.#serviceChangesTotal++;
    const key = serviceKeyOf(service.metadata);
    const notes: Note[] = [];
    const ports = servicePortsFromService(service, (msg, fields) => notes.push([msg, fields]));
    this.#notes.report(key, notes);
    if (this.#setServicePorts(key, ports)) this.#onChange();
  }

  #deleteService(key: ServiceKey): void {
    this.#notes.forget(key);
    if (this.#setServicePorts(key, [])) this.#onChange();
  }

  // ServiceChangeTracker.Update: keep the ports from before the first pending change; drop the entry
  // when the latest ports equal them again. True when a change is pending for this Service.
  #setServicePorts(key: ServiceKey, ports: readonly ServicePort[]): boolean {
    const pending = this.#pendingServices.get(key);
    const previous = pending?.previous ?? this.#servicePorts.portsOf(key);
    if (sameServicePorts(previous, ports)) {
      this.#pendingServices.delete(key);
      return false;
    }
    if (pending !== undefined) pending.current = ports;
    else this.#pendingServices.set(key, { previous, current: ports });
    return true;
  }

  #upsertSlice(slice: EndpointSlice): void {
    // Slices of no Service (FQDN, or no service-name label) are not counted, as in kube-proxy.
    if (sliceServiceKey(slice) !== undefined) this.#endpointChangesTotal++;
    this.#sliceChanged(this.#slices.update(slice), slice);
  }

  // `services` are those whose slices changed; `slice` is the updated slice (undefined for a removal).
  #sliceChanged(services: readonly ServiceKey[], slice: EndpointSlice | undefined): void {
    if (services.length === 0) return;
    this.#pendingEndpointChanges++;
    const owner = slice === undefined ? undefined : sliceServiceKey(slice);
    for (const service of services) {
      this.#dirtyEndpoints.add(service);
      // As kube-proxy: a removal's annotation is the time of the last update, not of this change.
      if (service !== owner) this.#triggerTimes.delete(service);
    }
    const t = triggerTime(slice?.metadata?.annotations?.[ANNOTATION_LAST_CHANGE_TRIGGER_TIME]);
    if (owner !== undefined && services.includes(owner) && t !== undefined && t > this.#startTimeMs) {
      const times = this.#triggerTimes.get(owner);
      if (times === undefined) this.#triggerTimes.set(owner, [t]);
      else times.push(t);
    }
    this.#onChange();
  }

  #setZone(zone: string | undefined): void {
    if (zone === this.#nodeZone) return;
    this.#nodeZone = zone;
    this.#zoneChanged = true;
    this.#onChange();
  }

  #synced(mark: () => void): void {
    const was = this.isInitialized;
    mark();
    if (!was && this.isInitialized) this.#onChange();
  }
}

// The intake hands over only objects with a namespace and a name.
function serviceKeyOf(meta: ObjectMeta | undefined): ServiceKey {
  return serviceKey(meta?.namespace ?? '', meta?.name ?? '');
}

const RFC3339 = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:Z|[+-]\d{2}:\d{2})$/;

/** Epoch ms of an RFC 3339 timestamp (nanoseconds allowed, truncated to ms); undefined if malformed. */
export function triggerTime(value: string | undefined): number | undefined {
  if (typeof value !== 'string' || !RFC3339.test(value)) return undefined;
  const ms = Date.parse(value);
  return Number.isNaN(ms) ? undefined : ms;
}
