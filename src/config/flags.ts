// Command-line flags (+ the --config file) → Config, with kube-proxy's names and defaults. Every value is
// checked here, so a bad flag or field exits with one clear message before anything starts.
// Precedence: defaults < --config file < flags given on the command line.
import yargs from 'yargs';
import type { ErrorCode } from '../lib/errors.ts';
import { ProxyError } from '../lib/errors.ts';
import type { Config } from './config.ts';
import { DEFAULT_CONFIG, DEFAULT_STATE_FILE, DETECT_LOCAL_MODES } from './config.ts';
import { loadConfigFile } from './file.ts';
import type { ValueSource } from './validate.ts';
import {
  CONTENT_TYPES,
  checkBindAddress,
  checkCIDRs,
  checkClusterCIDRs,
  checkContentType,
  checkDetectLocalMode,
  checkDuration,
  checkHostPort,
  checkInt,
  checkNonNegative,
  checkPortRange,
  checkProxyMode,
  formatDuration,
} from './validate.ts';

export type ParsedArgs = {
  config: Config;
  help?: string;
  version?: boolean;
  /** --config: the KubeProxyConfiguration file that was read. */
  configFile?: string;
  /** --write-config-to: the caller writes `config` there (writeConfigFile) and exits 0. */
  writeConfigTo?: string;
  /** To log once at start (warn): ignored file fields and flags, settings accepted but not applied. */
  warnings: string[];
};

/** kube-proxy flags that mean nothing for the userspace proxy: accepted (hidden), warned about, ignored. */
const IGNORED_FLAGS: Readonly<Record<string, 'string' | 'boolean'>> = {
  'masquerade-all': 'boolean',
  'iptables-masquerade-bit': 'string',
  'iptables-localhost-nodeports': 'boolean',
  'feature-gates': 'string',
  'show-hidden-metrics-for-version': 'string',
  'conntrack-tcp-be-liberal': 'boolean',
  'conntrack-udp-timeout': 'string',
  'conntrack-udp-timeout-stream': 'string',
  'ipvs-scheduler': 'string',
  'ipvs-sync-period': 'string',
  'ipvs-min-sync-period': 'string',
  'ipvs-exclude-cidrs': 'string',
  'ipvs-strict-arp': 'boolean',
  'ipvs-tcp-timeout': 'string',
  'ipvs-tcpfin-timeout': 'string',
  'ipvs-udp-timeout': 'string',
};

const flag = (name: string): ValueSource => ({ code: 'KUP_ERR_INVALID_FLAG', name: `--${name}` });

/**
 * The yargs parser; shared by `parseArgs` and `--help`. Options carry no yargs default (help shows it)
 * so that a flag left out is undefined and the config file's value can stand.
 */
