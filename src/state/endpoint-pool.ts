// EndpointPool: one Endpoint object, with its key and IP strings, for an endpoint that several slices
// carry alike (a pod behind many Services), counted by the lists that hold it. Pure bookkeeping: no I/O.
import { sameEndpoint } from './categorize-endpoints.ts';
import type { Endpoint, EndpointKey } from './endpoint.ts';

/** An endpoint two lists or more hold, and how many. */
class Shared {
  readonly endpoint: Endpoint;
  holders: number;

  constructor(endpoint: Endpoint, holders: number) {
    this.endpoint = endpoint;
    this.holders = holders;
  }
}

export class EndpointPool {
  // One endpoint per key: a second one with other conditions or hints stays its own (rare: one pod's
  // conditions are the same in every slice that lists it). One list's endpoint is kept as itself, not
  // with a count of one: most endpoints are one Service's (32 bytes an endpoint less).
  readonly #byKey = new Map<EndpointKey, Endpoint | Shared>();

  /**
   * The pooled endpoint equal to `ep`, held once more; else `ep` itself, pooled when its key is not.
   * Every endpoint acquired is released once, when the list that holds it is dropped.
   */
  acquire(ep: Endpoint): Endpoint {
    const pooled = this.#byKey.get(ep.key);
    if (pooled === undefined) {
      this.#byKey.set(ep.key, ep);
      return ep;
    }
    if (pooled instanceof Shared) {
      if (!sameEndpoint(pooled.endpoint, ep)) return ep;
      pooled.holders++;
      return pooled.endpoint;
    }
    if (!sameEndpoint(pooled, ep)) return ep;
    this.#byKey.set(ep.key, new Shared(pooled, 2));
    return pooled;
  }

  /** One holder of `ep` fewer; the pool lets go of it with the last (an endpoint it did not pool: nothing). */
  release(ep: Endpoint): void {
    const pooled = this.#byKey.get(ep.key);
    if (pooled === ep) this.#byKey.delete(ep.key);
    else if (pooled instanceof Shared && pooled.endpoint === ep && --pooled.holders === 1)
      this.#byKey.set(ep.key, ep);
  }

  /** Endpoints pooled (distinct keys held). */
  get size(): number {
    return this.#byKey.size;
  }
}
