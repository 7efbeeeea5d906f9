// The Kubernetes API objects we read, as plain JSON types (what the API server sends and what a manifest
// holds). Only the fields kube-proxy looks at are typed; everything is optional as on the wire.

export type ObjectMeta = {
  name?: string;
  namespace?: string;
  resourceVersion?: string;
  uid?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  deletionTimestamp?: string;
};

export type ServicePortSpec = {
  name?: string;
  protocol?: string;
  port?: number;
  targetPort?: number | string;
  nodePort?: number;
  appProtocol?: string;
};

export type Service = {
  apiVersion?: string;
  kind?: string;
  metadata?: ObjectMeta;
  spec?: {
    type?: string;
    clusterIP?: string;
    clusterIPs?: string[];
    ipFamilies?: string[];
    ipFamilyPolicy?: string;
    ports?: ServicePortSpec[];
    externalIPs?: string[];
    sessionAffinity?: string;
    sessionAffinityConfig?: { clientIP?: { timeoutSeconds?: number } };
    externalTrafficPolicy?: string;
    internalTrafficPolicy?: string;
    healthCheckNodePort?: number;
    loadBalancerSourceRanges?: string[];
    externalName?: string;
    selector?: Record<string, string>;
    publishNotReadyAddresses?: boolean;
    trafficDistribution?: string;
  };
  status?: {
    loadBalancer?: { ingress?: { ip?: string; hostname?: string; ipMode?: string }[] };
  };
};

export type EndpointSlicePort = { name?: string; protocol?: string; port?: number; appProtocol?: string };

export type EndpointSliceEndpoint = {
  addresses?: string[];
  conditions?: { ready?: boolean; serving?: boolean; terminating?: boolean };
  hostname?: string;
  nodeName?: string;
  zone?: string;
  targetRef?: { kind?: string; name?: string; namespace?: string };
  hints?: { forZones?: { name?: string }[]; forNodes?: { name?: string }[] };
};

export type EndpointSlice = {
  apiVersion?: string;
  kind?: string;
  metadata?: ObjectMeta;
  addressType?: string;
  endpoints?: EndpointSliceEndpoint[];
  ports?: EndpointSlicePort[];
};

export type Node = {
  apiVersion?: string;
  kind?: string;
  metadata?: ObjectMeta;
  spec?: { taints?: { key?: string; effect?: string }[] };
  status?: { addresses?: { type?: string; address?: string }[] };
};

// The names live in lib/ so that the state reads them without a value import of source/.
export {
  ANNOTATION_LAST_CHANGE_TRIGGER_TIME,
  ANNOTATION_TRACE,
  LABEL_HEADLESS,
  LABEL_SERVICE_NAME,
  LABEL_SERVICE_PROXY_NAME,
  LABEL_TOPOLOGY_ZONE,
  PROXY_LABEL_SELECTOR,
} from '../lib/kubernetes-labels.ts';
