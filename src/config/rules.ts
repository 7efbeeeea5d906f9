// The layers merged (defaults < --config file < flags) and the rules across settings: the checks one value
// alone cannot fail and the defaults that follow another setting. Pure. A message about two values names
// where each came from: a flag, or a field of the --config file.
import type { ErrorCode } from '../lib/errors.ts';
import { ProxyError } from '../lib/errors.ts';
import { DEFAULT_CONFIG } from './config.ts';
import type { Config } from './config-type.ts';
import { SETTINGS, settingOf } from './settings.ts';
import { formatDuration } from './validate.ts';

/** What the command line set, and what the --config file (at `path`) set. */
export type Layers = {
  readonly flags: Partial<Config>;
  readonly file: { readonly path: string; readonly config: Partial<Config> } | undefined;
};

type Origin = { readonly flag: boolean; readonly name: string };

/** kube-proxy's validateInterface: the interface modes need their interface named. */
const MODE_INTERFACE = {
  BridgeInterface: 'podBridgeInterface',
  InterfaceNamePrefix: 'podInterfaceNamePrefix',
} as const;

/**
 * The effective Config of the layers, checked across settings. Throws KUP_ERR_CONFIG_FILE when the file
 * alone is to blame, else KUP_ERR_INVALID_FLAG.
 */
export function resolveConfig({ flags, file }: Layers): Config {
  const config: Config = { ...DEFAULT_CONFIG, ...file?.config, ...flags };
  const origin = (key: keyof Config): Origin => {
    const setting = settingOf(key);
    if (key in flags) return { flag: true, name: `--${setting.flag}` };
    if (file !== undefined && key in file.config)
      return { flag: false, name: `${setting.file} in ${file.path}` };
    return { flag: false, name: `--${setting.flag}` };
  };
  const conflict = (involved: Origin[], message: string): never => {
    const code: ErrorCode =
      file !== undefined && !involved.some((o) => o.flag) ? 'KUP_ERR_CONFIG_FILE' : 'KUP_ERR_INVALID_FLAG';
    throw new ProxyError(code, message);
  };

  if (config.iptablesMinSyncPeriodMs > config.iptablesSyncPeriodMs) {
    const min = origin('iptablesMinSyncPeriodMs');
    const max = origin('iptablesSyncPeriodMs');
    conflict(
      [min, max],
      `${min.name} (${formatDuration(config.iptablesMinSyncPeriodMs)}) must not exceed ${max.name} (${formatDuration(config.iptablesSyncPeriodMs)})`,
    );
  }
  if (config.manifest !== undefined && (config.kubeconfig !== undefined || config.master !== undefined)) {
    const other = origin(config.master !== undefined ? 'master' : 'kubeconfig');
    conflict(
      [{ flag: true, name: '--manifest' }],
      `--manifest cannot be combined with ${other.name}: pick one source`,
    );
  }
  if (config.detectLocalMode === 'BridgeInterface' || config.detectLocalMode === 'InterfaceNamePrefix') {
    const key = MODE_INTERFACE[config.detectLocalMode];
    if (config[key] === '') {
      const mode = origin('detectLocalMode');
      const value = origin(key);
      conflict([mode, value], `${mode.name}=${config.detectLocalMode} needs a non-empty ${value.name}`);
    }
  }
  // kube-proxy's server addresses follow the family of bindAddress unless given.
  if (config.bindAddress.includes(':'))
    for (const { key, defaultIPv6 } of SETTINGS)
      if (key !== undefined && defaultIPv6 !== undefined && !(key in flags) && !file?.config[key])
        (config as Record<string, unknown>)[key] = defaultIPv6;
  return config;
}
