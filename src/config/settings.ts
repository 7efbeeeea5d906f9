// The settings table: one row per Config key with its default, its flag, its KubeProxyConfiguration field
// and its codec, as kube-proxy binds each flag to its config field in one line. DEFAULT_CONFIG, the yargs
// options, the flag mapping and the file reader and writer are all derived from it. Pure data.
import { joinHostPort } from '../lib/host-port.ts';
import type { Codec } from './codecs.ts';
import { boolean, choice, duration, INT32_MAX, int, list, nonNegative, plain, text } from './codecs.ts';
import type { Config } from './config-type.ts';
import {
  DEFAULT_STATE_FILE,
  DETECT_LOCAL_MODES,
  LOG_FORMATS,
  MAX_AUTO_WORKERS,
  MAX_WORKERS,
  PROXY_PROTOCOL_MODES,
  TRACE_MODES,
} from './config-type.ts';
import {
  CONTENT_TYPES,
  checkBindAddress,
  checkCIDRs,
  checkClusterCIDRs,
  checkContentType,
  checkDetectLocalMode,
  checkHostPort,
  checkPortRange,
  checkProxyMode,
} from './validate.ts';

type Row<K, T> = {
  /** The Config key; undefined for --proxy-mode, which is checked and sets nothing. */
  readonly key: K;
  /** The command-line flag, without the dashes. */
  readonly flag: string;
  readonly default: T;
  /** The default when --bind-address is IPv6 (kube-proxy's server addresses follow its family). */
  readonly defaultIPv6?: T;
  /** The KubeProxyConfiguration field (`iptables.syncPeriod`); none for our own settings. */
  readonly file?: string;
  /** In the file a zero value (`""`, `0`, `0s`) means the default (kube-proxy's defaulting), unless 'value'. */
  readonly fileZero?: 'value';
  readonly codec: Codec<T>;
  /** --help's text for the flag. */
  readonly help: string;
  /** --help's default, when it is not the default as the codec prints it. */
  readonly shown?: string;
};

/** One row of the table, its value type erased for the code that walks the table (row() checks it). */
export type Setting = Row<keyof Config | undefined, unknown>;

function row<K extends keyof Config>(key: K, r: Omit<Row<K, Config[K]>, 'key'>): Setting {
  return { key, ...r };
}

const HEALTHZ_PORT = 10256;
const METRICS_PORT = 10249;
const MAX = Number.MAX_SAFE_INTEGER;
const hostPort = (port: number) => text((v, at) => checkHostPort(v, at, port));

