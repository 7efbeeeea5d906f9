// NodePorts held with listeners of our own (iptables mode), so that no other process can take a port
// our rules hijack; they serve the service port's external context. A NodePort held elsewhere is
// reported (KUP_ERR_PORT_CONFLICT) and its rules are left out until it can be held.
import { ProxyError } from '../lib/errors.ts';
import type { Logger } from '../lib/log.ts';
import type { ServicePortContext } from '../relay/service-context.ts';
import type { ServicePort, ServicePortKey } from '../state/service-port.ts';
import { isDualStack, primaryFamily } from './family-balancers.ts';
import type { ListenerFactory, ServicePortListener } from './service-port-listener.ts';

/**
 * Where a service port's NodePort is held: `hosts`, except that a single-stack service port is not
 * held on the other family (a wildcard `::` listener would answer an IPv4-only service over IPv6).
 */
export function nodePortHostsFor(sp: ServicePort, hosts: readonly string[]): string[] {
  if (isDualStack(sp)) return [...hosts];
  const v6 = primaryFamily(sp) === 'IPv6';
  const out: string[] = [];
  for (const host of hosts) {
    if (host === '::' && !v6) out.push('0.0.0.0');
    else if (host === '::' || host.includes(':') === v6) out.push(host);
  }
  return out;
}

/** A NodePort held; `hosts` = the addresses held, space-separated (when they change, it is claimed again). */
type Claim = { port: number; hosts: string; listeners: ServicePortListener[] };

export type NodePortClaimsDeps = { listeners: ListenerFactory; log: Logger };

export class NodePortClaims {
  readonly #listeners: ListenerFactory;
  readonly #log: Logger;
  readonly #claims = new Map<ServicePortKey, Claim>();
  /** Why a NodePort could not be held, by service port; cleared by release(). */
  readonly #errors = new Map<ServicePortKey, ProxyError>();
  #closed = false;

  constructor(deps: NodePortClaimsDeps) {
    this.#listeners = deps.listeners;
    this.#log = deps.log;
  }

  /** The NodePort held for `key`; undefined when none is. */
  heldPort(key: ServicePortKey): number | undefined {
    return this.#claims.get(key)?.port;
  }

  /** The service ports whose NodePort could not be held (a copy: ensure() changes it). */
  failedKeys(): ServicePortKey[] {
    return [...this.#errors.keys()];
  }

  /** Why the NodePort of `key` could not be held; undefined when it is held or was not tried. */
  error(key: ServicePortKey): ProxyError | undefined {
    return this.#errors.get(key);
  }

  /**
   * Holds `sp`'s NodePort on `hosts`, served by `context`, unless it is already held there (held on
   * other addresses, it is claimed again). True when what is held changed.
   */
  async ensure(sp: ServicePort, context: ServicePortContext, hosts: readonly string[]): Promise<boolean> {
    const before = this.#claims.get(sp.key);
    // The node's addresses changed: hold the NodePort where the rules now match.
    if (before !== undefined && before.hosts !== hosts.join(' ')) await this.release(sp.key);
    if (!this.#claims.has(sp.key)) await this.#claim(sp, context, hosts);
    return this.#claims.get(sp.key) !== before;
  }

  async #claim(sp: ServicePort, context: ServicePortContext, hosts: readonly string[]): Promise<void> {
    const port = sp.nodePort;
    const listeners: ServicePortListener[] = [];
    // An IPv6-only service port held on `::` must not answer IPv4 (no IPv4 rule, no IPv4 endpoint).
    const v6Only = !isDualStack(sp) && primaryFamily(sp) === 'IPv6';
    try {
      for (const host of hosts) {
        const ipv6Only = v6Only && host === '::';
        const listener = this.#listeners(context, host, ipv6Only);
        listeners.push(listener);
        await listener.listen(host, port, ipv6Only);
      }
      if (this.#closed) {
        // Closed while these were binding: nothing is left to serve them.
        for (const l of listeners) l.destroy();
        return;
      }
      this.#claims.set(sp.key, { port, hosts: hosts.join(' '), listeners });
      if (this.#errors.delete(sp.key))
        this.#log.info({ service: sp.key, nodePort: port }, 'NodePort claimed');
    } catch (err) {
      // Held on some addresses only is not held: rules for the others would hijack someone's traffic.
      for (const l of listeners) l.destroy();
      const error = new ProxyError(
        'KUP_ERR_PORT_CONFLICT',
        `NodePort ${port}/${sp.protocol} of ${sp.name} is held by another process: ${(err as Error).message}`,
        { cause: err },
      );
      if (this.#errors.get(sp.key)?.message !== error.message) {
        this.#log.error({ service: sp.key, nodePort: port, err: error }, 'Port conflict detected');
      }
      this.#errors.set(sp.key, error);
    }
  }

  /** Lets go of `key`'s NodePort (and forgets why it could not be held). */
  async release(key: ServicePortKey): Promise<void> {
    const claim = this.#claims.get(key);
    this.#claims.delete(key);
    this.#errors.delete(key);
    if (claim !== undefined) await Promise.all(claim.listeners.map((l) => l.close()));
  }

  /** The external context's endpoints changed: the claim's UDP sessions follow it. */
  endpointsChanged(key: ServicePortKey): void {
    for (const l of this.#claims.get(key)?.listeners ?? []) l.endpointsChanged();
  }

  /** Stops accepting on every NodePort held; their connections may finish (see destroy()). */
  async close(): Promise<void> {
    this.#closed = true;
    await Promise.all([...this.#claims.values()].flatMap((c) => c.listeners.map((l) => l.close())));
  }

  /** Resolves once the NodePorts held have no connection left. */
  async drained(): Promise<void> {
    await Promise.all([...this.#claims.values()].flatMap((c) => c.listeners.map((l) => l.drained())));
  }

  /** Stops accepting and tears down every connection on the NodePorts held, now. */
  destroy(): void {
    this.#closed = true;
    for (const claim of this.#claims.values()) for (const l of claim.listeners) l.destroy();
    this.#claims.clear();
    this.#errors.clear();
  }
}
