// Endpoints that lead back to this proxy: our proxy ports on an address we listen on, our NodePorts on
// this host's addresses, the portals (ClusterIP, external IP, LB IP and port) of our own service ports.
// A connection sent there comes back to us and is sent there again: a forwarding loop. Such endpoints
// are left out of the balancers, with one warning each. The decision is pure; LoopGuard holds the
// current picture (counted per service port), how many listed endpoints are on each port, and the
// warnings already given.

import { CountedSet, PortBits } from '../lib/counted-set.ts';
import { isLoopbackIP } from '../lib/ip.ts';
import type { Logger } from '../lib/log.ts';
import { type Endpoint, type EndpointKey, endpointKey } from '../state/endpoint.ts';
import type { Protocol, ServicePort } from '../state/service-port.ts';

/** Why an endpoint leads back to us. */
export type LoopReason = 'proxy-port' | 'node-port' | 'portal';

type ByProtocol<T> = { readonly TCP: T; readonly UDP: T };

/** What the picture asks of a set of ports or portals. */
type Members<T> = { has(value: T): boolean };

/** What of this host answers as us. */
export type OwnListeners = {
  /** Where the proxy ports listen: `::` or `0.0.0.0` (every local address of the family) or one IP. */
  readonly bindHost: string;
  /** This host's addresses, canonical (loopback and the unspecified addresses are always local). */
  readonly localAddresses: ReadonlySet<string>;
  /** Our proxy ports (and local-list ports), by protocol. */
  readonly proxyPorts: ByProtocol<Members<number>>;
  /** NodePorts we serve (iptables mode), on every local address. */
  readonly nodePorts: ByProtocol<Members<number>>;
  /** `ip:port` (endpoint keys) of our portals, when rules send them to us. */
  readonly portals: ByProtocol<Members<string>>;
};

export const NO_LISTENERS: OwnListeners = {
  bindHost: '::',
  localAddresses: new Set(),
  proxyPorts: { TCP: new Set(), UDP: new Set() },
  nodePorts: { TCP: new Set(), UDP: new Set() },
  portals: { TCP: new Set(), UDP: new Set() },
};

/** True for loopback, the unspecified addresses (a connect there reaches loopback), and `local`. */
export function isLocalAddress(ip: string, local: ReadonlySet<string>): boolean {
  return isLoopbackIP(ip) || ip === '0.0.0.0' || ip === '::' || local.has(ip);
}

/** True when a connect to `ip` reaches a listener bound on `bindHost`. */
function reachesBind(ip: string, own: OwnListeners): boolean {
  const host = own.bindHost;
  if (host === '::') return isLocalAddress(ip, own.localAddresses);
  if (host === '0.0.0.0') return !ip.includes(':') && isLocalAddress(ip, own.localAddresses);
  if (ip === host) return true;
  // A connect to the unspecified address goes to loopback.
  return (ip === '0.0.0.0' && host === '127.0.0.1') || (ip === '::' && host === '::1');
}

/** Why `endpoint` of a `protocol` service port leads back to us; undefined when it does not. */
export function loopReason(
  endpoint: Endpoint,
  protocol: Protocol,
  own: OwnListeners,
): LoopReason | undefined {
  if (own.portals[protocol].has(endpoint.key)) return 'portal';
  if (own.proxyPorts[protocol].has(endpoint.port) && reachesBind(endpoint.ip, own)) return 'proxy-port';
  if (own.nodePorts[protocol].has(endpoint.port) && isLocalAddress(endpoint.ip, own.localAddresses))
    return 'node-port';
  return undefined;
}

export type OwnPortsOptions = {
  /** NodePorts are served (iptables mode). */
  readonly nodePorts: boolean;
  /** Rules send the service IPs to us (not --no-iptables). */
  readonly portals: boolean;
};

/** Which listed endpoints a change of what answers as us concerns (LoopGuard.takeChanges). */
export type Concerns = (e: Endpoint) => boolean;

function sameSet<T>(a: ReadonlySet<T>, b: ReadonlySet<T>): boolean {
  if (a.size !== b.size) return false;
  for (const v of a) if (!b.has(v)) return false;
  return true;
}

/** Ports, counted: a bit each (a proxy port is one service port's own: counts above one are rare). */
function countedPorts(): CountedSet<number> {
  return new CountedSet(new PortBits());
}

/** Counts `key` once more (`by` 1) or once less (-1); a count of 0 is no entry. */
function count(counts: Map<number, number>, key: number, by: 1 | -1): void {
  const n = (counts.get(key) ?? 0) + by;
  if (n === 0) counts.delete(key);
  else counts.set(key, n);
}

/** The port of an endpoint key (`ip:port`, `[ip]:port`). */
function portOfKey(key: EndpointKey): number {
  return Number(key.slice(key.lastIndexOf(':') + 1));
}

/** Warnings remembered (service port, endpoint); past it they are forgotten and may be given again. */
const MAX_WARNED = 4096;

/**
 * The current picture, applied to endpoint lists; warns once per service port and endpoint. The picture
 * is counted per listener (moveProxyPort) and per service port (place/remove: its NodePort and
 * portals), so one that starts or stops changes it without a look at the others; takeChanges() tells
 * which listed endpoints what came or went concerns, and whether any can be (how many listed endpoints
 * are on each port: watch).
 */