/** In --help order. */
export const SETTINGS: readonly Setting[] = [
  row('manifest', {
    flag: 'manifest',
    default: undefined,
    codec: plain(),
    help: 'Serve the Services and EndpointSlices in this YAML/JSON file (no cluster needed); reloaded on change',
  }),
  row('kubeconfig', {
    flag: 'kubeconfig',
    default: undefined,
    codec: plain(),
    file: 'clientConnection.kubeconfig',
    help: 'Path to a kubeconfig file (else KUBECONFIG, ~/.kube/config, or in-cluster config)',
  }),
  row('master', {
    flag: 'master',
    default: undefined,
    codec: plain(),
    help: 'The address of the Kubernetes API server (overrides the kubeconfig)',
  }),
  {
    key: undefined,
    flag: 'proxy-mode',
    default: 'userspace',
    codec: text(checkProxyMode),
    file: 'mode',
    fileZero: 'value',
    help: 'Only "userspace" (or "") is accepted: it is the only mode this proxy has',
  },
  row('hostnameOverride', {
    flag: 'hostname-override',
    default: '',
    codec: plain({ trim: true, lower: true }),
    file: 'hostnameOverride',
    help: "This node's name",
    shown: 'the hostname',
  }),
  row('bindAddress', {
    flag: 'bind-address',
    default: '0.0.0.0',
    codec: text(checkBindAddress),
    file: 'bindAddress',
    help: 'IP the proxy listeners bind; 0.0.0.0 = all (dual-stack)',
  }),
  row('proxyPortRange', {
    flag: 'proxy-port-range',
    default: '',
    codec: text(checkPortRange),
    file: 'portRange',
    fileZero: 'value',
    help: 'Ports for proxy listeners: "" (the kernel\'s ephemeral range, hashed per service port), N, A-B or A+N',
  }),
  row('udpTimeoutMs', {
    flag: 'udp-timeout',
    default: 250,
    codec: duration({ positive: true }),
    file: 'udpIdleTimeout',
    help: 'How long an idle UDP session stays open',
  }),
  row('udpMaxSessions', {
    flag: 'udp-max-sessions',
    default: 4096,
    codec: int(1, MAX),
    help: 'UDP sessions per service port before the idlest is evicted',
  }),
  row('udpMaxSessionsTotal', {
    flag: 'udp-max-sessions-total',
    default: 0,
    codec: int(0, MAX),
    help: 'UDP sessions across all service ports before the idlest is evicted',
    shown: '0 (half the fd limit, 1024-65536)',
  }),
  row('maxConnectionsPerService', {
    flag: 'max-connections-per-service',
    // -1: derived from the descriptor limit at start (tcpConnectionCap); not accepted as a flag value.
    default: -1,
    codec: int(0, MAX),
    help: 'Concurrent TCP connections per service port (2 fds each); past it new ones are closed and counted. 0 = no cap',
    shown: 'fd limit / 8, at least 64',
  }),
  row('stateFile', {
    flag: 'state-file',
    default: undefined,
    codec: plain({ trim: true }),
    help: 'Keep the proxy-port assignment here across restarts (written atomically); "" = none',
    shown: `${DEFAULT_STATE_FILE} if writable`,
  }),
  row('iptablesSyncPeriodMs', {
    flag: 'iptables-sync-period',
    default: 30_000,
    codec: duration({ positive: true }),
    file: 'iptables.syncPeriod',
    help: 'Maximum interval between full syncs (rules repaired)',
  }),
  row('iptablesMinSyncPeriodMs', {
    flag: 'iptables-min-sync-period',
    default: 1_000,
    codec: duration(),
    file: 'iptables.minSyncPeriod',
    help: 'Minimum interval between syncs',
  }),
  row('configSyncPeriodMs', {
    flag: 'config-sync-period',
    default: 15 * 60_000,
    codec: duration({ positive: true }),
    file: 'configSyncPeriod',
    help: 'How often the API objects are relisted in full',
  }),
  row('healthzBindAddress', {
    flag: 'healthz-bind-address',
    default: joinHostPort('0.0.0.0', HEALTHZ_PORT),
    defaultIPv6: joinHostPort('::', HEALTHZ_PORT),
    codec: hostPort(HEALTHZ_PORT),
    file: 'healthzBindAddress',
    help: 'IP:port of the health server ([::]:10256 when --bind-address is IPv6); "" disables',
  }),
  row('metricsBindAddress', {
    flag: 'metrics-bind-address',
    default: joinHostPort('127.0.0.1', METRICS_PORT),
    defaultIPv6: joinHostPort('::1', METRICS_PORT),
    codec: hostPort(METRICS_PORT),
    file: 'metricsBindAddress',
    help: 'IP:port of the metrics and debug server ([::1]:10249 when --bind-address is IPv6); "" disables',
  }),
  row('bindAddressHardFail', {
    flag: 'bind-address-hard-fail',
    default: false,
    codec: boolean(),
    file: 'bindAddressHardFail',
    help: 'Exit if the health or metrics server cannot bind',
  }),
  row('nodePortAddresses', {
    flag: 'nodeport-addresses',
    default: [],
    codec: list(checkCIDRs),
    file: 'nodePortAddresses',
    fileZero: 'value',
    help: 'Comma-separated CIDRs: NodePorts answer only on local addresses in them ("" = all); "primary" = this node\'s IPs',
  }),
  row('clusterCIDRs', {
    flag: 'cluster-cidr',
    default: [],
    codec: text(checkClusterCIDRs, { write: (v) => v.join(',') }),
    file: 'clusterCIDR',
    help: "The pods' CIDR range (a comma-separated dual-stack pair for dual-stack); with --detect-local-mode=ClusterCIDR, traffic from it is from a local pod",
  }),
  row('detectLocalMode', {
    flag: 'detect-local-mode',
    default: 'ClusterCIDR',
    codec: text(checkDetectLocalMode),
    file: 'detectLocalMode',
    help: `How traffic from this node's pods is told apart: ${DETECT_LOCAL_MODES.join(', ')}`,
  }),
  row('podBridgeInterface', {
    flag: 'pod-bridge-interface',
    default: '',
    codec: plain({ trim: true }),
    file: 'detectLocal.bridgeInterface',
    help: 'With --detect-local-mode=BridgeInterface: traffic coming in on this bridge is from a local pod',
  }),
  row('podInterfaceNamePrefix', {
    flag: 'pod-interface-name-prefix',
    default: '',
    codec: plain({ trim: true }),
    file: 'detectLocal.interfaceNamePrefix',
    help: 'With --detect-local-mode=InterfaceNamePrefix: traffic coming in on interfaces with this prefix is from a local pod',
  }),
  row('cleanup', {
    flag: 'cleanup',
    default: false,
    codec: boolean(),
    help: 'Remove every iptables rule and chain this proxy writes, then exit',
  }),
  row('oomScoreAdj', {
    flag: 'oom-score-adj',
    default: -999,
    codec: int(-1000, 1000),
    file: 'oomScoreAdj',
    fileZero: 'value',
    help: 'oom_score_adj for this process, in [-1000, 1000]',
  }),
  row('conntrackMaxPerCore', {
    flag: 'conntrack-max-per-core',
    default: 32768,
    codec: int(0, INT32_MAX),
    file: 'conntrack.maxPerCore',
    fileZero: 'value',
    help: 'nf_conntrack_max = this × CPUs (at least --conntrack-min), raised only; 0 = leave as is',
  }),
  row('conntrackMin', {
    flag: 'conntrack-min',
    default: 131072,
    codec: int(0, INT32_MAX),
    file: 'conntrack.min',
    fileZero: 'value',
    help: 'The least nf_conntrack_max set from --conntrack-max-per-core',
  }),
  row('conntrackTcpEstablishedTimeoutMs', {
    flag: 'conntrack-tcp-timeout-established',
    default: 24 * 3_600_000,
    codec: duration(),
    file: 'conntrack.tcpEstablishedTimeout',
    fileZero: 'value',
    help: 'nf_conntrack_tcp_timeout_established; 0 = leave as is',
  }),
  row('conntrackTcpCloseWaitTimeoutMs', {
    flag: 'conntrack-tcp-timeout-close-wait',
    default: 3_600_000,
    codec: duration(),
    file: 'conntrack.tcpCloseWaitTimeout',
    fileZero: 'value',
    help: 'nf_conntrack_tcp_timeout_close_wait; 0 = leave as is',
  }),
  row('kubeApiQps', {
    flag: 'kube-api-qps',
    default: 5,
    codec: nonNegative(),
    file: 'clientConnection.qps',
    help: 'Accepted and checked, not applied: the API client has no rate limiter (it lists and watches)',
  }),
  row('kubeApiBurst', {
    flag: 'kube-api-burst',
    default: 10,
    codec: int(0, INT32_MAX),
    file: 'clientConnection.burst',
    help: 'Accepted and checked, not applied (see --kube-api-qps)',
  }),
  row('kubeApiContentType', {
    flag: 'kube-api-content-type',
    default: 'application/vnd.kubernetes.protobuf',
    codec: text(checkContentType),
    file: 'clientConnection.contentType',
    help: `Accepted (${CONTENT_TYPES.join(' or ')}); the client speaks JSON either way`,
  }),
  row('profiling', {
    flag: 'profiling',
    default: false,
    codec: boolean(),
    file: 'enableProfiling',
    help: 'Accepted; Node has no pprof (use node --cpu-prof or --inspect instead)',
  }),
  row('iptables', {
    flag: 'no-iptables',
    default: true,
    codec: boolean({ negated: true }),
    help: 'Listen only; program no iptables rules (services are reached on their proxy ports)',
  }),
  row('trace', {
    flag: 'trace',
    default: 'protocols',
    codec: choice(TRACE_MODES),
    help: 'none; connections (the connection table); protocols (also sniff the first bytes)',
  }),
  row('proxyProtocol', {
    flag: 'proxy-protocol',
    default: 'off',
    codec: choice(PROXY_PROTOCOL_MODES),
    help: 'PROXY protocol header (v1 text, v2 binary) sent to the endpoints of TCP Services without the kube-userspace-proxy.io/proxy-protocol annotation; off = none',
  }),
  row('tcpIdleTimeoutMs', {
    flag: 'tcp-idle-timeout',
    default: 0,
    codec: duration(),
    help: 'Close TCP connections idle this long; 0 = never',
  }),
  row('tcpHalfCloseTimeoutMs', {
    flag: 'tcp-half-close-timeout',
    default: 60_000,
    codec: duration(),
    help: 'Close a half-closed TCP connection after this long without traffic',
  }),
  row('tcpStallTimeoutMs', {
    flag: 'tcp-stall-timeout',
    default: 300_000,
    codec: duration(),
    help: "Reset a TCP connection whose endpoint has taken none of the client's bytes for this long (a client that left is otherwise never seen); 0 = never",
  }),
  row('accessLog', {
    flag: 'access-log',
    default: false,
    codec: boolean(),
    help: 'One log line per closed connection (service, client, endpoint, bytes, close reason, protocol facts)',
  }),
  row('traceRecentConnections', {
    flag: 'trace-recent-connections',
    default: 1000,
    codec: int(0, INT32_MAX),
    help: 'Recently closed connections kept for /debug/connections',
  }),
  row('outlierConsecutiveFailures', {
    flag: 'outlier-consecutive-failures',
    default: 3,
    codec: int(0, INT32_MAX),
    help: 'Eject an endpoint after this many connect failures in a row; 0 = never',
  }),
  row('outlierBaseEjectionMs', {
    flag: 'outlier-base-ejection-time',
    default: 5_000,
    codec: duration({ positive: true }),
    help: 'First ejection time; doubles while the endpoint keeps failing (up to 5m)',
  }),
  row('workers', {
    flag: 'workers',
    default: 0,
    codec: int(0, MAX_WORKERS),
    help: `Processes that relay traffic (each listens on every proxy port with SO_REUSEPORT); 0 = the cores this process may use, at most ${MAX_AUTO_WORKERS}; 1 = this process alone; at most ${MAX_WORKERS}`,
  }),
  row('shutdownGracePeriodMs', {
    flag: 'shutdown-grace-period',
    default: 10_000,
    codec: duration(),
    help: 'How long SIGTERM waits for connections to finish',
  }),
  row('logFormat', {
    flag: 'log-format',
    default: 'json',
    codec: choice(LOG_FORMATS),
    file: 'logging.format',
    help: 'json: one JSON object a line; text: readable lines',
  }),
  row('verbosity', {
    flag: 'v',
    default: 0,
    codec: int(0, MAX),
    file: 'logging.verbosity',
    fileZero: 'value',
    help: 'Log verbosity (0 info, 2 debug, 4 trace)',
  }),
];

/** The row of a Config key. */
export function settingOf(key: keyof Config): Setting {
  const setting = SETTINGS.find((s) => s.key === key);
  if (setting === undefined) throw new Error(`no setting for ${key}`);
  return setting;
}