export function buildParser(argv: string[]) {
  const d = DEFAULT_CONFIG;
  const dur = formatDuration;
  let parser = yargs(argv)
    .scriptName('kube-userspace-proxy')
    .usage(
      '$0 [flags]              run the proxy\n$0 connections [flags]  the live connection table of a running proxy (--help)\n$0 trace [flags]        its trace stream: HTTP requests, TLS SNI, DNS names (--help)\n\nKubernetes userspace kube-proxy: per-service-port listeners, iptables portals, round robin with ClientIP affinity.',
    )
    .strict()
    .parserConfiguration({
      'camel-case-expansion': false,
      'boolean-negation': false,
      // A flag given twice: the last one wins, as with kube-proxy's pflag.
      'duplicate-arguments-array': false,
    })
    .option('config', {
      type: 'string',
      describe:
        'A KubeProxyConfiguration file (YAML or JSON); flags given on the command line override its fields',
    })
    .option('write-config-to', {
      type: 'string',
      describe: 'Write the effective configuration as a KubeProxyConfiguration to this file, then exit',
    })
    .option('manifest', {
      type: 'string',
      describe:
        'Serve the Services and EndpointSlices in this YAML/JSON file (no cluster needed); reloaded on change',
    })
    .option('kubeconfig', {
      type: 'string',
      describe: 'Path to a kubeconfig file (else KUBECONFIG, ~/.kube/config, or in-cluster config)',
    })
    .option('master', {
      type: 'string',
      describe: 'The address of the Kubernetes API server (overrides the kubeconfig)',
    })
    .option('proxy-mode', {
      type: 'string',
      defaultDescription: 'userspace',
      describe: 'Only "userspace" (or "") is accepted: it is the only mode this proxy has',
    })
    .option('hostname-override', {
      type: 'string',
      defaultDescription: 'the hostname',
      describe: "This node's name",
    })
    .option('bind-address', {
      type: 'string',
      defaultDescription: d.bindAddress,
      describe: 'IP the proxy listeners bind; 0.0.0.0 = all (dual-stack)',
    })
    .option('proxy-port-range', {
      type: 'string',
      defaultDescription: '""',
      describe: 'Ports for proxy listeners: "" (kernel-chosen), N, A-B or A+N',
    })
    .option('udp-timeout', {
      type: 'string',
      defaultDescription: dur(d.udpTimeoutMs),
      describe: 'How long an idle UDP session stays open',
    })
    .option('udp-max-sessions', {
      type: 'number',
      defaultDescription: String(d.udpMaxSessions),
      describe: 'UDP sessions per service port before the idlest is evicted',
    })
    .option('udp-max-sessions-total', {
      type: 'number',
      defaultDescription: '0 (half the fd limit, 1024-65536)',
      describe: 'UDP sessions across all service ports before the idlest is evicted',
    })
    .option('max-connections-per-service', {
      type: 'number',
      defaultDescription: '0 (no cap)',
      describe: 'Concurrent TCP connections per service port; past it new ones are closed and counted',
    })
    .option('state-file', {
      type: 'string',
      defaultDescription: `${DEFAULT_STATE_FILE} if writable`,
      describe: 'Keep the proxy-port assignment here across restarts (written atomically); "" = none',
    })
    .option('iptables-sync-period', {
      type: 'string',
      defaultDescription: dur(d.iptablesSyncPeriodMs),
      describe: 'Maximum interval between full syncs (rules repaired)',
    })
    .option('iptables-min-sync-period', {
      type: 'string',
      defaultDescription: dur(d.iptablesMinSyncPeriodMs),
      describe: 'Minimum interval between syncs',
    })
    .option('config-sync-period', {
      type: 'string',
      defaultDescription: dur(d.configSyncPeriodMs),
      describe: 'How often the API objects are relisted in full',
    })
    .option('healthz-bind-address', {
      type: 'string',
      defaultDescription: d.healthzBindAddress,
      describe: 'IP:port of the health server ([::]:10256 when --bind-address is IPv6); "" disables',
    })
    .option('metrics-bind-address', {
      type: 'string',
      defaultDescription: d.metricsBindAddress,
      describe:
        'IP:port of the metrics and debug server ([::1]:10249 when --bind-address is IPv6); "" disables',
    })
    .option('bind-address-hard-fail', {
      type: 'boolean',
      defaultDescription: String(d.bindAddressHardFail),
      describe: 'Exit if the health or metrics server cannot bind',
    })
    .option('nodeport-addresses', {
      type: 'string',
      defaultDescription: '""',
      describe:
        'Comma-separated CIDRs: NodePorts answer only on local addresses in them ("" = all); "primary" = this node\'s IPs',
    })
    .option('cluster-cidr', {
      type: 'string',
      defaultDescription: '""',
      describe:
        "The pods' CIDR range (a comma-separated dual-stack pair for dual-stack); with --detect-local-mode=ClusterCIDR, traffic from it is from a local pod",
    })
    .option('detect-local-mode', {
      type: 'string',
      defaultDescription: d.detectLocalMode,
      describe: `How traffic from this node's pods is told apart: ${DETECT_LOCAL_MODES.join(', ')}`,
    })
    .option('pod-bridge-interface', {
      type: 'string',
      defaultDescription: '""',
      describe:
        'With --detect-local-mode=BridgeInterface: traffic coming in on this bridge is from a local pod',
    })
    .option('pod-interface-name-prefix', {
      type: 'string',
      defaultDescription: '""',
      describe:
        'With --detect-local-mode=InterfaceNamePrefix: traffic coming in on interfaces with this prefix is from a local pod',
    })
    .option('cleanup', {
      type: 'boolean',
      defaultDescription: 'false',
      describe: 'Remove every iptables rule and chain this proxy writes, then exit',
    })
    .option('oom-score-adj', {
      type: 'number',
      defaultDescription: String(d.oomScoreAdj),
      describe: 'oom_score_adj for this process, in [-1000, 1000]',
    })
    .option('conntrack-max-per-core', {
      type: 'number',
      defaultDescription: String(d.conntrackMaxPerCore),
      describe: 'nf_conntrack_max = this × CPUs (at least --conntrack-min), raised only; 0 = leave as is',
    })
    .option('conntrack-min', {
      type: 'number',
      defaultDescription: String(d.conntrackMin),
      describe: 'The least nf_conntrack_max set from --conntrack-max-per-core',
    })
    .option('conntrack-tcp-timeout-established', {
      type: 'string',
      defaultDescription: dur(d.conntrackTcpEstablishedTimeoutMs),
      describe: 'nf_conntrack_tcp_timeout_established; 0 = leave as is',
    })
    .option('conntrack-tcp-timeout-close-wait', {
      type: 'string',
      defaultDescription: dur(d.conntrackTcpCloseWaitTimeoutMs),
      describe: 'nf_conntrack_tcp_timeout_close_wait; 0 = leave as is',
    })
    .option('kube-api-qps', {
      type: 'number',
      defaultDescription: String(d.kubeApiQps),
      describe:
        'Accepted and checked, not applied: the API client has no rate limiter (it lists and watches)',
    })
    .option('kube-api-burst', {
      type: 'number',
      defaultDescription: String(d.kubeApiBurst),
      describe: 'Accepted and checked, not applied (see --kube-api-qps)',
    })
    .option('kube-api-content-type', {
      type: 'string',
      defaultDescription: d.kubeApiContentType,
      describe: `Accepted (${CONTENT_TYPES.join(' or ')}); the client speaks JSON either way`,
    })
    .option('profiling', {
      type: 'boolean',
      defaultDescription: 'false',
      describe: 'Accepted; Node has no pprof (use node --cpu-prof or --inspect instead)',
    })
    .option('no-iptables', {
      type: 'boolean',
      default: false,
      describe: 'Listen only; program no iptables rules (services are reached on their proxy ports)',
    })
    .option('trace', {
      choices: ['none', 'connections', 'protocols'] as const,
      defaultDescription: d.trace,
      describe: 'none; connections (the connection table); protocols (also sniff the first bytes)',
    })
    .option('tcp-idle-timeout', {
      type: 'string',
      defaultDescription: dur(d.tcpIdleTimeoutMs),
      describe: 'Close TCP connections idle this long; 0 = never',
    })
    .option('tcp-half-close-timeout', {
      type: 'string',
      defaultDescription: dur(d.tcpHalfCloseTimeoutMs),
      describe: 'Close a half-closed TCP connection after this long without traffic',
    })
    .option('access-log', {
      type: 'boolean',
      defaultDescription: String(d.accessLog),
      describe:
        'One log line per closed connection (service, client, endpoint, bytes, close reason, protocol facts)',
    })
    .option('trace-recent-connections', {
      type: 'number',
      defaultDescription: String(d.traceRecentConnections),
      describe: 'Recently closed connections kept for /debug/connections',
    })
    .option('outlier-consecutive-failures', {
      type: 'number',
      defaultDescription: String(d.outlierConsecutiveFailures),
      describe: 'Eject an endpoint after this many connect failures in a row; 0 = never',
    })
    .option('outlier-base-ejection-time', {
      type: 'string',
      defaultDescription: dur(d.outlierBaseEjectionMs),
      describe: 'First ejection time; doubles while the endpoint keeps failing (up to 5m)',
    })
    .option('shutdown-grace-period', {
      type: 'string',
      defaultDescription: dur(d.shutdownGracePeriodMs),
      describe: 'How long SIGTERM waits for connections to finish',
    })
    .option('log-format', {
      choices: ['json', 'text'] as const,
      defaultDescription: d.logFormat,
      describe: 'json: one JSON object a line; text: readable lines',
    })
    .option('v', {
      type: 'number',
      defaultDescription: String(d.verbosity),
      describe: 'Log verbosity (0 info, 2 debug, 4 trace)',
    });
  for (const [name, type] of Object.entries(IGNORED_FLAGS))
    parser = parser.option(name, { type, hidden: true });
  return parser
    .epilogue(
      `Accepted for kube-proxy compatibility and ignored (they do not apply to the userspace mode): ${Object.keys(
        IGNORED_FLAGS,
      )
        .map((f) => `--${f}`)
        .join(', ')}.`,
    )
    .version(false)
    .help(false)
    .option('help', { type: 'boolean', alias: 'h', describe: 'Show this help' })
    .option('version', { type: 'boolean', describe: 'Show the version' })
    .wrap(Math.min(120, process.stdout.columns || 100))
    .fail((msg, err) => {
      throw err ?? new ProxyError('KUP_ERR_INVALID_FLAG', msg);
    });
}

