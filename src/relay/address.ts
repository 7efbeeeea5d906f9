// Client addresses as the relays see them: the `::ffff:` form of a dual-stack socket cut to plain IPv4,
// and the family that picks the balancer. Pure: no I/O.
import type { IPFamily } from '../state/service-port.ts';

/** `::ffff:10.0.0.1` (an IPv4 client on a dual-stack socket) → `10.0.0.1`. */
export function normalizeAddress(address: string | undefined): string {
  if (address === undefined) return '';
  return address.startsWith('::ffff:') && address.includes('.') ? address.slice(7) : address;
}

/**
 * The family of a client address as the relays normalise it (`::ffff:a.b.c.d` already cut to
 * `a.b.c.d`): one character scan, no allocation.
 */
export function clientFamily(address: string): IPFamily {
  return address.includes(':') ? 'IPv6' : 'IPv4';
}
