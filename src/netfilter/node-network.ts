// What the rules know of this node: the families programmed, their node IPs (the bind IP, else the
// Node's InternalIP when the host has it, else the default-route guess), --nodeport-addresses resolved
// (`primary` = those IPs), and how traffic from this node's pods is told apart (--detect-local-mode).
// The Node's fields come in as plain values; a change is applied to the families in place.
import type { Config } from '../config/config.ts';
import type { IPFamily } from '../lib/ip.ts';
import type { Logger } from '../lib/log.ts';
import { type LocalTrafficDetector, localDetectOptions, localTrafficDetector } from './local-detect.ts';
import type { FamilyConfig } from './netfilter.ts';
import { chooseNodeIP, type HostInfo, resolveNodePortAddresses } from './node-ip.ts';

/** What the rules read of this Node: its InternalIP per family and its spec.podCIDRs. */
export type NodeAddresses = {
  readonly internalIPs: Readonly<Partial<Record<IPFamily, string>>>;
  readonly podCIDRs: readonly string[];
};

const NO_NODE: NodeAddresses = { internalIPs: {}, podCIDRs: [] };

export class NodeNetwork {
  readonly #config: Config;
  readonly #hostInfo: () => HostInfo;
  readonly #log: Logger;
  #node: NodeAddresses = NO_NODE;
  /** The families programmed, one entry each; Netfilter holds this array and reads its entries. */
  readonly families: FamilyConfig[];

  constructor(config: Config, hostInfo: () => HostInfo, log: Logger) {
    this.#config = config;
    this.#hostInfo = hostInfo;
    this.#log = log;
    this.families = this.#familyConfigs(true);
  }

  /**
   * This Node's addresses changed (or became known). Changed node IPs or nodePortAddresses replace the
   * entries of `families`; returns true when the rules must be rewritten (a full sync).
   */
  nodeChanged(node: NodeAddresses | undefined): boolean {
    const before = this.#node;
    this.#node = node ?? NO_NODE;
    let changed =
      this.#config.detectLocalMode === 'NodeCIDR' && before.podCIDRs.join() !== this.#node.podCIDRs.join();
    const ips = (n: NodeAddresses) => `${n.internalIPs.IPv4} ${n.internalIPs.IPv6}`;
    if (ips(before) === ips(this.#node)) return changed;
    const next = this.#familyConfigs(false);
    for (const [i, f] of this.families.entries()) {
      const n = next.find((x) => x.family === f.family);
      if (
        n === undefined ||
        (n.hostIP === f.hostIP && n.nodePortAddresses.join() === f.nodePortAddresses.join())
      )
        continue;
      this.#log.info(
        { family: f.family, nodeIP: n.hostIP, nodePortAddresses: n.nodePortAddresses },
        'Node IP changed',
      );
      this.families[i] = { ...f, hostIP: n.hostIP, nodePortAddresses: n.nodePortAddresses };
      changed = true;
    }
    return changed;
  }

  /**
   * The local traffic detector of `family` (--detect-local-mode), for the rules; undefined when the
   * mode has nothing for that family. NodeCIDR reads the Node's spec.podCIDRs as known now.
   */
  localDetectorFor(family: IPFamily): LocalTrafficDetector | undefined {
    return localTrafficDetector(localDetectOptions(this.#config, this.#node.podCIDRs), family);
  }

  /**
   * The families to program and their node IPs: the bind IP's family, or every family the host has.
   * `warnMissing`: say so for a family without a node IP (once, at start-up).
   */
  #familyConfigs(warnMissing: boolean): FamilyConfig[] {
    const config = this.#config;
    const info = this.#hostInfo();
    const all = config.bindAddress === '0.0.0.0' || config.bindAddress === '::';
    const families: IPFamily[] = all
      ? ['IPv4', 'IPv6']
      : [config.bindAddress.includes(':') ? 'IPv6' : 'IPv4'];
    const hostIPs: Partial<Record<IPFamily, string>> = {};
    for (const family of families) {
      if (!all) {
        hostIPs[family] = config.bindAddress;
        continue;
      }
      const { ip, ignoredNodeIP } = chooseNodeIP(info, family, this.#node.internalIPs[family]);
      if (ignoredNodeIP !== undefined)
        this.#log.warn(
          { family, nodeIP: ignoredNodeIP, hostIP: ip },
          "The Node's InternalIP is not on this host; not using it",
        );
      if (ip !== undefined) hostIPs[family] = ip;
    }
    const nodePortAddresses = resolveNodePortAddresses(config.nodePortAddresses, hostIPs);
    const out: FamilyConfig[] = [];
    for (const family of families) {
      const hostIP = hostIPs[family];
      if (hostIP === undefined) {
        if (warnMissing) this.#log.warn({ family }, 'No node IP of this family; its services get no rules');
        continue;
      }
      const bindAddress = all ? (family === 'IPv4' ? '0.0.0.0' : '::') : config.bindAddress;
      out.push({ family, bindAddress, hostIP, nodePortAddresses });
    }
    return out;
  }
}
