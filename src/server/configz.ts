// /configz's body, as kube-proxy's configz handler shapes it: one object per component config, keyed by
// its group. Pure. Paths only (the kubeconfig's, the manifest's), never file contents.
import type { Config } from '../config/config.ts';
import { kubeProxyConfiguration } from '../config/file.ts';
import { SETTINGS } from '../config/settings.ts';

/** kube-proxy's configz name (its config API group). */
export const KUBE_PROXY_CONFIGZ = 'kubeproxy.config.k8s.io';
/** Our own settings, which a KubeProxyConfiguration has no field for. */
export const OWN_CONFIGZ = 'kube-userspace-proxy';

/**
 * `{"kubeproxy.config.k8s.io": KubeProxyConfiguration, "kube-userspace-proxy": {...}}`: the effective
 * KubeProxyConfiguration as --write-config-to writes it (v1alpha1 field names, durations as `30s`), then
 * our settings that have no field in it, as the Config has them (`tcpIdleTimeoutMs: 0`).
 */
export function configz(config: Config): Record<string, Record<string, unknown>> {
  const own: Record<string, unknown> = {};
  for (const s of SETTINGS) {
    if (s.file !== undefined || s.key === undefined) continue;
    const value = config[s.key];
    if (value !== undefined) own[s.key] = s.key === 'master' ? withoutUserinfo(String(value)) : value;
  }
  return { [KUBE_PROXY_CONFIGZ]: kubeProxyConfiguration(config), [OWN_CONFIGZ]: own };
}

/** A URL with any `user:password@` replaced: --master may carry credentials, /configz must not. */
function withoutUserinfo(url: string): string {
  return url.replace(/^([a-z][a-z0-9+.-]*:\/\/)?[^/?#]*@/i, '$1REDACTED@');
}
