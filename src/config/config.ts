// The proxy's effective configuration: the Config type (config-type.ts) and its defaults, read off the
// settings table. What the rest of the proxy imports from config/. Pure data.
import type { Config } from './config-type.ts';
import { SETTINGS } from './settings.ts';

export type { Config, DetectLocalMode, ProxyProtocolMode, TraceMode } from './config-type.ts';
export { DEFAULT_STATE_FILE, DETECT_LOCAL_MODES, NODE_PORT_ADDRESSES_PRIMARY } from './config-type.ts';

/** Every setting's default (kube-proxy's where it has one). */
export const DEFAULT_CONFIG: Config = Object.fromEntries(
  SETTINGS.flatMap((s) => (s.key === undefined ? [] : [[s.key, s.default]])),
) as Config;

/** klog verbosity → pino level. */
export function logLevel(verbosity: number): string {
  if (verbosity >= 4) return 'trace';
  if (verbosity >= 2) return 'debug';
  return 'info';
}
