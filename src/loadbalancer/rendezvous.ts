// Rendezvous (highest random weight) hashing of a client IP over endpoints: every process that holds the
// same endpoints picks the same one for the same client, with no state shared between them. That is how
// ClientIP session affinity holds across the worker processes of one proxy (--workers): when an endpoint
// leaves, only its clients move; when one joins, only the clients it now wins. Pure.
import type { Endpoint } from '../state/endpoint.ts';

/** FNV-1a, 32 bits. */
export function fnv1a(text: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

/** murmur3's finaliser: every input bit moves every output bit. */
function mix(h0: number): number {
  let h = h0;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/**
 * The endpoint of `endpoints` with the highest weight for `clientIP` (ties to the lower key), skipping
 * those `skip` says; undefined when none is left.
 */
export function rendezvousPick(
  clientIP: string,
  endpoints: readonly Endpoint[],
  skip?: (endpoint: Endpoint) => boolean,
): Endpoint | undefined {
  const client = fnv1a(clientIP);
  let best: Endpoint | undefined;
  let bestWeight = -1;
  for (const e of endpoints) {
    if (skip?.(e) === true) continue;
    const weight = mix(client ^ Math.imul(fnv1a(e.key), 0x9e3779b1));
    if (weight > bestWeight || (weight === bestWeight && best !== undefined && e.key < best.key)) {
      best = e;
      bestWeight = weight;
    }
  }
  return best;
}
