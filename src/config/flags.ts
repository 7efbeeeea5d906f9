// Command-line flags → Config, with kube-proxy's names and defaults. Every value is checked here, so a
// bad flag exits with one clear message before anything starts.
import yargs from 'yargs';
import { ProxyError } from '../errors.ts';
import { parsePortRange } from '../proxier/port-allocator.ts';
import type { Config } from './config.ts';
import { DEFAULT_CONFIG } from './config.ts';
import { formatDuration, isValidCIDR, isValidIP, parseDuration, parseHostPort } from './validate.ts';

export type ParsedArgs = { config: Config; help?: string; version?: boolean };

function fail(message: string): never {
  throw new ProxyError('KUP_ERR_INVALID_FLAG', message);
}

function duration(flag: string, value: string, options: { min?: number; positive?: boolean } = {}): number {
  const ms = parseDuration(value);
  if (ms === undefined) fail(`invalid --${flag} "${value}": expected a duration such as 250ms, 30s or 15m`);
  if (options.positive && ms <= 0) fail(`invalid --${flag} "${value}": must be greater than 0`);
  return ms;
}

function hostPort(flag: string, value: string): string {
  if (value === '') return '';
  if (parseHostPort(value) === undefined)
    fail(`invalid --${flag} "${value}": expected IP:port (e.g. 0.0.0.0:10256) or "" to disable`);
  return value;
}

/** The yargs parser; shared by `parseArgs` and `--help`. */
export function buildParser(argv: string[]) {
  const d = DEFAULT_CONFIG;
  return yargs(argv)
    .scriptName('kube-userspace-proxy')
    .usage(
      '$0 [flags]\n\nKubernetes userspace kube-proxy: per-service-port listeners, iptables portals, round robin with ClientIP affinity.',
    )
    .strict()
    .parserConfiguration({ 'camel-case-expansion': false, 'boolean-negation': false })
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
    .option('hostname-override', {
      type: 'string',
      default: d.hostnameOverride,
      describe: "This node's name (default: the hostname)",
    })
    .option('bind-address', {
      type: 'string',
      default: d.bindAddress,
      describe: 'IP the proxy listeners bind; 0.0.0.0 = all (dual-stack)',
    })
    .option('proxy-port-range', {
      type: 'string',
      default: d.proxyPortRange,
      describe: 'Ports for proxy listeners: "" (kernel-chosen), N, A-B or A+N',
    })
    .option('udp-timeout', {
      type: 'string',
      default: formatDuration(d.udpTimeoutMs),
      describe: 'How long an idle UDP session stays open',
    })
    .option('udp-max-sessions', {
      type: 'number',
      default: d.udpMaxSessions,
      describe: 'UDP sessions per service port before the idlest is evicted',
    })
    .option('iptables-sync-period', {
      type: 'string',
      default: formatDuration(d.iptablesSyncPeriodMs),
      describe: 'Maximum interval between full syncs (rules repaired)',
    })
    .option('iptables-min-sync-period', {
      type: 'string',
      default: formatDuration(d.iptablesMinSyncPeriodMs),
      describe: 'Minimum interval between syncs',
    })
    .option('config-sync-period', {
      type: 'string',
      default: formatDuration(d.configSyncPeriodMs),
      describe: 'How often the API objects are relisted in full',
    })
    .option('healthz-bind-address', {
      type: 'string',
      default: d.healthzBindAddress,
      describe: 'IP:port of the health server; "" disables',
    })
    .option('metrics-bind-address', {
      type: 'string',
      default: d.metricsBindAddress,
      describe: 'IP:port of the metrics and debug server; "" disables',
    })
    .option('bind-address-hard-fail', {
      type: 'boolean',
      default: d.bindAddressHardFail,
      describe: 'Exit if the health or metrics server cannot bind',
    })
    .option('nodeport-addresses', {
      type: 'string',
      default: '',
      describe: 'Comma-separated CIDRs: NodePorts answer only on local addresses in them ("" = all)',
    })
    .option('cleanup', {
      type: 'boolean',
      default: false,
      describe: 'Remove every iptables rule and chain this proxy writes, then exit',
    })
    .option('oom-score-adj', {
      type: 'number',
      default: d.oomScoreAdj,
      describe: 'oom_score_adj for this process, in [-1000, 1000]',
    })
    .option('no-iptables', {
      type: 'boolean',
      default: false,
      describe: 'Listen only; program no iptables rules (services are reached on their proxy ports)',
    })
    .option('tcp-idle-timeout', {
      type: 'string',
      default: formatDuration(d.tcpIdleTimeoutMs),
      describe: 'Close TCP connections idle this long; 0 = never',
    })
    .option('tcp-half-close-timeout', {
      type: 'string',
      default: formatDuration(d.tcpHalfCloseTimeoutMs),
      describe: 'Close a half-closed TCP connection after this long without traffic',
    })
    .option('shutdown-grace-period', {
      type: 'string',
      default: formatDuration(d.shutdownGracePeriodMs),
      describe: 'How long SIGTERM waits for connections to finish',
    })
    .option('log-format', {
      choices: ['json', 'text'] as const,
      default: d.logFormat,
      describe: 'json: one JSON object a line; text: readable lines',
    })
    .option('v', {
      type: 'number',
      default: d.verbosity,
      describe: 'Log verbosity (0 info, 2 debug, 4 trace)',
    })
    .version(false)
    .help(false)
    .option('help', { type: 'boolean', alias: 'h', describe: 'Show this help' })
    .option('version', { type: 'boolean', describe: 'Show the version' })
    .wrap(Math.min(120, process.stdout.columns || 100))
    .fail((msg, err) => {
      throw err ?? new ProxyError('KUP_ERR_INVALID_FLAG', msg);
    });
}

