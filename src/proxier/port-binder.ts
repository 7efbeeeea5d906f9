// Binds proxy ports: the port planned for a cold start, else the one a previous process used while it
// is free (its rules stay valid), else the allocator's first free one from the service port's hashed
// start; a port someone else holds (EADDRINUSE) is skipped and another tried. The caller keeps the
// listener and gives its port back with release().
import { ProxyError } from '../lib/errors.ts';
import type { Logger } from '../lib/log.ts';
import type { OriginalDestination } from '../relay/original-destination.ts';
import type { ServicePortContext } from '../relay/service-context.ts';
import { type ServicePortKey, servicePortKey } from '../state/service-port.ts';
import type { PortAllocator, PortSet } from './port-allocator.ts';
import type { ListenerFactory, ServicePortListener } from './service-port-listener.ts';

export type PortBinderDeps = {
  allocator: PortAllocator;
  listeners: ListenerFactory;
  /** Proxy ports to reuse when free (`ns/name:port/PROTO[/local]` → port). */
  preferredPorts: ReadonlyMap<string, number>;
  log: Logger;
  /** Where listeners bind, read at every bind (it may change before the first sync). */
  host: () => string;
  /** How many ports to try when a bind fails because someone else holds the port (default 16). */
  bindAttempts?: number;
  /** True for a service port whose failure is already reported: its retries do not warn again. */
  isFailing?: (key: ServicePortKey) => boolean;
  /**
   * A worker process (--workers): it binds exactly the port `preferredPorts` has for a key (the main
   * process's, shared with SO_REUSEPORT) and never another.
   */
  exact?: boolean;
};

export type BoundPort = { listener: ServicePortListener; port: number };

const NONE: ReadonlySet<number> = new Set();

export class PortBinder {
  readonly #allocator: PortAllocator;
  readonly #listeners: ListenerFactory;
  readonly #preferredPorts: ReadonlyMap<string, number>;
  readonly #log: Logger;
  readonly #host: () => string;
  readonly #bindAttempts: number;
  readonly #isFailing: (key: ServicePortKey) => boolean;
  readonly #exact: boolean;
  #owners = new Map<number, string>();
  #ownersOf = -1;

  constructor(deps: PortBinderDeps) {
    this.#allocator = deps.allocator;
    this.#listeners = deps.listeners;
    this.#preferredPorts = deps.preferredPorts;
    this.#log = deps.log;
    this.#host = deps.host;
    this.#bindAttempts = deps.bindAttempts ?? 16;
    this.#isFailing = deps.isFailing ?? (() => false);
    this.#exact = deps.exact === true;
  }

