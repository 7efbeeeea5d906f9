// What the rules need to know of a service port's endpoints: per family, whether any endpoint is
// usable and whether the cluster and local lists are empty. Pure: no I/O. Recomputed on every endpoint
// change; the rules change only when one of these flags flips (0 <-> N), not on every endpoint.

import type { Endpoint, ServicePortEndpoints } from '../state/endpoint.ts';
import type { IPFamily } from '../state/service-port.ts';
import type { PortalEndpoints, PortalSpec } from './portal-programmer.ts';

export type FamilyPortalEndpoints = PortalSpec['endpoints'];

const NONE: PortalEndpoints = { any: false, cluster: false, local: false };
export const NO_PORTAL_ENDPOINTS: FamilyPortalEndpoints = { IPv4: NONE, IPv6: NONE };

/** The flags of `eps` (undefined: no endpoints), reusing `previous` when nothing flipped. */
export function portalEndpoints(
  eps: ServicePortEndpoints | undefined,
  previous: FamilyPortalEndpoints = NO_PORTAL_ENDPOINTS,
): FamilyPortalEndpoints {
  if (eps === undefined) return NO_PORTAL_ENDPOINTS;
  const v4 = familyFlags(eps, 'IPv4', previous.IPv4);
  const v6 = familyFlags(eps, 'IPv6', previous.IPv6);
  return v4 === previous.IPv4 && v6 === previous.IPv6 ? previous : { IPv4: v4, IPv6: v6 };
}

function familyFlags(
  eps: ServicePortEndpoints,
  family: IPFamily,
  previous: PortalEndpoints,
): PortalEndpoints {
  const any = eps.all.some((ep) => ep.family === family && (ep.ready || (ep.serving && ep.terminating)));
  const cluster = hasFamily(eps.cluster, family);
  const local = hasFamily(eps.local, family);
  if (any === previous.any && cluster === previous.cluster && local === previous.local) return previous;
  return any || cluster || local ? { any, cluster, local } : NONE;
}

function hasFamily(list: readonly Endpoint[], family: IPFamily): boolean {
  for (const ep of list) if (ep.family === family) return true;
  return false;
}
