// The proxier's PortalProgrammer for iptables: syncs the rules (Netfilter), then deletes the UDP
// conntrack entries the change left stale (conntrack-cleanup.ts), and reads back the proxy ports a
// previous process left in the rules so a restart can reuse them (traffic returns as soon as the new
// listeners are up).
import type { Logger } from '../lib/log.ts';
import type { PortalProgrammer, PortalSpec, PortalSyncOptions } from '../proxier/portal-programmer.ts';
import type { IPFamily, ServicePortKey } from '../state/service-port.ts';
import { KUBE_NODEPORT_CONTAINER, KUBE_PORTALS_CONTAINER } from './chains.ts';
import { type ConntrackDeletion, conntrackDeletions } from './conntrack-cleanup.ts';
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

/** conntrack processes run side by side after a sync (each is a process start, ~5 ms). */
const CONNTRACK_CONCURRENCY = 8;

export class IptablesPortals implements PortalProgrammer {
  readonly #deps: IptablesPortalsDeps;
  /** The portals last programmed for each UDP service port: what its conntrack entries were made by. */
  readonly #programmedUDP = new Map<ServicePortKey, PortalSpec>();

  constructor(deps: IptablesPortalsDeps) {
    this.#deps = deps;
  }

  /** A UDP service port missing from `portals` is a removed one. */
  async sync(portals: readonly PortalSpec[], options: PortalSyncOptions & { full: boolean }): Promise<void> {
    await this.#program(
      (local) => this.#deps.netfilter.sync(portals, { full: options.full, localAddresses: local }),
      () => {
        const next = new Map<ServicePortKey, PortalSpec>();
        for (const p of portals) if (p.servicePort.protocol === 'UDP') next.set(p.servicePort.key, p);
        const changed = new Map<ServicePortKey, PortalSpec | undefined>(next);
        for (const key of this.#programmedUDP.keys()) if (!next.has(key)) changed.set(key, undefined);
        return changed;
      },
      options.initial,
    );
  }

  /** A UDP service port changed to undefined is a removed one. */
  async update(
    changed: ReadonlyMap<ServicePortKey, PortalSpec | undefined>,
    all: () => readonly PortalSpec[],
    options: PortalSyncOptions,
  ): Promise<void> {
    await this.#program(
      (local) => this.#deps.netfilter.update(changed, all, { localAddresses: local }),
      () => changed,
      options.initial,
    );
  }

  /**
   * Applies the rules, then deletes the conntrack entries they left stale. Only after a restore that
   * succeeded (the old rules still serve otherwise, and so do their entries), and only after it, so no
   * new flow is created with the old NAT. Best effort, as kube-proxy: a failure is logged.
   */
  async #program(
    apply: (localAddresses: string[]) => Promise<void>,
    changedUDP: () => ReadonlyMap<ServicePortKey, PortalSpec | undefined>,
    initial: boolean,
  ): Promise<void> {
    try {
      await apply(localAddresses(this.#deps.hostInfo()));
    } catch (err) {
      this.#deps.onRestoreFailure?.();
      throw err;
    }
    const deletions: { key: ServicePortKey; deletion: ConntrackDeletion }[] = [];
    for (const [key, next] of changedUDP()) {
      const previous = this.#programmedUDP.get(key);
      if (next === undefined || next.servicePort.protocol !== 'UDP') this.#programmedUDP.delete(key);
      else this.#programmedUDP.set(key, next);
      // In the proxier's first sync, what made the entries in place is unknown (usually a previous
      // process's rules, whose proxy ports the new listeners reuse): deleting them all would cost a
      // conntrack run per UDP destination at every start (hundreds at 10,000 services).
      if (initial || (previous === undefined && next?.servicePort.protocol !== 'UDP')) continue;
      for (const family of this.#deps.families)
        for (const deletion of conntrackDeletions(previous, next, family)) deletions.push({ key, deletion });
    }
    if (deletions.length > 0) await this.#deleteConntrack(deletions);
  }

  async #deleteConntrack(deletions: readonly { key: ServicePortKey; deletion: ConntrackDeletion }[]) {
    const { iptables, log } = this.#deps;
    let next = 0;
    let failed = 0;
    let first: { key: ServicePortKey; deletion: ConntrackDeletion; err: unknown } | undefined;
    const worker = async () => {
      while (next < deletions.length) {
        const { key, deletion } = deletions[next++]!;
        try {
          await iptables.flushConntrackUDP(deletion);
        } catch (err) {
          failed++;
          first ??= { key, deletion, err };
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(CONNTRACK_CONCURRENCY, deletions.length) }, worker));
    // One line per sync, not per deletion: without conntrack installed every one of them fails.
    if (first !== undefined)
      log.warn(
        {
          service: first.key,
          ip: first.deletion.origDst,
          port: first.deletion.origDstPort,
          failed,
          of: deletions.length,
          err: first.err,
        },
        'Failed to delete UDP conntrack entries',
      );
  }

  /**
   * Proxy ports found in the rules a previous process left, read from the container-side NAT rules'
   * comments and REDIRECT/DNAT targets: `ns/name:port/PROTO` → the port serving the cluster-wide list
   * (comment `ns/name:port`), `ns/name:port/PROTO/local` → the second listener serving the node-local
   * list (comment `ns/name:port/local`), `ns/name:port/PROTO/to/<via>[/local]` → the listeners of one
   * external destination (PROXY protocol). NodePort rules count too: under externalTrafficPolicy Local
   * they may be the only ones naming the local listener.
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
      // before the shards wrote them), and the NodePort ones.
      const rules = [...parseSave(text).rules]
        .filter(([chain]) => chain.startsWith(KUBE_PORTALS_CONTAINER) || chain === KUBE_NODEPORT_CONTAINER)
        .flatMap(([, list]) => list);
      for (const args of rules) {
        const comment = argValue(args, '--comment');
        const proto = argValue(args, '-p');
        const target =
          argValue(args, '--to-ports') ?? argValue(args, '--to-destination')?.replace(/^.*:/, '');
        const port = Number(target);
        if (comment === undefined || proto === undefined || !Number.isInteger(port) || port <= 0) continue;
        // A service port name holds no `/` after its namespace's: what follows a second one is the
        // listener's suffix (`/local`, `/to/<via>[/local]`: rules.ts targetSuffix).
        const end = comment.indexOf('/', comment.indexOf('/') + 1);
        const name = end < 0 ? comment : comment.slice(0, end);
        const suffix = end < 0 ? '' : comment.slice(end);
        out.set(`${name}/${proto.toUpperCase()}${suffix}`, port);
      }
    }
    return out;
  }
}

function argValue(args: readonly string[], flag: string): string | undefined {
  const i = args.indexOf(flag);
  return i >= 0 ? args[i + 1] : undefined;
}