  /**
   * Allocates the proxy port a new listener will most likely get: its preferred port while free, else
   * the first free one from its hashed start. Undefined when the kernel chooses ports from a range it
   * does not know, or for a preferred port only listen() can try, or when the range is exhausted.
   */
  plan(preferredKey: string): number | undefined {
    if (this.#allocator.range.size === 0 || this.#exact) return undefined;
    const preferred = this.#preferredPorts.get(preferredKey);
    if (preferred !== undefined) {
      if (this.#allocator.allocate(preferred)) return preferred;
      if (this.#allocator.isKernelChosen) return undefined;
    }
    return this.#next(preferredKey, NONE);
  }

  /** Gives a port from plan() or listen() back to the allocator (kernel-chosen ones are ignored). */
  release(port: number): void {
    this.#allocator.release(port);
  }

  /**
   * A listener for `context` bound on `planned` (already allocated) when given, else on the preferred
   * port of `preferredKey`, else on the first free port from its hashed start, else (kernel-chosen
   * ports) on one the kernel chooses. Throws KUP_ERR_LISTEN (or the allocator's
   * KUP_ERR_PORT_RANGE_EXHAUSTED) with every port it tried given back. `destination`: which portal's
   * traffic the rules send it (the listener factory's).
   */
  async listen(
    context: ServicePortContext,
    preferredKey: string,
    planned?: number,
    destination?: OriginalDestination,
  ): Promise<BoundPort> {
    if (this.#exact) return this.#listenExact(context, preferredKey, destination);
    const kernelChosen = this.#allocator.isKernelChosen;
    const busy = new Set<number>();
    let lastError: unknown;
    // A planned port is allocated already. With kernel-chosen ports a preferred one the allocator cannot
    // mark (outside today's ephemeral range) is tried all the same, as the legacy proxier did.
    const preferred = planned ?? this.#preferredPorts.get(preferredKey);
    const owned = preferred !== undefined && (planned !== undefined || this.#allocator.allocate(preferred));
    if (preferred !== undefined && (owned || kernelChosen)) {
      try {
        const listener = await this.#bind(context, preferred, destination, owned);
        return { listener, port: listener.port };
      } catch (err) {
        busy.add(preferred);
        lastError = err;
      }
    }
    const attempts = this.#allocator.range.size === 0 ? 0 : this.#bindAttempts;
    for (let i = 0; i < attempts; i++) {
      const port = this.#next(preferredKey, busy);
      if (port === undefined) {
        if (busy.size === 0 && !kernelChosen) throw this.#allocator.exhausted();
        break; // every free port of the range is held by someone else
      }
      try {
        const listener = await this.#bind(context, port, destination, true);
        return { listener, port: listener.port };
      } catch (err) {
        lastError = err;
        if ((err as NodeJS.ErrnoException).code !== 'EADDRINUSE') break;
        busy.add(port);
        this.#portInUse(context, preferredKey, port);
      }
    }
    if (kernelChosen) {
      try {
        const listener = await this.#bind(context, 0, destination, false);
        // Marked (when in the range) so that no scan tries it while it is ours; release() frees it.
        this.#allocator.allocate(listener.port);
        return { listener, port: listener.port };
      } catch (err) {
        lastError = err;
      }
    }
    const held = busy.size > 0 ? ` (ports held by other processes: ${[...busy].join(', ')})` : '';
    throw new ProxyError(
      'KUP_ERR_LISTEN',
      `cannot listen for ${preferredKey}: ${(lastError as Error).message}${held}`,
      { cause: lastError },
    );
  }

  /** A worker's listener: on the main process's port for `key`, or KUP_ERR_LISTEN. */
  async #listenExact(
    context: ServicePortContext,
    key: string,
    destination: OriginalDestination | undefined,
  ): Promise<BoundPort> {
    const port = this.#preferredPorts.get(key);
    if (port === undefined)
      throw new ProxyError('KUP_ERR_LISTEN', `cannot listen for ${key}: the main process has no port for it`);
    try {
      const listener = await this.#bind(context, port, destination, false);
      return { listener, port: listener.port };
    } catch (err) {
      throw new ProxyError(
        'KUP_ERR_LISTEN',
        `cannot listen for ${key} on ${port}: ${(err as Error).message}`,
        {
          cause: err,
        },
      );
    }
  }

  /**
   * The allocator's next port for `key` past `busy`. Ports that other service ports' previous process
   * used are passed over while others are free, so the state file wins in whatever order service ports
   * start.
   */
  #next(key: string, busy: ReadonlySet<number>): number | undefined {
    const owners = this.#portOwners();
    const others: PortSet = { has: (port) => busy.has(port) || (owners.get(port) ?? key) !== key };
    return this.#allocator.next(key, others) ?? this.#allocator.next(key, busy);
  }

  /** Preferred port → its key; rebuilt when the map grows (it is filled once, before the first sync). */
  #portOwners(): ReadonlyMap<number, string> {
    if (this.#ownersOf !== this.#preferredPorts.size) {
      this.#owners = new Map();
      for (const [key, port] of this.#preferredPorts) this.#owners.set(port, key);
      this.#ownersOf = this.#preferredPorts.size;
    }
    return this.#owners;
  }

  /** Logs a port someone else holds, once per failure (the failure itself is logged by the proxier). */
  #portInUse(context: ServicePortContext, key: string, port: number): void {
    if (this.#isFailing(servicePortKey(context.name, context.protocol))) return;
    // Ephemeral ports are also the kernel's for outgoing connections: one in use there is no surprise.
    if (this.#allocator.isKernelChosen)
      this.#log.debug({ service: key, port }, 'Proxy port in use, trying another');
    else this.#log.warn({ service: key, port }, 'Proxy port in use by another process, trying another');
  }

  /**
   * A new listener bound on `port`; on failure the port goes back to the allocator when `owned` (this
   * binder allocated it) and the error is thrown.
   */
  async #bind(
    context: ServicePortContext,
    port: number,
    destination: OriginalDestination | undefined,
    owned: boolean,
  ): Promise<ServicePortListener> {
    const host = this.#host();
    const listener = this.#listeners(context, host, false, destination);
    try {
      await listener.listen(host, port);
      return listener;
    } catch (err) {
      if (owned) this.#allocator.release(port);
      listener.destroy();
      throw err;
    }
  }
}
