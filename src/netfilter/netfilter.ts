// What the proxier calls to make the portal rules match its service ports, per IP family: full
// restores when the state in the kernel is unknown, one-service deltas otherwise. Owns no sockets.
import { isProxyError } from '../lib/errors.ts';
import type { Logger } from '../lib/log.ts';
import type { PortalSpec } from '../proxier/portal-programmer.ts';
import type { IPFamily, ServicePortKey } from '../state/service-port.ts';
import type { ListenerPorts } from './chains.ts';
import type { Iptables } from './iptables.ts';
import {
  type LocalDetector,
  type RuleContext,
  renderDelta,
  renderRestoreInput,
  renderRestoreParts,
  restoreText,
  sameContext,
} from './rules.ts';

/** The fixed settings of one family the proxy serves. */
export type FamilyConfig = {
  readonly family: IPFamily;
  /** `0.0.0.0`/`::` or a specific IP of this family (see RuleContext). */
  readonly bindAddress: string;
  /** Node IP of this family for host-side DNAT; never loopback. */
  readonly hostIP: string;
  readonly nodePortAddresses: readonly string[];
  /** Tells this node's pods apart (--detect-local-mode); undefined: they cannot be (see RuleContext). */
  readonly localDetector?: LocalDetector | undefined;
  /** The proxy port range listeners get their ports from (see RuleContext). */
  readonly listenerPorts?: ListenerPorts | undefined;
};

export type NetfilterDeps = {
  readonly iptables: Iptables;
  readonly log: Logger;
  readonly families: readonly FamilyConfig[];
  /**
   * The detector of a family as known now, read at every sync (NodeCIDR learns the Node's podCIDRs
   * after start-up); when given it replaces FamilyConfig.localDetector. A change means a full restore.
   */
  readonly localDetector?: (family: IPFamily) => LocalDetector | undefined;
};

export type SyncOptions = {
  /** Render and restore everything (the proxier's periodic sync, start-up, after a failed sync). */
  readonly full: boolean;
  /** The node's current addresses (all families); NodePort rules use those inside nodePortAddresses. */
  readonly localAddresses?: readonly string[];
  /**
   * With a delta, also check that our jumps are in place (three `iptables -S`) and restore everything
   * when one is missing. Default false: each process start costs the proxy 5–10 ms of blocked event
   * loop at 10,000 services (fork copies its page tables), so jumps are checked by full syncs (start-up
   * and every --iptables-sync-period), as the legacy proxier re-ensured its rules once per period.
   */
  readonly checkJumps?: boolean;
};

/** What a family's chains hold. `portals` is this family's own map: update() changes it in place. */
type Applied = { readonly ctx: RuleContext; readonly portals: Map<ServicePortKey, PortalSpec> };

/**
 * Keeps our chains equal to the wanted portals. When a full render is used:
 * - the first sync of a family (start-up: replaces whatever a previous process left in our chains);
 * - `options.full` (the periodic sync: repairs rules and jumps someone else removed or added);
 * - after a failed restore (what the kernel holds is unknown), including at once when a delta fails;
 * - when the context changed (bind address, host IP, the node's NodePort addresses, the local detector);
 * - when `checkJumps` finds a jump or chain missing.
 * Otherwise only the rules of changed service ports are deleted and appended (a few lines, in the
 * small shard chains of their destinations). Measured at 10,000 service ports on nf_tables
 * (bench/iptables.bench.ts): a full restore ~0.85 s, a one-service delta ~20–40 ms.
 */
export class Netfilter {
  readonly #iptables: Iptables;
  readonly #log: Logger;
  readonly #families: readonly FamilyConfig[];
  readonly #localDetector: ((family: IPFamily) => LocalDetector | undefined) | undefined;
  /** Last successfully applied state per family; absent = unknown, the next sync is full. */
  readonly #applied = new Map<IPFamily, Applied>();
  #queue: Promise<unknown> = Promise.resolve();

  constructor(deps: NetfilterDeps) {
    this.#iptables = deps.iptables;
    this.#log = deps.log;
    this.#families = deps.families;
    this.#localDetector = deps.localDetector;
  }

