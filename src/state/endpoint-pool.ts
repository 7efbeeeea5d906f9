// EndpointPool: one Endpoint object, with its key and IP strings, for an endpoint that several slices
// carry alike (a pod behind many Services), counted by the lists that hold it. Pure bookkeeping: no I/O.
import { sameEndpoint } from './categorize-endpoints.ts';
import type { Endpoint, EndpointKey } from './endpoint.ts';

type Pooled = { readonly endpoint: Endpoint; holders: number };

export class EndpointPool {
  // One endpoint per key: a second one with other conditions or hints stays its own (rare: one pod's
  // conditions are the same in every slice that lists it).
  readonly #byKey = new Map<EndpointKey, Pooled>();

  /**
   * The pooled endpoint equal to `ep`, held once more; else `ep` itself, pooled when its key is not.
   * Every endpoint acquired is released once, when the list that holds it is dropped.
   */
  acquire(ep: Endpoint): Endpoint {
    const pooled = this.#byKey.get(ep.key);
    if (pooled === undefined) {
      this.#byKey.set(ep.key, { endpoint: ep, holders: 1 });
      return ep;
    }
    if (!sameEndpoint(pooled.endpoint, ep)) return ep;
    pooled.holders++;
    return pooled.endpoint;
  }

  /** One holder of `ep` fewer; the pool lets go of it with the last (an endpoint it did not pool: nothing). */
  release(ep: Endpoint): void {
    const pooled = this.#byKey.get(ep.key);
    if (pooled?.endpoint !== ep) return;
    if (--pooled.holders === 0) this.#byKey.delete(ep.key);
  }

  /** Endpoints pooled (distinct keys held). */
  get size(): number {
    return this.#byKey.size;
  }
}
