// Which service ports list which endpoints, by endpoint key and by port: so that a change to what
// answers as us (loop-guard.ts) filters again only the service ports that list an endpoint it touches,
// not every one. Pure bookkeeping: no I/O.
import type { Endpoint, EndpointKey } from '../state/endpoint.ts';

/** One subject, or several (most endpoints are listed by one service port: no set for them). */
type Listed<S> = S | Set<S>;

export class EndpointIndex<S> {
  readonly #byKey = new Map<EndpointKey, Listed<S>>();
  readonly #byPort = new Map<number, Listed<S>>();

  /** `subject` now lists `after` instead of `before` (undefined: nothing). The same array is no change. */
  replace(subject: S, before: readonly Endpoint[] | undefined, after: readonly Endpoint[] | undefined): void {
    if (before === after) return;
    // All of before out, all of after in: an endpoint in both is taken out and put back.
    for (const e of before ?? []) {
      remove(this.#byKey, e.key, subject);
      remove(this.#byPort, e.port, subject);
    }
    for (const e of after ?? []) {
      add(this.#byKey, e.key, subject);
      add(this.#byPort, e.port, subject);
    }
  }

  /** Adds to `out` the subjects that list endpoint `key`. */
  withKey(key: EndpointKey, out: Set<S>): void {
    addTo(out, this.#byKey.get(key));
  }

  /** Adds to `out` the subjects that list an endpoint on `port` (any address). */
  withPort(port: number, out: Set<S>): void {
    addTo(out, this.#byPort.get(port));
  }
}

function add<K, S>(map: Map<K, Listed<S>>, key: K, subject: S): void {
  const listed = map.get(key);
  if (listed === undefined) map.set(key, subject);
  else if (listed instanceof Set) listed.add(subject);
  else if (listed !== subject) map.set(key, new Set([listed, subject]));
}

function remove<K, S>(map: Map<K, Listed<S>>, key: K, subject: S): void {
  const listed = map.get(key);
  if (listed === subject) map.delete(key);
  else if (listed instanceof Set && listed.delete(subject) && listed.size === 1)
    map.set(key, listed.values().next().value as S);
}

function addTo<S>(out: Set<S>, listed: Listed<S> | undefined): void {
  if (listed === undefined) return;
  if (listed instanceof Set) for (const s of listed) out.add(s);
  else out.add(listed);
}
