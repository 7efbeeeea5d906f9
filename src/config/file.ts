// The --config file: a KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1, YAML or JSON) read into a
// checked Partial<Config>, and a Config written back as one (--write-config-to). Strict: an unknown field
// is an error; real v1alpha1 fields that do not apply to the userspace proxy are accepted and listed.
import { readFile, writeFile } from 'node:fs/promises';
import { Document, LineCounter, parseDocument, Scalar } from 'yaml';
import { ProxyError } from '../lib/errors.ts';
import type { Config } from './config.ts';
import type { ValueSource } from './validate.ts';
import {
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
  invalidValue,
} from './validate.ts';

export const CONFIG_API_VERSION = 'kubeproxy.config.k8s.io/v1alpha1';
export const CONFIG_KIND = 'KubeProxyConfiguration';

/** What a config file says. */
export type ConfigFile = {
  /** The fields the file sets, checked. A zero value (`""`, `0s`, `0`, null) is left out: it means the default. */
  readonly config: Partial<Config>;
  /** Paths of fields present with a non-zero value that do not apply here (`ipvs`, `featureGates`), to log once. */
  readonly ignored: string[];
};

type Setter = (value: unknown, at: ValueSource) => Partial<Config>;
/** A field this proxy reads; a struct of fields; or a field accepted and ignored (`any`: whatever it holds,
 * a list: a struct with exactly these fields). */
type Field =
  | { readonly set: Setter }
  | { readonly fields: Readonly<Record<string, Field>> }
  | { readonly ignore: 'any' | readonly string[] };

const INT32_MAX = 2 ** 31 - 1;

function str(v: unknown, at: ValueSource): string {
  if (typeof v !== 'string') invalidValue(at, v, 'expected a string');
  return v;
}
function num(v: unknown, at: ValueSource): number {
  if (typeof v !== 'number') invalidValue(at, v, 'expected a number');
  return v;
}
function bool(v: unknown, at: ValueSource): boolean {
  if (typeof v !== 'boolean') invalidValue(at, v, 'expected true or false');
  return v;
}
function strings(v: unknown, at: ValueSource): string[] {
  if (!Array.isArray(v) || v.some((s) => typeof s !== 'string'))
    invalidValue(at, v, 'expected a list of strings');
  return v;
}

// kube-proxy's defaulting (SetDefaults_KubeProxyConfiguration) treats these zero values as "unset", so a
// kubeadm-written file full of `""` and `0s` means the defaults; the setters below leave them out.
const set = (fn: Setter): Field => ({ set: fn });
const duration = (key: keyof Config): Field =>
  set((v, at) => {
    const ms = checkDuration(str(v, at), at);
    return ms === 0 ? {} : { [key]: ms };
  });
const ignore = (fields: 'any' | readonly string[] = 'any'): Field => ({ ignore: fields });

