// Binds proxy ports: the port planned for a cold start, else the one a previous process used while it
// is free (its rules stay valid), else one from the allocator; a port someone else holds (EADDRINUSE)
// is skipped and another tried. The caller keeps the listener and gives its port back with release().
import { ProxyError } from '../lib/errors.ts';
import type { Logger } from '../lib/log.ts';
import type { OriginalDestination } from '../relay/original-destination.ts';
import type { ServicePortContext } from '../relay/service-context.ts';
import { type ServicePortKey, servicePortKey } from '../state/service-port.ts';
import type { PortAllocator } from './port-allocator.ts';
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
};

export type BoundPort = { listener: ServicePortListener; port: number };

export class PortBinder {
  readonly #allocator: PortAllocator;
  readonly #listeners: ListenerFactory;
  readonly #preferredPorts: ReadonlyMap<string, number>;
  readonly #log: Logger;
  readonly #host: () => string;
  readonly #bindAttempts: number;
  readonly #isFailing: (key: ServicePortKey) => boolean;

  constructor(deps: PortBinderDeps) {
    this.#allocator = deps.allocator;
    this.#listeners = deps.listeners;
    this.#preferredPorts = deps.preferredPorts;
    this.#log = deps.log;
    this.#host = deps.host;
    this.#bindAttempts = deps.bindAttempts ?? 16;
    this.#isFailing = deps.isFailing ?? (() => false);
  }

  /**
   * Allocates the proxy port a new listener will most likely get: its preferred port while free, else
   * the allocator's next. Undefined when the kernel chooses ports or the range is exhausted.
   */
  plan(preferredKey: string): number | undefined {
    if (this.#allocator.isKernelChosen) return undefined;
    const preferred = this.#preferredPorts.get(preferredKey);
    if (preferred !== undefined && this.#allocator.allocate(preferred)) return preferred;
    try {
      return this.#allocator.allocateNext(new Set());
    } catch {
      return undefined;
    }
  }

  /** Gives a port from plan() or listen() back to the allocator (kernel-chosen ones are ignored). */
  release(port: number): void {
    this.#allocator.release(port);
  }

  /**
   * A listener for `context` bound on `planned` (already allocated) when given, else on the preferred
   * port of `preferredKey`, else on one from the allocator. Throws KUP_ERR_LISTEN (or the allocator's
   * KUP_ERR_PORT_RANGE_EXHAUSTED) with every port it tried given back. `destination`: which portal's
   * traffic the rules send it (the listener factory's).
   */
  async listen(
    context: ServicePortContext,
    preferredKey: string,
    planned?: number,
    destination?: OriginalDestination,
  ): Promise<BoundPort> {
    const attempts = this.#allocator.isKernelChosen ? 1 : this.#bindAttempts;
    const busy = new Set<number>();
    let lastError: unknown;
    const preferred = planned ?? this.#preferredPorts.get(preferredKey);
    if (
      preferred !== undefined &&
      (planned !== undefined || this.#allocator.isKernelChosen || this.#allocator.allocate(preferred))
    ) {
      try {
        const listener = await this.#bind(context, preferred, destination);
        return { listener, port: listener.port };
      } catch (err) {
        busy.add(preferred);
        lastError = err;
      }
    }
    for (let i = 0; i < attempts; i++) {
      let port: number;
      try {
        port = this.#allocator.allocateNext(busy);
      } catch (err) {
        if (busy.size === 0) throw err;
        break; // every free port of the range is held by someone else
      }
      try {
        const listener = await this.#bind(context, port, destination);
        return { listener, port: listener.port };
      } catch (err) {
        lastError = err;
        const code = (err as NodeJS.ErrnoException).code;
        if (code !== 'EADDRINUSE' || port === 0) break;
        busy.add(port);
        // Once per failure, not on every retry: the failure itself is logged once by the proxier.
        if (!this.#isFailing(servicePortKey(context.name, context.protocol)))
          this.#log.warn(
            { service: preferredKey, port },
            'Proxy port in use by another process, trying another',
          );
      }
    }
    const held = busy.size > 0 ? ` (ports held by other processes: ${[...busy].join(', ')})` : '';
    throw new ProxyError(
      'KUP_ERR_LISTEN',
      `cannot listen for ${preferredKey}: ${(lastError as Error).message}${held}`,
      { cause: lastError },
    );
  }

  /** A new listener bound on `port`; on failure the port goes back to the allocator and the error is thrown. */
  async #bind(
    context: ServicePortContext,
    port: number,
    destination: OriginalDestination | undefined,
  ): Promise<ServicePortListener> {
    const host = this.#host();
    const listener = this.#listeners(context, host, false, destination);
    try {
      await listener.listen(host, port);
      return listener;
    } catch (err) {
      this.#allocator.release(port);
      listener.destroy();
      throw err;
    }
  }
}