export class LoopGuard {
  readonly #log: Logger;
  readonly #warned = new Set<string>();
  readonly #proxyPorts = { TCP: countedPorts(), UDP: countedPorts() };
  readonly #nodePorts = { TCP: countedPorts(), UDP: countedPorts() };
  readonly #portals = { TCP: new CountedSet<EndpointKey>(), UDP: new CountedSet<EndpointKey>() };
  #own: OwnListeners = {
    ...NO_LISTENERS,
    proxyPorts: this.#proxyPorts,
    nodePorts: this.#nodePorts,
    portals: this.#portals,
  };
  /**
   * How many listed endpoints (of every running service port) are on each port: a change on a port no
   * endpoint is listed on concerns no list. Counts, not who lists them: an index of which service
   * ports list each endpoint cost 33-46 bytes per endpoint and service port.
   */
  readonly #listedPorts = new Map<number, number>();
  readonly #options: OwnPortsOptions;

  constructor(log: Logger, options: OwnPortsOptions) {
    this.#log = log;
    this.#options = options;
  }

  get own(): OwnListeners {
    return this.#own;
  }

  /**
   * Where the proxy ports listen and this host's addresses. True when either changed: every endpoint
   * list must be filtered again (takeChanges() does not cover it).
   */
  setHost(bindHost: string, localAddresses: ReadonlySet<string>): boolean {
    const own = this.#own;
    if (own.bindHost === bindHost && sameSet(own.localAddresses, localAddresses)) return false;
    this.#own = { ...own, bindHost, localAddresses };
    return true;
  }

  /** A listener of a `protocol` service port moved from proxy port `before` to `after` (undefined: none). */
  moveProxyPort(protocol: Protocol, before: number | undefined, after: number | undefined): void {
    if (before === after) return;
    if (before !== undefined) this.#proxyPorts[protocol].delete(before);
    if (after !== undefined) this.#proxyPorts[protocol].add(after);
  }

  /**
   * `sp` runs: its NodePort and portals are in the picture, replacing those of `before` (the service port
   * as placed last; undefined: none). The caller keeps `sp` for the next call.
   */
  place(sp: ServicePort, before: ServicePort | undefined): void {
    if (sp === before) return;
    if (before !== undefined) this.#count(before, -1);
    this.#count(sp, 1);
  }

  /** The service port placed last as `sp` runs no more: its NodePort and portals are taken out. */
  remove(sp: ServicePort): void {
    this.#count(sp, -1);
  }

  #count(sp: ServicePort, by: 1 | -1): void {
    const proto = sp.protocol;
    const change = <T>(set: CountedSet<T>, value: T) => (by === 1 ? set.add(value) : set.delete(value));
    if (this.#options.nodePorts && sp.nodePort !== 0) change(this.#nodePorts[proto], sp.nodePort);
    if (!this.#options.portals) return;
    for (const ips of [sp.clusterIPs, sp.externalIPs, sp.loadBalancerIPs])
      for (const ip of ips) change(this.#portals[proto], endpointKey(ip, sp.port));
  }

  /**
   * A running service port lists `after` instead of `before` (all its endpoints; undefined: none). The
   * same array is no change.
   */
  watch(before: readonly Endpoint[] | undefined, after: readonly Endpoint[] | undefined): void {
    if (before === after) return;
    for (const e of before ?? []) count(this.#listedPorts, e.port, -1);
    for (const e of after ?? []) count(this.#listedPorts, e.port, 1);
  }

  /**
   * The ports and portals that came or went since the last call, as the test of a listed endpoint they
   * concern: the lists with such an endpoint are to be filtered again (a superset of those whose
   * filtered lists change). Undefined when no listed endpoint is on any of their ports: none is. The
   * changes are forgotten.
   */
  takeChanges(): Concerns | undefined {
    const ports = new Set<number>();
    const portals = new Set<EndpointKey>();
    for (const proto of ['TCP', 'UDP'] as const) {
      for (const p of this.#proxyPorts[proto].takeChanged()) ports.add(p);
      for (const p of this.#nodePorts[proto].takeChanged()) ports.add(p);
      for (const k of this.#portals[proto].takeChanged()) portals.add(k);
    }
    const portalPorts = new Set([...portals].map(portOfKey));
    const listed = (port: number) => this.#listedPorts.has(port);
    if (![...ports].some(listed) && ![...portalPorts].some(listed)) return undefined;
    // The proxier tests every listed endpoint (~1.3 ms for 50,000): a port first, a key only on its port.
    return (e) => ports.has(e.port) || (portalPorts.has(e.port) && portals.has(e.key));
  }

  /**
   * `list` without the endpoints that lead back to us (the same array when there are none: no
   * allocation on the usual path); each one left out is added to `refused`.
   */
  filter(sp: ServicePort, list: readonly Endpoint[], refused: Set<EndpointKey>): readonly Endpoint[] {
    let out: Endpoint[] | undefined;
    for (let i = 0; i < list.length; i++) {
      const e = list[i]!;
      const reason = loopReason(e, sp.protocol, this.#own);
      if (reason === undefined) {
        out?.push(e);
        continue;
      }
      out ??= list.slice(0, i);
      refused.add(e.key);
      this.#warn(sp, e, reason);
    }
    return out ?? list;
  }

  #warn(sp: ServicePort, e: Endpoint, reason: LoopReason): void {
    const key = `${sp.key}|${e.key}|${reason}`;
    if (this.#warned.has(key)) return;
    if (this.#warned.size >= MAX_WARNED) this.#warned.clear();
    this.#warned.add(key);
    this.#log.warn(
      { service: sp.key, endpoint: e.key, reason },
      'Endpoint leads back to this proxy (a forwarding loop), left out',
    );
  }
}
