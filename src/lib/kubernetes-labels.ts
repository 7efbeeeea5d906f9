// The well-known label and annotation names of Kubernetes objects that both the sources and the state
// read. A leaf: imports nothing.

/** The label that ties an EndpointSlice to its Service. */
export const LABEL_SERVICE_NAME = 'kubernetes.io/service-name';
/** Objects with this label belong to another proxy implementation (kube-proxy skips them). */
export const LABEL_SERVICE_PROXY_NAME = 'service.kubernetes.io/service-proxy-name';
/** The EndpointSlice controller puts this label on slices of headless Services. */
export const LABEL_HEADLESS = 'service.kubernetes.io/headless';
/** kube-proxy's informer selector, rendered as Go's labels.Selector.String() does. */
export const PROXY_LABEL_SELECTOR = `!${LABEL_HEADLESS},!${LABEL_SERVICE_PROXY_NAME}`;
/** Set by the EndpointSlice controller; the start of network programming latency. */
export const ANNOTATION_LAST_CHANGE_TRIGGER_TIME = 'endpoints.kubernetes.io/last-change-trigger-time';
/** Ours: per-Service override of --trace (none | connections | protocols). */
export const ANNOTATION_TRACE = 'kube-userspace-proxy.io/trace';
/** Ours: per-Service override of --proxy-protocol (off | v1 | v2). */
export const ANNOTATION_PROXY_PROTOCOL = 'kube-userspace-proxy.io/proxy-protocol';
/** Node label holding the zone, for topology hints. */
export const LABEL_TOPOLOGY_ZONE = 'topology.kubernetes.io/zone';