const FIELDS: Readonly<Record<string, Field>> = {
  bindAddress: set((v, at) => (str(v, at) === '' ? {} : { bindAddress: checkBindAddress(str(v, at), at) })),
  bindAddressHardFail: set((v, at) => ({ bindAddressHardFail: bool(v, at) })),
  clientConnection: {
    fields: {
      kubeconfig: set((v, at) => (str(v, at) === '' ? {} : { kubeconfig: str(v, at) })),
      contentType: set((v, at) =>
        str(v, at) === '' ? {} : { kubeApiContentType: checkContentType(str(v, at), at) },
      ),
      qps: set((v, at) => {
        const qps = checkNonNegative(num(v, at), at);
        return qps === 0 ? {} : { kubeApiQps: qps };
      }),
      burst: set((v, at) => {
        const burst = checkInt(num(v, at), at, 0, INT32_MAX);
        return burst === 0 ? {} : { kubeApiBurst: burst };
      }),
      acceptContentTypes: ignore(),
    },
  },
  clusterCIDR: set((v, at) => (str(v, at) === '' ? {} : { clusterCIDRs: checkClusterCIDRs(str(v, at), at) })),
  configSyncPeriod: duration('configSyncPeriodMs'),
  conntrack: {
    fields: {
      maxPerCore: set((v, at) => ({ conntrackMaxPerCore: checkInt(num(v, at), at, 0, INT32_MAX) })),
      min: set((v, at) => ({ conntrackMin: checkInt(num(v, at), at, 0, INT32_MAX) })),
      tcpEstablishedTimeout: set((v, at) => ({
        conntrackTcpEstablishedTimeoutMs: checkDuration(str(v, at), at),
      })),
      tcpCloseWaitTimeout: set((v, at) => ({
        conntrackTcpCloseWaitTimeoutMs: checkDuration(str(v, at), at),
      })),
      tcpBeLiberal: ignore(),
      udpTimeout: ignore(),
      udpStreamTimeout: ignore(),
    },
  },
  detectLocal: {
    fields: {
      bridgeInterface: set((v, at) =>
        str(v, at).trim() === '' ? {} : { podBridgeInterface: str(v, at).trim() },
      ),
      interfaceNamePrefix: set((v, at) =>
        str(v, at).trim() === '' ? {} : { podInterfaceNamePrefix: str(v, at).trim() },
      ),
    },
  },
  detectLocalMode: set((v, at) =>
    str(v, at) === '' ? {} : { detectLocalMode: checkDetectLocalMode(str(v, at), at) },
  ),
  enableProfiling: set((v, at) => ({ profiling: bool(v, at) })),
  featureGates: ignore(),
  healthzBindAddress: set((v, at) =>
    str(v, at) === '' ? {} : { healthzBindAddress: checkHostPort(str(v, at), at, 10256) },
  ),
  hostnameOverride: set((v, at) =>
    str(v, at).trim() === '' ? {} : { hostnameOverride: str(v, at).trim().toLowerCase() },
  ),
  iptables: {
    fields: {
      syncPeriod: duration('iptablesSyncPeriodMs'),
      minSyncPeriod: duration('iptablesMinSyncPeriodMs'),
      masqueradeBit: ignore(),
      masqueradeAll: ignore(),
      localhostNodePorts: ignore(),
      snatNodeInternalIP: ignore(),
    },
  },
  ipvs: ignore([
    'syncPeriod',
    'minSyncPeriod',
    'scheduler',
    'excludeCIDRs',
    'strictARP',
    'tcpTimeout',
    'tcpFinTimeout',
    'udpTimeout',
  ]),
  logging: {
    fields: {
      format: set((v, at) => {
        const f = str(v, at);
        if (f !== '' && f !== 'text' && f !== 'json') invalidValue(at, f, 'expected "text" or "json"');
        return f === '' ? {} : { logFormat: f };
      }),
      verbosity: set((v, at) => ({ verbosity: checkInt(num(v, at), at, 0, INT32_MAX) })),
      flushFrequency: ignore(),
      vmodule: ignore(),
      options: ignore(),
    },
  },
  metricsBindAddress: set((v, at) =>
    str(v, at) === '' ? {} : { metricsBindAddress: checkHostPort(str(v, at), at, 10249) },
  ),
  mode: set((v, at) => {
    checkProxyMode(str(v, at), at);
    return {};
  }),
  nftables: ignore(['masqueradeBit', 'masqueradeAll', 'syncPeriod', 'minSyncPeriod']),
  nodePortAddresses: set((v, at) => ({ nodePortAddresses: checkCIDRs(strings(v, at), at) })),
  oomScoreAdj: set((v, at) => ({ oomScoreAdj: checkInt(num(v, at), at, -1000, 1000) })),
  portRange: set((v, at) => ({ proxyPortRange: checkPortRange(str(v, at), at) })),
  // Removed from kube-proxy in 1.16; old files still carry it.
  resourceContainer: ignore(),
  showHiddenMetricsForVersion: ignore(),
  udpIdleTimeout: duration('udpTimeoutMs'),
  windowsRunAsService: ignore(),
  winkernel: ignore([
    'networkName',
    'sourceVip',
    'enableDSR',
    'rootHnsEndpointName',
    'forwardHealthCheckVip',
  ]),
};

