// Endpoints that lead back to this proxy: our proxy ports on an address we listen on, our NodePorts on
// this host's addresses, the portals (ClusterIP, external IP, LB IP and port) of our own service ports.
// A connection sent there comes back to us and is sent there again: a forwarding loop. Such endpoints
// are left out of the balancers, with one warning each. The decision is pure; LoopGuard holds the
// current picture and the warnings already given.
import { isLoopbackIP } from '../lib/ip.ts';
import type { Logger } from '../lib/log.ts';
import { type Endpoint, type EndpointKey, endpointKey } from '../state/endpoint.ts';
import type { Protocol, ServicePort } from '../state/service-port.ts';

/** Why an endpoint leads back to us. */
export type LoopReason = 'proxy-port' | 'node-port' | 'portal';

type ByProtocol<T> = { readonly TCP: T; readonly UDP: T };

/** What of this host answers as us. */
export type OwnListeners = {
  /** Where the proxy ports listen: `::` or `0.0.0.0` (every local address of the family) or one IP. */
  readonly bindHost: string;
  /** This host's addresses, canonical (loopback and the unspecified addresses are always local). */
  readonly localAddresses: ReadonlySet<string>;
  /** Our proxy ports (and local-list ports), by protocol. */
  readonly proxyPorts: ByProtocol<ReadonlySet<number>>;
  /** NodePorts we serve (iptables mode), on every local address. */
  readonly nodePorts: ByProtocol<ReadonlySet<number>>;
  /** `ip:port` (endpoint keys) of our portals, when rules send them to us. */
  readonly portals: ByProtocol<ReadonlySet<string>>;
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

export type OwnListenersOptions = {
  bindHost: string;
  localAddresses: ReadonlySet<string>;
  /** NodePorts are served (iptables mode). */
  nodePorts: boolean;
  /** Rules send the service IPs to us (not --no-iptables). */
  portals: boolean;
};

/**
 * Builds the picture one service port at a time (the proxier yields between them: 10,000 service ports
 * take ~20 ms), and tells whether it differs from `previous` as it goes, with no second pass: a set
 * whose every member was in the previous one and that has as many members is the same set.
 */
export class OwnListenersBuilder {
  readonly #previous: OwnListeners;
  readonly #options: OwnListenersOptions;
  readonly #proxyPorts = { TCP: new Set<number>(), UDP: new Set<number>() };
  readonly #nodePorts = { TCP: new Set<number>(), UDP: new Set<number>() };
  readonly #portals = { TCP: new Set<string>(), UDP: new Set<string>() };
  #differs: boolean;

  constructor(previous: OwnListeners, options: OwnListenersOptions) {
    this.#previous = previous;
    this.#options = options;
    this.#differs =
      previous.bindHost !== options.bindHost || !sameSet(previous.localAddresses, options.localAddresses);
  }

  /** A running service port and its proxy ports (0 = none). */
  add(sp: ServicePort, proxyPorts: readonly number[]): void {
    const prev = this.#previous;
    const proto = sp.protocol;
    for (const p of proxyPorts) {
      if (p === 0) continue;
      this.#proxyPorts[proto].add(p);
      if (!this.#differs && !prev.proxyPorts[proto].has(p)) this.#differs = true;
    }
    if (this.#options.nodePorts && sp.nodePort !== 0) {
      this.#nodePorts[proto].add(sp.nodePort);
      if (!this.#differs && !prev.nodePorts[proto].has(sp.nodePort)) this.#differs = true;
    }
    if (!this.#options.portals) return;
    const set = this.#portals[proto];
    for (const ips of [sp.clusterIPs, sp.externalIPs, sp.loadBalancerIPs]) {
      for (const ip of ips) {
        const key = endpointKey(ip, sp.port);
        set.add(key);
        if (!this.#differs && !prev.portals[proto].has(key)) this.#differs = true;
      }
    }
  }

  /** The picture, and whether it refuses other endpoints than `previous`. */
  build(): { own: OwnListeners; changed: boolean } {
    const prev = this.#previous;
    const sizes = (a: ByProtocol<ReadonlySet<unknown>>, b: ByProtocol<ReadonlySet<unknown>>) =>
      a.TCP.size === b.TCP.size && a.UDP.size === b.UDP.size;
    const own: OwnListeners = {
      bindHost: this.#options.bindHost,
      localAddresses: this.#options.localAddresses,
      proxyPorts: this.#proxyPorts,
      nodePorts: this.#nodePorts,
      portals: this.#portals,
    };
    const changed =
      this.#differs ||
      !sizes(own.proxyPorts, prev.proxyPorts) ||
      !sizes(own.nodePorts, prev.nodePorts) ||
      !sizes(own.portals, prev.portals);
    return { own, changed };
  }
}

function sameSet<T>(a: ReadonlySet<T>, b: ReadonlySet<T>): boolean {
  if (a.size !== b.size) return false;
  for (const v of a) if (!b.has(v)) return false;
  return true;
}

/** Warnings remembered (service port, endpoint); past it they are forgotten and may be given again. */
const MAX_WARNED = 4096;

/** The current picture, applied to endpoint lists; warns once per service port and endpoint. */
export class LoopGuard {
  readonly #log: Logger;
  readonly #warned = new Set<string>();
  #own: OwnListeners = NO_LISTENERS;

  constructor(log: Logger) {
    this.#log = log;
  }

  get own(): OwnListeners {
    return this.#own;
  }

  /** Takes a picture built against the current one (OwnListenersBuilder), already compared. */
  replace(own: OwnListeners): void {
    this.#own = own;
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
