// Builders for Endpoint values in tests.
import type { Endpoint } from '../../src/state/endpoint.ts';
import { endpointKey } from '../../src/state/endpoint.ts';

export function ep(ip: string, port: number, extra: Partial<Endpoint> = {}): Endpoint {
  return {
    key: endpointKey(ip, port),
    ip,
    port,
    family: ip.includes(':') ? 'IPv6' : 'IPv4',
    ready: true,
    serving: true,
    terminating: false,
    isLocal: false,
    nodeName: undefined,
    zoneHints: undefined,
    nodeHints: undefined,
    ...extra,
  };
}
