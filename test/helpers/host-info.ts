// A host as the proxy reads it (routes and interfaces), for tests that run the proxy with a fake
// iptables: one interface eth0 with 192.168.1.5/24 and the default route through it.
import type { HostInfo } from '../../src/netfilter/node-ip.ts';

export function fakeHostInfo(): HostInfo {
  return {
    route4:
      'Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\neth0\t00000000\t0101A8C0\t0003\t0\t0\t0\t00000000\n',
    route6: '',
    interfaces: {
      eth0: [
        {
          address: '192.168.1.5',
          netmask: '255.255.255.0',
          family: 'IPv4' as const,
          mac: '00:00:00:00:00:01',
          internal: false,
          cidr: '192.168.1.5/24',
        },
      ],
    },
  };
}