/** Parses and validates argv (without the node and script paths). Throws KUP_ERR_INVALID_FLAG. */
export async function parseArgs(argv: string[]): Promise<ParsedArgs> {
  const parser = buildParser(argv);
  const a = await parser.parseAsync();
  if (a.help) return { config: DEFAULT_CONFIG, help: await parser.getHelp() };
  if (a.version) return { config: DEFAULT_CONFIG, version: true };
  if (a._.length > 0) fail(`unexpected argument "${a._[0]}"`);

  const bindAddress = a['bind-address'];
  if (!isValidIP(bindAddress)) fail(`invalid --bind-address "${bindAddress}": not an IP address`);
  if (bindAddress === '127.0.0.1' || bindAddress === '::1')
    fail('invalid --bind-address: cannot proxy on localhost (iptables DNAT to loopback does not work)');
  try {
    parsePortRange(a['proxy-port-range']);
  } catch (err) {
    fail((err as Error).message);
  }
  const syncPeriod = duration('iptables-sync-period', a['iptables-sync-period'], { positive: true });
  const minSyncPeriod = duration('iptables-min-sync-period', a['iptables-min-sync-period']);
  if (minSyncPeriod > syncPeriod)
    fail(
      `--iptables-min-sync-period (${a['iptables-min-sync-period']}) must not exceed --iptables-sync-period (${a['iptables-sync-period']})`,
    );
  const nodePortAddresses = a['nodeport-addresses']
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s !== '');
  for (const cidr of nodePortAddresses)
    if (!isValidCIDR(cidr)) fail(`invalid --nodeport-addresses entry "${cidr}": not a CIDR`);
  const oom = a['oom-score-adj'];
  if (!Number.isInteger(oom) || oom < -1000 || oom > 1000)
    fail(`invalid --oom-score-adj ${oom}: must be an integer in [-1000, 1000]`);
  const maxSessions = a['udp-max-sessions'];
  if (!Number.isInteger(maxSessions) || maxSessions < 1)
    fail(`invalid --udp-max-sessions ${maxSessions}: must be a positive integer`);
  const v = a.v;
  if (!Number.isInteger(v) || v < 0) fail(`invalid --v ${v}: must be a non-negative integer`);
  if (a.manifest !== undefined && (a.kubeconfig !== undefined || a.master !== undefined)) {
    fail('--manifest cannot be combined with --kubeconfig or --master: pick one source');
  }
  const config: Config = {
    manifest: a.manifest,
    kubeconfig: a.kubeconfig,
    master: a.master,
    hostnameOverride: a['hostname-override'].trim().toLowerCase(),
    bindAddress,
    proxyPortRange: a['proxy-port-range'],
    udpTimeoutMs: duration('udp-timeout', a['udp-timeout'], { positive: true }),
    udpMaxSessions: maxSessions,
    iptablesSyncPeriodMs: syncPeriod,
    iptablesMinSyncPeriodMs: minSyncPeriod,
    configSyncPeriodMs: duration('config-sync-period', a['config-sync-period'], { positive: true }),
    healthzBindAddress: hostPort('healthz-bind-address', a['healthz-bind-address']),
    metricsBindAddress: hostPort('metrics-bind-address', a['metrics-bind-address']),
    bindAddressHardFail: a['bind-address-hard-fail'],
    nodePortAddresses,
    cleanup: a.cleanup,
    oomScoreAdj: oom,
    iptables: !a['no-iptables'],
    verbosity: v,
    tcpIdleTimeoutMs: duration('tcp-idle-timeout', a['tcp-idle-timeout']),
    tcpHalfCloseTimeoutMs: duration('tcp-half-close-timeout', a['tcp-half-close-timeout']),
    shutdownGracePeriodMs: duration('shutdown-grace-period', a['shutdown-grace-period']),
    trace: DEFAULT_CONFIG.trace,
    logFormat: a['log-format'],
  };
  return { config };
}
