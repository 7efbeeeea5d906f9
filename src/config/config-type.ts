// The Config type: the proxy's effective configuration, and the vocabulary of its values. Pure types and
// constants; its defaults, flags and file fields are rows of settings.ts.

/** kube-proxy's LocalMode values (--detect-local-mode). */
export const DETECT_LOCAL_MODES = [
  'ClusterCIDR',
  'NodeCIDR',
  'BridgeInterface',
  'InterfaceNamePrefix',
] as const;

export type DetectLocalMode = (typeof DETECT_LOCAL_MODES)[number];

/** --trace and the per-Service annotation: what the connection table and the sniffers record. */
export const TRACE_MODES = ['none', 'connections', 'protocols'] as const;
export type TraceMode = (typeof TRACE_MODES)[number];

/** --proxy-protocol and the per-Service annotation: the PROXY protocol header TCP endpoints get first. */
export const PROXY_PROTOCOL_MODES = ['off', 'v1', 'v2'] as const;
export type ProxyProtocolMode = (typeof PROXY_PROTOCOL_MODES)[number];

/** The most --workers may ask for (0 asks for the cores this process may use, capped here too). */
export const MAX_WORKERS = 16;

/**
 * What `--workers 0` (the default) asks for at most: the cores, but no more than 8 processes (each is a
 * Node heap of its own, ~45 MB at start, and a socket per proxy port), whatever the node's size.
 */
export const MAX_AUTO_WORKERS = 8;

/** --log-format: one JSON object a line, or readable lines. */
export const LOG_FORMATS = ['json', 'text'] as const;

/** The one `nodePortAddresses` keyword kube-proxy has: this node's primary IPs (one per family). */
export const NODE_PORT_ADDRESSES_PRIMARY = 'primary';

export type Config = {
  /** --manifest: the embedded default source. */
  manifest: string | undefined;
  kubeconfig: string | undefined;
  master: string | undefined;
  hostnameOverride: string;
  /** --bind-address: where proxy listeners bind (0.0.0.0 = all addresses, dual-stack). */
  bindAddress: string;
  proxyPortRange: string;
  udpTimeoutMs: number;
  /** Our addition: UDP sessions per service port before the idlest is evicted. */
  udpMaxSessions: number;
  /**
   * Our addition: UDP sessions across all service ports before the idlest is evicted; 0 = auto (half the
   * file-descriptor limit, between 1024 and 65536).
   */
  udpMaxSessionsTotal: number;
  /** Our addition: concurrent TCP connections per service port; past it new ones are closed. 0 = no cap. */
  maxConnectionsPerService: number;
  /**
   * Our addition: where the proxy-port assignment is kept across restarts. undefined = the default path
   * when its directory is writable (else none); '' = none.
   */
  stateFile: string | undefined;
  iptablesSyncPeriodMs: number;
  iptablesMinSyncPeriodMs: number;
  configSyncPeriodMs: number;
  /** host:port, or '' to disable. */
  healthzBindAddress: string;
  metricsBindAddress: string;
  bindAddressHardFail: boolean;
  /** --nodeport-addresses: CIDRs, or `['primary']` (this node's IPs, see resolveNodePortAddresses). */
  nodePortAddresses: string[];
  /** --cluster-cidr (clusterCIDR): the pods' CIDRs, at most one per family; for detectLocalMode ClusterCIDR. */
  clusterCIDRs: string[];
  /** --detect-local-mode: how rules tell traffic from this node's pods (see netfilter/local-detect.ts). */
  detectLocalMode: DetectLocalMode;
  /** --pod-bridge-interface (detectLocal.bridgeInterface): for detectLocalMode BridgeInterface. */
  podBridgeInterface: string;
  /** --pod-interface-name-prefix (detectLocal.interfaceNamePrefix): for detectLocalMode InterfaceNamePrefix. */
  podInterfaceNamePrefix: string;
  cleanup: boolean;
  oomScoreAdj: number;
  /** --conntrack-max-per-core: nf_conntrack_max = max(this × CPUs, conntrackMin); 0 = leave it as it is. */
  conntrackMaxPerCore: number;
  /** --conntrack-min: the floor of nf_conntrack_max. */
  conntrackMin: number;
  /** --conntrack-tcp-timeout-established: nf_conntrack_tcp_timeout_established; 0 = leave it as it is. */
  conntrackTcpEstablishedTimeoutMs: number;
  /** --conntrack-tcp-timeout-close-wait: nf_conntrack_tcp_timeout_close_wait; 0 = leave it as it is. */
  conntrackTcpCloseWaitTimeoutMs: number;
  /** --kube-api-qps / --kube-api-burst: the API client's request rate (clientConnection.qps/burst). */
  kubeApiQps: number;
  kubeApiBurst: number;
  /** --kube-api-content-type: what the API client asks for (client-node speaks JSON whatever this says). */
  kubeApiContentType: string;
  /** --profiling (enableProfiling): accepted; Node has no pprof, so nothing is served for it. */
  profiling: boolean;
  /** --no-iptables: listen only, program nothing. */
  iptables: boolean;
  /** klog-style verbosity: 0 info, 2 debug, 4+ trace. */
  verbosity: number;
  /** Our addition: TCP idle timeout; 0 = none (kube-proxy). */
  tcpIdleTimeoutMs: number;
  /** Our addition: how long a half-closed TCP connection may stay without traffic. */
  tcpHalfCloseTimeoutMs: number;
  /** --tcp-stall-timeout: a connection whose endpoint takes none of the client's bytes this long is reset; 0 = never. */
  tcpStallTimeoutMs: number;
  /** Our addition: connect failures in a row that eject an endpoint; 0 = no outlier ejection. */
  outlierConsecutiveFailures: number;
  /** Our addition: the first ejection time (it doubles while the endpoint keeps failing). */
  outlierBaseEjectionMs: number;
  /** Our addition: relaying processes (--workers); 0 = the cores this process may use, capped. */
  workers: number;
  /** Our addition: how long shutdown waits for connections to finish. */
  shutdownGracePeriodMs: number;
  trace: TraceMode;
  /** Our addition: the PROXY protocol header of Services without the annotation (--proxy-protocol). */
  proxyProtocol: ProxyProtocolMode;
  /** Our addition: one log line per closed connection (--access-log). */
  accessLog: boolean;
  /** Our addition: recently closed connections kept for /debug/connections. */
  traceRecentConnections: number;
  /** Human-readable logs instead of JSON lines. */
  logFormat: (typeof LOG_FORMATS)[number];
};

/** The state file used when --state-file is not given (only if its directory is writable). */
export const DEFAULT_STATE_FILE = '/var/lib/kube-userspace-proxy/state.json';