  /** Applies the rules of `portals` for every family; rejects with the first family's error. */
  sync(portals: readonly PortalSpec[], options: SyncOptions): Promise<void> {
    return this.#serialize(async () => {
      const next = new Map<ServicePortKey, PortalSpec>();
      for (const p of portals) next.set(p.servicePort.key, p);
      await this.#eachFamily('Sync failed', (f) => this.#syncFamily(f, portals, next, options));
    });
  }

  /**
   * Applies the rules of the `changed` service ports only (undefined: it has no portal any more): a
   * delta against what each family holds, without looking at the other service ports. A family whose
   * state is unknown, whose context changed, or whose delta fails gets a full restore of `all()`.
   */
  update(
    changed: ReadonlyMap<ServicePortKey, PortalSpec | undefined>,
    all: () => readonly PortalSpec[],
    options: Omit<SyncOptions, 'full'> = {},
  ): Promise<void> {
    return this.#serialize(async () => {
      let everything: { portals: readonly PortalSpec[]; next: Map<ServicePortKey, PortalSpec> } | undefined;
      const full = (f: FamilyConfig) => {
        if (everything === undefined) {
          const portals = all();
          everything = { portals, next: new Map(portals.map((p) => [p.servicePort.key, p])) };
        }
        return this.#syncFamily(f, everything.portals, everything.next, { ...options, full: true });
      };
      const present = new Map<ServicePortKey, PortalSpec>();
      for (const [key, spec] of changed) if (spec !== undefined) present.set(key, spec);
      await this.#eachFamily('Sync failed', async (f) => {
        const ctx = this.#context(f, options);
        const last = this.#applied.get(f.family);
        if (last === undefined || !sameContext(last.ctx, ctx)) return full(f);
        const text = restoreText(renderDelta(last.portals, present, ctx, changed.keys()));
        if (text !== '') {
          try {
            await this.#iptables.restore(f.family, text);
          } catch (err) {
            if (!isProxyError(err, 'KUP_ERR_IPTABLES_RESTORE')) throw err;
            this.#log.warn({ family: f.family, err }, 'Delta restore failed, restoring all rules');
            return full(f);
          }
        }
        for (const [key, spec] of changed) {
          if (spec === undefined) last.portals.delete(key);
          else last.portals.set(key, spec);
        }
      });
    });
  }

  /** Removes every jump and chain we ever write, for every family. Safe to call twice. */
  cleanup(): Promise<void> {
    return this.#serialize(() =>
      this.#eachFamily('Cleanup failed', async (f) => {
        this.#applied.delete(f.family);
        await this.#iptables.cleanup(f.family);
      }),
    );
  }

  /** True when the next sync of `family` will be a full restore. */
  needsFullSync(family: IPFamily): boolean {
    return !this.#applied.has(family);
  }

  async #syncFamily(
    config: FamilyConfig,
    portals: readonly PortalSpec[],
    next: ReadonlyMap<ServicePortKey, PortalSpec>,
    options: SyncOptions,
  ): Promise<void> {
    const { family } = config;
    const ctx = this.#context(config, options);
    const last = this.#applied.get(family);
    if (!options.full && last !== undefined && sameContext(last.ctx, ctx)) {
      if (await this.#deltaApplied(family, last, next, ctx, options)) return;
    }
    this.#applied.delete(family);
    const missing = await this.#iptables.missingJumps(family);
    if (missing.length > 0 && last !== undefined)
      this.#log.warn({ family, jumps: missing.map((j) => `${j.from}->${j.to}`) }, 'Restoring missing jumps');
    if (last === undefined) {
      // What the kernel holds is unknown (start-up, or after a failure): the container-side chains go
      // first, so pods reach their Services without waiting for the host side and the NodePorts.
      for (const part of renderRestoreParts({ ...ctx, portals }, missing)) {
        const text = restoreText(part);
        if (text !== '') await this.#iptables.restore(family, text);
      }
    } else {
      await this.#iptables.restore(family, restoreText(renderRestoreInput({ ...ctx, portals }, missing)));
    }
    this.#applied.set(family, { ctx, portals: new Map(next) });
    this.#log.debug({ family, servicePorts: next.size, jumps: missing.length }, 'Restored all rules');
  }

  /** Tries a delta; false when the caller must fall back to a full restore. */
  async #deltaApplied(
    family: IPFamily,
    last: Applied,
    next: ReadonlyMap<ServicePortKey, PortalSpec>,
    ctx: RuleContext,
    options: SyncOptions,
  ): Promise<boolean> {
    const text = restoreText(renderDelta(last.portals, next, ctx));
    // The jump check runs beside the restore, not before it: the delta does not depend on the jumps,
    // and when one is missing the full restore that follows puts it back (and rewrites the delta's rules).
    const [missing, failure] = await Promise.all([
      options.checkJumps === true ? this.#iptables.missingJumps(family) : [],
      text === ''
        ? undefined
        : this.#iptables.restore(family, text).then(
            () => undefined,
            (err: unknown) => err,
          ),
    ]);
    if (failure !== undefined) {
      if (!isProxyError(failure, 'KUP_ERR_IPTABLES_RESTORE')) throw failure;
      // Usually a `-D` of a rule someone else removed: the kernel no longer holds what we think.
      this.#log.warn({ family, err: failure }, 'Delta restore failed, restoring all rules');
      return false;
    }
    if (missing.length > 0) return false;
    this.#applied.set(family, { ctx, portals: new Map(next) });
    return true;
  }

  #context(config: FamilyConfig, options: Omit<SyncOptions, 'full'>): RuleContext {
    const localDetector = this.#localDetector ? this.#localDetector(config.family) : config.localDetector;
    return { ...config, localAddresses: options.localAddresses ?? [], localDetector };
  }

  async #eachFamily(message: string, fn: (f: FamilyConfig) => Promise<void>): Promise<void> {
    let first: unknown;
    let failed = false;
    for (const f of this.#families) {
      try {
        await fn(f);
      } catch (err) {
        // The first error goes to the caller (who logs it); later families' errors are logged here.
        if (failed) this.#log.error({ family: f.family, err }, message);
        else [first, failed] = [err, true];
      }
    }
    if (failed) throw first;
  }

  #serialize<T>(fn: () => Promise<T>): Promise<T> {
    const result = this.#queue.then(fn, fn);
    this.#queue = result.catch(() => {});
    return result;
  }
}