/** True for the values a kubeadm-written file uses for "unset": not worth a warning when ignored. */
function isZero(v: unknown): boolean {
  if (v === null || v === undefined || v === false || v === 0 || v === '' || v === '0s' || v === '0')
    return true;
  if (Array.isArray(v)) return v.every(isZero);
  if (typeof v === 'object') return Object.values(v).every(isZero);
  return false;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/**
 * Parses the text of a KubeProxyConfiguration. `file` names it in messages. Throws KUP_ERR_CONFIG_FILE
 * (with `file:line:col` and the field path) for a syntax error, a wrong apiVersion or kind, an unknown
 * field, or a bad value.
 */
export function parseConfigFile(text: string, file: string): ConfigFile {
  const lines = new LineCounter();
  const doc = parseDocument(text, { lineCounter: lines, uniqueKeys: true });
  // `file:line:col` of the field at `path` (its value when it has one), for every message.
  const where = (path: readonly string[]): string => {
    const node =
      path.length === 0 ? doc.contents : (doc.getIn(path, true) as { range?: number[] } | undefined);
    const offset = node?.range?.[0];
    if (offset === undefined) return file;
    const pos = lines.linePos(offset);
    return `${file}:${pos.line}:${pos.col}`;
  };
  const fail = (path: readonly string[], message: string): never => {
    throw new ProxyError('KUP_ERR_CONFIG_FILE', `config file ${where(path)}: ${message}`);
  };
  const [syntax] = doc.errors;
  if (syntax !== undefined) {
    const pos = syntax.linePos?.[0];
    const at = pos === undefined ? file : `${file}:${pos.line}:${pos.col}`;
    const message =
      syntax.code === 'MULTIPLE_DOCS'
        ? 'holds more than one YAML document'
        : syntax.message.split(' at line ')[0];
    throw new ProxyError('KUP_ERR_CONFIG_FILE', `config file ${at}: ${message}`);
  }
  const root: unknown = doc.toJS();
  if (!isObject(root))
    return fail([], root == null ? 'the file is empty' : `expected a ${CONFIG_KIND} object`);
  if (root.apiVersion !== CONFIG_API_VERSION)
    fail(
      ['apiVersion'],
      `apiVersion is ${JSON.stringify(root.apiVersion)}, expected "${CONFIG_API_VERSION}"`,
    );
  if (root.kind !== CONFIG_KIND)
    fail(['kind'], `kind is ${JSON.stringify(root.kind)}, expected "${CONFIG_KIND}"`);

  const config: Partial<Config> = {};
  const ignored: string[] = [];
  const walk = (fields: Readonly<Record<string, Field>>, object: Record<string, unknown>, path: string[]) => {
    for (const [name, value] of Object.entries(object)) {
      const at = [...path, name];
      const field = fields[name];
      if (field === undefined) {
        if (path.length === 0 && (name === 'apiVersion' || name === 'kind')) continue;
        return fail(at, `unknown field "${at.join('.')}"`);
      }
      if (value === null || value === undefined) continue;
      const source: ValueSource = { code: 'KUP_ERR_CONFIG_FILE', name: at.join('.'), file: where(at) };
      if ('set' in field) Object.assign(config, field.set(value, source));
      else if ('fields' in field) {
        if (!isObject(value)) invalidValue(source, value, 'expected an object');
        walk(field.fields, value, at);
      } else {
        if (field.ignore !== 'any') {
          if (!isObject(value)) invalidValue(source, value, 'expected an object');
          const unknown = Object.keys(value).find((k) => !field.ignore.includes(k));
          if (unknown !== undefined) fail([...at, unknown], `unknown field "${[...at, unknown].join('.')}"`);
        }
        if (!isZero(value)) ignored.push(at.join('.'));
      }
    }
  };
  walk(FIELDS, root, []);
  return { config, ignored };
}

/** Reads and parses a config file (see parseConfigFile); an unreadable file is KUP_ERR_CONFIG_FILE too. */
export async function loadConfigFile(path: string): Promise<ConfigFile> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    throw new ProxyError('KUP_ERR_CONFIG_FILE', `config file ${path}: ${(err as Error).message}`, {
      cause: err,
    });
  }
  return parseConfigFile(text, path);
}

