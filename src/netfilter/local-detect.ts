// How rules tell traffic from this node's pods apart (kube-proxy's pkg/proxy/util/localdetector.go and
// getLocalDetectors in cmd/kube-proxy/app/server_linux.go), per family, as iptables-restore argument
// fragments. Pure: no I/O; the Node's podCIDRs come in as an argument.
import { SocketAddress } from 'node:net';
import type { Config, DetectLocalMode } from '../config/config.ts';
import { isValidCIDR } from '../source/validate.ts';
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

/** A valid CIDR with its host bits cleared and the address in canonical form (Go's IPNet.String()). */
export function maskCIDR(cidr: string): string {
  const [ip = '', prefixText = ''] = cidr.split('/');
  const prefix = Number(prefixText);
  if (!ip.includes(':')) {
    const value = ip.split('.').reduce((acc, octet) => acc * 256 + Number(octet), 0);
    const size = 2 ** (32 - prefix);
    const network = Math.floor(value / size) * size;
    const octets = [24, 16, 8, 0].map((shift) => Math.floor(network / 2 ** shift) % 256);
    return `${octets.join('.')}/${prefix}`;
  }
  let value = 0n;
  for (const word of ipv6Words(ip)) value = (value << 16n) | BigInt(word);
  const hostBits = BigInt(128 - prefix);
  value = (value >> hostBits) << hostBits;
  const words: string[] = [];
  for (let i = 7; i >= 0; i--) words.push(((value >> BigInt(i * 16)) & 0xffffn).toString(16));
  return `${new SocketAddress({ address: words.join(':'), family: 'ipv6' }).address}/${prefix}`;
}

/** The eight 16-bit words of a valid IPv6 address (with `::` and a trailing dotted IPv4 part). */
function ipv6Words(ip: string): number[] {
  let text = ip;
  const dotted = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(text);
  if (dotted) {
    const [a, b, c, d] = dotted.slice(1).map(Number) as [number, number, number, number];
    text = `${text.slice(0, dotted.index)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const [head = '', tail] = text.split('::');
  const parse = (part: string) => (part === '' ? [] : part.split(':').map((w) => Number.parseInt(w, 16)));
  const left = parse(head);
  const right = tail === undefined ? [] : parse(tail);
  return [...left, ...new Array<number>(8 - left.length - right.length).fill(0), ...right];
}