type Args = Awaited<ReturnType<ReturnType<typeof buildParser>['parseAsync']>>;

/** The Config fields the command line sets, each checked; flags left out are absent. */
function fromFlags(a: Args): Partial<Config> {
  const c: Partial<Config> = {};
  const duration = (name: string, options: { positive?: boolean } = {}) => {
    const v = a[name] as string | undefined;
    return v === undefined ? undefined : checkDuration(v, flag(name), options);
  };
  const put = <K extends keyof Config>(key: K, value: Config[K] | undefined) => {
    if (value !== undefined) c[key] = value;
  };
  put('manifest', a.manifest);
  put('kubeconfig', a.kubeconfig);
  put('master', a.master);
  if (a['proxy-mode'] !== undefined) checkProxyMode(a['proxy-mode'], flag('proxy-mode'));
  put('hostnameOverride', a['hostname-override']?.trim().toLowerCase());
  if (a['bind-address'] !== undefined)
    put('bindAddress', checkBindAddress(a['bind-address'], flag('bind-address')));
  if (a['proxy-port-range'] !== undefined)
    put('proxyPortRange', checkPortRange(a['proxy-port-range'], flag('proxy-port-range')));
  put('udpTimeoutMs', duration('udp-timeout', { positive: true }));
  if (a['udp-max-sessions'] !== undefined)
    put(
      'udpMaxSessions',
      checkInt(a['udp-max-sessions'], flag('udp-max-sessions'), 1, Number.MAX_SAFE_INTEGER),
    );
  if (a['udp-max-sessions-total'] !== undefined)
    put(
      'udpMaxSessionsTotal',
      checkInt(a['udp-max-sessions-total'], flag('udp-max-sessions-total'), 0, Number.MAX_SAFE_INTEGER),
    );
  if (a['max-connections-per-service'] !== undefined)
    put(
      'maxConnectionsPerService',
      checkInt(
        a['max-connections-per-service'],
        flag('max-connections-per-service'),
        0,
        Number.MAX_SAFE_INTEGER,
      ),
    );
  put('stateFile', a['state-file']?.trim());
  put('iptablesSyncPeriodMs', duration('iptables-sync-period', { positive: true }));
  put('iptablesMinSyncPeriodMs', duration('iptables-min-sync-period'));
  put('configSyncPeriodMs', duration('config-sync-period', { positive: true }));
  const hostPort = (name: string, port: number) => {
    const v = a[name] as string | undefined;
    return v === undefined ? undefined : checkHostPort(v, flag(name), port);
  };
  put('healthzBindAddress', hostPort('healthz-bind-address', 10256));
  put('metricsBindAddress', hostPort('metrics-bind-address', 10249));
  put('bindAddressHardFail', a['bind-address-hard-fail']);
  if (a['nodeport-addresses'] !== undefined)
    put('nodePortAddresses', checkCIDRs(a['nodeport-addresses'].split(','), flag('nodeport-addresses')));
  if (a['cluster-cidr'] !== undefined)
    put('clusterCIDRs', checkClusterCIDRs(a['cluster-cidr'], flag('cluster-cidr')));
  if (a['detect-local-mode'] !== undefined)
    put('detectLocalMode', checkDetectLocalMode(a['detect-local-mode'], flag('detect-local-mode')));
  put('podBridgeInterface', a['pod-bridge-interface']?.trim());
  put('podInterfaceNamePrefix', a['pod-interface-name-prefix']?.trim());
  put('cleanup', a.cleanup);
  if (a['oom-score-adj'] !== undefined)
    put('oomScoreAdj', checkInt(a['oom-score-adj'], flag('oom-score-adj'), -1000, 1000));
  const int32 = (name: string) => {
    const v = a[name] as number | undefined;
    return v === undefined ? undefined : checkInt(v, flag(name), 0, 2 ** 31 - 1);
  };
  put('conntrackMaxPerCore', int32('conntrack-max-per-core'));
  put('conntrackMin', int32('conntrack-min'));
  put('conntrackTcpEstablishedTimeoutMs', duration('conntrack-tcp-timeout-established'));
  put('conntrackTcpCloseWaitTimeoutMs', duration('conntrack-tcp-timeout-close-wait'));
  if (a['kube-api-qps'] !== undefined)
    put('kubeApiQps', checkNonNegative(a['kube-api-qps'], flag('kube-api-qps')));
  put('kubeApiBurst', int32('kube-api-burst'));
  if (a['kube-api-content-type'] !== undefined)
    put('kubeApiContentType', checkContentType(a['kube-api-content-type'], flag('kube-api-content-type')));
  put('profiling', a.profiling);
  if (a['no-iptables']) put('iptables', false);
  put('trace', a.trace);
  put('tcpIdleTimeoutMs', duration('tcp-idle-timeout'));
  put('tcpHalfCloseTimeoutMs', duration('tcp-half-close-timeout'));
  put('shutdownGracePeriodMs', duration('shutdown-grace-period'));
  put('outlierConsecutiveFailures', int32('outlier-consecutive-failures'));
  put('accessLog', a['access-log']);
  put('traceRecentConnections', int32('trace-recent-connections'));
  put('outlierBaseEjectionMs', duration('outlier-base-ejection-time', { positive: true }));
  put('logFormat', a['log-format']);
  if (a.v !== undefined) put('verbosity', checkInt(a.v, flag('v'), 0, Number.MAX_SAFE_INTEGER));
  return c;
}

