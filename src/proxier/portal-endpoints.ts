// What the rules need to know of a service port's endpoints: per family, whether any endpoint is
// usable and whether the cluster and local lists are empty. Pure: no I/O. Recomputed on every endpoint
// change; the rules change only when one of these flags flips (0 <-> N), not on every endpoint.

import type { Endpoint, ServicePortEndpoints } from '../state/endpoint.ts';
import type { IPFamily } from '../state/service-port.ts';
import type { PortalEndpoints, PortalSpec } from './portal-programmer.ts';

export type FamilyPortalEndpoints = PortalSpec['endpoints'];

/** Every combination of the three flags, by flagIndex: one shared object each. */
const FLAGS: readonly PortalEndpoints[] = Array.from({ length: 8 }, (_, i) =>
  Object.freeze({ any: (i & 4) !== 0, cluster: (i & 2) !== 0, local: (i & 1) !== 0 }),
);

/**
 * Every pair of family flags, by flagIndex(IPv4) * 8 + flagIndex(IPv6): a service port's are one of
 * these 64 shared objects, not two of its own (0.1 KB per service port), and the same flags are the
 * same object, so a flip is an identity check.
 */
const PAIRS: readonly FamilyPortalEndpoints[] = Array.from({ length: 64 }, (_, i) =>
  Object.freeze({ IPv4: FLAGS[i >> 3]!, IPv6: FLAGS[i & 7]! }),
);

export const NO_PORTAL_ENDPOINTS: FamilyPortalEndpoints = PAIRS[0]!;

/** The flags of `eps` (undefined: no endpoints): the same object for the same flags. */
export function portalEndpoints(eps: ServicePortEndpoints | undefined): FamilyPortalEndpoints {
  if (eps === undefined) return NO_PORTAL_ENDPOINTS;
  return PAIRS[flagIndex(eps, 'IPv4') * 8 + flagIndex(eps, 'IPv6')]!;
}

function flagIndex(eps: ServicePortEndpoints, family: IPFamily): number {
  const any = eps.all.some((ep) => ep.family === family && (ep.ready || (ep.serving && ep.terminating)));
  const cluster = hasFamily(eps.cluster, family);
  const local = hasFamily(eps.local, family);
  return (any ? 4 : 0) | (cluster ? 2 : 0) | (local ? 1 : 0);
}

function hasFamily(list: readonly Endpoint[], family: IPFamily): boolean {
  for (const ep of list) if (ep.family === family) return true;
  return false;
}
