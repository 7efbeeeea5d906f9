// The proxier's PortalProgrammer for iptables: syncs the rules (Netfilter), then flushes the UDP
// conntrack entries of removed UDP service ports, and reads back the proxy ports a previous process
// left in the rules so a restart can reuse them (traffic returns as soon as the new listeners are up).
import type { Logger } from '../log.ts';
import type { PortalProgrammer, PortalSpec } from '../proxier/proxier.ts';
import type { IPFamily, ServicePort, ServicePortKey } from '../state/service-port.ts';
import { KUBE_PORTALS_CONTAINER } from './chains.ts';
import type { Iptables } from './iptables.ts';
import { parseSave } from './iptables.ts';
import type { Netfilter } from './netfilter.ts';
import type { HostInfo } from './node-ip.ts';
import { localAddresses } from './node-ip.ts';

export type IptablesPortalsDeps = {
  netfilter: Netfilter;
  iptables: Iptables;
  families: readonly IPFamily[];
  log: Logger;
  hostInfo: () => HostInfo;
  /** Called when a restore failed (metrics). */
  onRestoreFailure?: () => void;
};

export class IptablesPortals implements PortalProgrammer {
  readonly #deps: IptablesPortalsDeps;

  constructor(deps: IptablesPortalsDeps) {
    this.#deps = deps;
  }

  async sync(
    portals: readonly PortalSpec[],
    options: { full: boolean; removedUDP: readonly ServicePort[] },
  ): Promise<void> {
    await this.#program(
      (local) => this.#deps.netfilter.sync(portals, { full: options.full, localAddresses: local }),
      options.removedUDP,
    );
  }

  async update(
    changed: ReadonlyMap<ServicePortKey, PortalSpec | undefined>,
    all: () => readonly PortalSpec[],
    options: { removedUDP: readonly ServicePort[] },
  ): Promise<void> {
    await this.#program(
      (local) => this.#deps.netfilter.update(changed, all, { localAddresses: local }),
      options.removedUDP,
    );
  }

  async #program(
    apply: (localAddresses: string[]) => Promise<void>,
    removedUDP: readonly ServicePort[],
  ): Promise<void> {
    const { iptables, log } = this.#deps;
    try {
      await apply(localAddresses(this.#deps.hostInfo()));
    } catch (err) {
      this.#deps.onRestoreFailure?.();
      throw err;
    }
    // After the rules changed, so no new flow is created with the old NAT.
    for (const sp of removedUDP) {
      for (const ip of sp.clusterIPs) {
        try {
          await iptables.flushConntrackUDP(ip);
        } catch (err) {
          log.warn({ service: sp.key, ip, err }, 'Failed to delete UDP conntrack entries');
        }
      }
    }
  }

  /**
   * Proxy ports found in the rules a previous process left (`ns/name:port/PROTO` → port), read from the
   * container-side portal rules' comments and REDIRECT/DNAT targets.
   */
  async previousProxyPorts(): Promise<Map<string, number>> {
    const out = new Map<string, number>();
    for (const family of this.#deps.families) {
      let text: string;
      try {
        text = await this.#deps.iptables.save(family, 'nat');
      } catch {
        continue;
      }
      // The container-side rules: in the shard chains (and in the portal chain itself, as versions
      // before the shards wrote them).
      const rules = [...parseSave(text).rules]
        .filter(([chain]) => chain.startsWith(KUBE_PORTALS_CONTAINER))
        .flatMap(([, list]) => list);
      for (const args of rules) {
        const comment = argValue(args, '--comment');
        const proto = argValue(args, '-p');
        const target =
          argValue(args, '--to-ports') ?? argValue(args, '--to-destination')?.replace(/^.*:/, '');
        const port = Number(target);
        if (comment === undefined || proto === undefined || !Number.isInteger(port) || port <= 0) continue;
        out.set(`${comment}/${proto.toUpperCase()}`, port);
      }
    }
    return out;
  }
}

function argValue(args: readonly string[], flag: string): string | undefined {
  const i = args.indexOf(flag);
  return i >= 0 ? args[i + 1] : undefined;
}