/** Parses and validates argv (without the node and script paths) and the --config file it names.
 * Throws KUP_ERR_INVALID_FLAG for a bad flag, KUP_ERR_CONFIG_FILE for a bad file. */
export async function parseArgs(argv: string[]): Promise<ParsedArgs> {
  const parser = buildParser(argv);
  const a = await parser.parseAsync();
  if (a.help) return { config: DEFAULT_CONFIG, help: await parser.getHelp(), warnings: [] };
  if (a.version) return { config: DEFAULT_CONFIG, version: true, warnings: [] };
  if (a._.length > 0) throw new ProxyError('KUP_ERR_INVALID_FLAG', `unexpected argument "${a._[0]}"`);

  const flags = fromFlags(a);
  const warnings: string[] = [];
  const file = a.config === undefined ? undefined : await loadConfigFile(a.config);
  if (file !== undefined && file.ignored.length > 0)
    warnings.push(
      `Ignored fields of ${a.config} that do not apply to the userspace proxy: ${file.ignored.join(', ')}`,
    );
  const config: Config = { ...DEFAULT_CONFIG, ...file?.config, ...flags };

  // Where a value came from, for a message about two of them.
  const origin = (key: keyof Config, flagName: string, field: string) =>
    key in flags
      ? { flag: true, name: `--${flagName}` }
      : file !== undefined && key in file.config
        ? { flag: false, name: `${field} in ${a.config}` }
        : { flag: false, name: `--${flagName}` };
  const conflict = (involved: { flag: boolean }[], message: string): never => {
    const code: ErrorCode =
      file !== undefined && !involved.some((o) => o.flag) ? 'KUP_ERR_CONFIG_FILE' : 'KUP_ERR_INVALID_FLAG';
    throw new ProxyError(code, message);
  };
  if (config.iptablesMinSyncPeriodMs > config.iptablesSyncPeriodMs) {
    const min = origin('iptablesMinSyncPeriodMs', 'iptables-min-sync-period', 'iptables.minSyncPeriod');
    const max = origin('iptablesSyncPeriodMs', 'iptables-sync-period', 'iptables.syncPeriod');
    conflict(
      [min, max],
      `${min.name} (${formatDuration(config.iptablesMinSyncPeriodMs)}) must not exceed ${max.name} (${formatDuration(config.iptablesSyncPeriodMs)})`,
    );
  }
  if (config.manifest !== undefined && (config.kubeconfig !== undefined || config.master !== undefined)) {
    const other =
      config.master !== undefined
        ? origin('master', 'master', 'master')
        : origin('kubeconfig', 'kubeconfig', 'clientConnection.kubeconfig');
    conflict([{ flag: true }], `--manifest cannot be combined with ${other.name}: pick one source`);
  }
  // kube-proxy's validateInterface: the mode's interface must be named.
  const needs = {
    BridgeInterface: ['podBridgeInterface', 'pod-bridge-interface', 'detectLocal.bridgeInterface'],
    InterfaceNamePrefix: [
      'podInterfaceNamePrefix',
      'pod-interface-name-prefix',
      'detectLocal.interfaceNamePrefix',
    ],
  } as const;
  if (config.detectLocalMode === 'BridgeInterface' || config.detectLocalMode === 'InterfaceNamePrefix') {
    const [key, flagName, field] = needs[config.detectLocalMode];
    if (config[key] === '') {
      const mode = origin('detectLocalMode', 'detect-local-mode', 'detectLocalMode');
      const value = origin(key, flagName, field);
      conflict([mode, value], `${mode.name}=${config.detectLocalMode} needs a non-empty ${value.name}`);
    }
  }
  // kube-proxy's defaults follow the family of bindAddress.
  if (config.bindAddress.includes(':')) {
    if (!('healthzBindAddress' in flags) && !file?.config.healthzBindAddress)
      config.healthzBindAddress = '[::]:10256';
    if (!('metricsBindAddress' in flags) && !file?.config.metricsBindAddress)
      config.metricsBindAddress = '[::1]:10249';
  }

  const ignoredFlags = Object.keys(IGNORED_FLAGS).filter((f) => a[f] !== undefined);
  if (ignoredFlags.length > 0)
    warnings.push(
      `Ignored flags that do not apply to the userspace proxy: ${ignoredFlags.map((f) => `--${f}`).join(', ')}`,
    );
  if (config.profiling) warnings.push('Profiling is not available (Node has no pprof): use node --cpu-prof');

  const parsed: ParsedArgs = { config, warnings };
  if (a.config !== undefined) parsed.configFile = a.config;
  if (a['write-config-to'] !== undefined) parsed.writeConfigTo = a['write-config-to'];
  return parsed;
}