/**
 * Renders every field of `config` that a KubeProxyConfiguration can hold, as YAML that parseConfigFile
 * reads back to the same values. Values a file cannot express (a disabled server, a zero min sync
 * period: zero means the default there) carry a comment naming the flag that can.
 */
export function renderConfigFile(config: Config): string {
  const c = config;
  const doc = new Document({
    apiVersion: CONFIG_API_VERSION,
    kind: CONFIG_KIND,
    mode: 'userspace',
    bindAddress: c.bindAddress,
    bindAddressHardFail: c.bindAddressHardFail,
    clientConnection: {
      kubeconfig: c.kubeconfig ?? '',
      contentType: c.kubeApiContentType,
      qps: c.kubeApiQps,
      burst: c.kubeApiBurst,
    },
    clusterCIDR: c.clusterCIDRs.join(','),
    configSyncPeriod: formatDuration(c.configSyncPeriodMs),
    conntrack: {
      maxPerCore: c.conntrackMaxPerCore,
      min: c.conntrackMin,
      tcpEstablishedTimeout: formatDuration(c.conntrackTcpEstablishedTimeoutMs),
      tcpCloseWaitTimeout: formatDuration(c.conntrackTcpCloseWaitTimeoutMs),
    },
    detectLocal: { bridgeInterface: c.podBridgeInterface, interfaceNamePrefix: c.podInterfaceNamePrefix },
    detectLocalMode: c.detectLocalMode,
    enableProfiling: c.profiling,
    healthzBindAddress: c.healthzBindAddress,
    hostnameOverride: c.hostnameOverride,
    iptables: {
      syncPeriod: formatDuration(c.iptablesSyncPeriodMs),
      minSyncPeriod: formatDuration(c.iptablesMinSyncPeriodMs),
    },
    logging: { format: c.logFormat, verbosity: c.verbosity },
    metricsBindAddress: c.metricsBindAddress,
    nodePortAddresses: c.nodePortAddresses,
    oomScoreAdj: c.oomScoreAdj,
    portRange: c.proxyPortRange,
    udpIdleTimeout: formatDuration(c.udpTimeoutMs),
  });
  const note = (path: string[], text: string) => {
    const node = doc.getIn(path, true);
    if (node instanceof Scalar) node.comment = ` ${text}`;
  };
  if (c.healthzBindAddress === '')
    note(['healthzBindAddress'], 'disabled: in a file "" means the default; pass --healthz-bind-address=""');
  if (c.metricsBindAddress === '')
    note(['metricsBindAddress'], 'disabled: in a file "" means the default; pass --metrics-bind-address=""');
  if (c.iptablesMinSyncPeriodMs === 0)
    note(['iptables', 'minSyncPeriod'], 'in a file 0s means 1s; pass --iptables-min-sync-period=0');
  doc.commentBefore =
    ' Written by kube-userspace-proxy --write-config-to: the effective configuration. Flags of our own\n' +
    ' (--manifest, --no-iptables, --trace, --udp-max-sessions, --tcp-*-timeout, ...) have no field here.';
  return doc.toString({ lineWidth: 0 });
}

/** Writes renderConfigFile(config) to `path` (`/dev/stdout` works); KUP_ERR_CONFIG_FILE if it cannot. */
export async function writeConfigFile(path: string, config: Config): Promise<void> {
  try {
    await writeFile(path, renderConfigFile(config));
  } catch (err) {
    throw new ProxyError('KUP_ERR_CONFIG_FILE', `cannot write ${path}: ${(err as Error).message}`, {
      cause: err,
    });
  }
}
