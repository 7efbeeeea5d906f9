// kube-proxy's flags and KubeProxyConfiguration fields that mean nothing for the userspace proxy: accepted
// so that kube-proxy's command lines and kubeadm's file work as they are, named once in a warning, ignored.

/** Flags accepted (hidden from --help's list, named in its epilogue) and ignored, with their yargs type. */
export const IGNORED_FLAGS: Readonly<Record<string, 'string' | 'boolean'>> = {
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

/**
 * v1alpha1 fields accepted and ignored, by path: `any` holds whatever it holds; a list is a struct with
 * exactly these fields (another one is an unknown field).
 */
export const IGNORED_FIELDS: Readonly<Record<string, 'any' | readonly string[]>> = {
  'clientConnection.acceptContentTypes': 'any',
  'conntrack.tcpBeLiberal': 'any',
  'conntrack.udpTimeout': 'any',
  'conntrack.udpStreamTimeout': 'any',
  featureGates: 'any',
  'iptables.masqueradeBit': 'any',
  'iptables.masqueradeAll': 'any',
  'iptables.localhostNodePorts': 'any',
  'iptables.snatNodeInternalIP': 'any',
  ipvs: [
    'syncPeriod',
    'minSyncPeriod',
    'scheduler',
    'excludeCIDRs',
    'strictARP',
    'tcpTimeout',
    'tcpFinTimeout',
    'udpTimeout',
  ],
  'logging.flushFrequency': 'any',
  'logging.vmodule': 'any',
  'logging.options': 'any',
  nftables: ['masqueradeBit', 'masqueradeAll', 'syncPeriod', 'minSyncPeriod'],
  // Removed from kube-proxy in 1.16; old files still carry it.
  resourceContainer: 'any',
  showHiddenMetricsForVersion: 'any',
  windowsRunAsService: 'any',
  winkernel: ['networkName', 'sourceVip', 'enableDSR', 'rootHnsEndpointName', 'forwardHealthCheckVip'],
};

/** True for the values a kubeadm-written file uses for "unset": not worth a warning when ignored. */
export function isUnset(v: unknown): boolean {
  if (v === null || v === undefined || v === false || v === 0 || v === '' || v === '0s' || v === '0')
    return true;
  if (Array.isArray(v)) return v.every(isUnset);
  if (typeof v === 'object') return Object.values(v).every(isUnset);
  return false;
}
