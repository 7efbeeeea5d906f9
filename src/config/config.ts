// The proxy's effective configuration and its defaults (kube-proxy's where they exist). Pure data.
import type { TraceMode } from '../state/service-port.ts';

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
  nodePortAddresses: string[];
  cleanup: boolean;
  oomScoreAdj: number;
  /** --conntrack-max-per-core: accepted and checked, not applied (0 = leave nf_conntrack_max as it is). */
  conntrackMaxPerCore: number;
  /** --conntrack-min: accepted and checked, not applied. */
  conntrackMin: number;
  /** --conntrack-tcp-timeout-established: accepted and checked, not applied (0 = leave as it is). */
  conntrackTcpEstablishedTimeoutMs: number;
  /** --conntrack-tcp-timeout-close-wait: accepted and checked, not applied (0 = leave as it is). */
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
  /** Our addition: connect failures in a row that eject an endpoint; 0 = no outlier ejection. */
  outlierConsecutiveFailures: number;
  /** Our addition: the first ejection time (it doubles while the endpoint keeps failing). */
  outlierBaseEjectionMs: number;
  /** Our addition: how long shutdown waits for connections to finish. */
  shutdownGracePeriodMs: number;
  trace: TraceMode;
  /** Our addition: one log line per closed connection (--access-log). */
  accessLog: boolean;
  /** Our addition: recently closed connections kept for /debug/connections. */
  traceRecentConnections: number;
  /** Human-readable logs instead of JSON lines. */
  logFormat: 'json' | 'text';
};

export const DEFAULT_CONFIG: Config = {
  manifest: undefined,
  kubeconfig: undefined,
  master: undefined,
  hostnameOverride: '',
  bindAddress: '0.0.0.0',
  proxyPortRange: '',
  udpTimeoutMs: 250,
  udpMaxSessions: 4096,
  udpMaxSessionsTotal: 0,
  maxConnectionsPerService: 0,
  stateFile: undefined,
  iptablesSyncPeriodMs: 30_000,
  iptablesMinSyncPeriodMs: 1_000,
  configSyncPeriodMs: 15 * 60_000,
  healthzBindAddress: '0.0.0.0:10256',
  metricsBindAddress: '127.0.0.1:10249',
  bindAddressHardFail: false,
  nodePortAddresses: [],
  cleanup: false,
  oomScoreAdj: -999,
  // kube-proxy's defaults are 32768/131072/24h/1h; this proxy changes no conntrack sysctl, so its
  // defaults say so with kube-proxy's own "leave as it is" value.
  conntrackMaxPerCore: 0,
  conntrackMin: 0,
  conntrackTcpEstablishedTimeoutMs: 0,
  conntrackTcpCloseWaitTimeoutMs: 0,
  kubeApiQps: 5,
  kubeApiBurst: 10,
  kubeApiContentType: 'application/vnd.kubernetes.protobuf',
  profiling: false,
  iptables: true,
  verbosity: 0,
  tcpIdleTimeoutMs: 0,
  tcpHalfCloseTimeoutMs: 60_000,
  shutdownGracePeriodMs: 10_000,
  outlierConsecutiveFailures: 3,
  outlierBaseEjectionMs: 5_000,
  trace: 'protocols',
  accessLog: false,
  traceRecentConnections: 1000,
  logFormat: 'json',
};

/** The state file used when --state-file is not given (only if its directory is writable). */
export const DEFAULT_STATE_FILE = '/var/lib/kube-userspace-proxy/state.json';

/** klog verbosity → pino level. */
export function logLevel(verbosity: number): string {
  if (verbosity >= 4) return 'trace';
  if (verbosity >= 2) return 'debug';
  return 'info';
}
