// How rules tell traffic from this node's pods apart (kube-proxy's pkg/proxy/util/localdetector.go and
// getLocalDetectors in cmd/kube-proxy/app/server_linux.go), per family, as iptables-restore argument
// fragments. Pure: no I/O; the Node's podCIDRs come in as an argument.
import type { Config, DetectLocalMode } from '../config/config.ts';
import { isValidCIDR, maskCIDR } from '../lib/ip.ts';
import type { IPFamily } from '../state/service-port.ts';

/** How rules tell traffic from this node's pods apart (kube-proxy's LocalTrafficDetector), per family. */
export type LocalTrafficDetector = {
  /** Matches traffic from a local pod, e.g. `-s 10.244.0.0/16` or `-i cbr0`. */
  readonly ifLocal: string;
  /** Matches traffic not from a local pod, e.g. `! -s 10.244.0.0/16` or `! -i cbr0`. */
  readonly ifNotLocal: string;
};

/** What localTrafficDetector needs: the config's settings and, for NodeCIDR, the Node's spec.podCIDRs. */
export type LocalDetectOptions = {
  readonly mode: DetectLocalMode;
  readonly clusterCIDRs: readonly string[];
  readonly nodePodCIDRs: readonly string[];
  readonly bridgeInterface: string;
  readonly interfaceNamePrefix: string;
};

/** The options for localTrafficDetector from the Config and the Node's spec.podCIDRs ([] when none). */
export function localDetectOptions(config: Config, nodePodCIDRs: readonly string[]): LocalDetectOptions {
  return {
    mode: config.detectLocalMode,
    clusterCIDRs: config.clusterCIDRs,
    nodePodCIDRs,
    bridgeInterface: config.podBridgeInterface,
    interfaceNamePrefix: config.podInterfaceNamePrefix,
  };
}

/**
 * The detector of `family`, or undefined when the mode has nothing for it (kube-proxy's no-op detector,
 * `IsImplemented() == false`): ClusterCIDR or NodeCIDR without a CIDR of that family, or an empty
 * interface name. CIDR modes use the first CIDR of the family, masked (`10.244.1.0/16` → `10.244.0.0/16`).
 */
export function localTrafficDetector(
  options: LocalDetectOptions,
  family: IPFamily,
): LocalTrafficDetector | undefined {
  switch (options.mode) {
    case 'ClusterCIDR':
      return byCIDR(options.clusterCIDRs, family);
    case 'NodeCIDR':
      return byCIDR(options.nodePodCIDRs, family);
    case 'BridgeInterface':
      return byInterface(options.bridgeInterface);
    case 'InterfaceNamePrefix':
      return options.interfaceNamePrefix === '' ? undefined : byInterface(`${options.interfaceNamePrefix}+`);
  }
}

function byCIDR(cidrs: readonly string[], family: IPFamily): LocalTrafficDetector | undefined {
  // As kube-proxy's MapCIDRsByIPFamily: unparsable entries are skipped, the first of the family wins.
  const cidr = cidrs
    .map((c) => c.trim())
    .find((c) => isValidCIDR(c) && c.includes(':') === (family === 'IPv6'));
  if (cidr === undefined) return undefined;
  const network = maskCIDR(cidr);
  return { ifLocal: `-s ${network}`, ifNotLocal: `! -s ${network}` };
}

function byInterface(name: string): LocalTrafficDetector | undefined {
  if (name === '') return undefined;
  return { ifLocal: `-i ${name}`, ifNotLocal: `! -i ${name}` };
}
