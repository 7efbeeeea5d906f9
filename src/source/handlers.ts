// The events every source (kubernetes, manifest) produces, named as kube-proxy's config handlers are.
// A source calls these in order; the state module implements them. No I/O here. An update's old object
// and a delete's object may be only what the source kept of it: its kind, namespace, name and
// resourceVersion (reflector.ts); a handler keeps what it needs of an added or updated object itself.
import type { EndpointSlice, Node, Service } from './objects.ts';

export interface ServiceHandler {
  onServiceAdd(service: Service): void;
  onServiceUpdate(oldService: Service, service: Service): void;
  onServiceDelete(service: Service): void;
  /** Called once, after the first complete list of Services was delivered. */
  onServicesSynced(): void;
}

export interface EndpointSliceHandler {
  onEndpointSliceAdd(slice: EndpointSlice): void;
  onEndpointSliceUpdate(oldSlice: EndpointSlice, slice: EndpointSlice): void;
  onEndpointSliceDelete(slice: EndpointSlice): void;
  /** Called once, after the first complete list of EndpointSlices was delivered. */
  onEndpointSlicesSynced(): void;
}

export interface NodeHandler {
  /** This node's object was added or changed (labels such as the zone). */
  onNodeUpdate(node: Node): void;
  onNodeDelete(node: Node): void;
}

export type ProxyHandlers = ServiceHandler & EndpointSliceHandler & NodeHandler;
