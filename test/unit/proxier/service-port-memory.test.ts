// What an idle service port costs in the state and the proxier: Services of one port with five endpoints
// each, through the intake, the state's checkout and a proxier sync, as in a cluster with rules (portals
// kept, the loop guard's portals counted), but listeners that hold no socket. Heap after full GCs.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { silentLogger } from '../../../src/lib/log.ts';
import { PortAllocator } from '../../../src/proxier/port-allocator.ts';
import { Proxier } from '../../../src/proxier/proxier.ts';
import type { ListenerFactory, ServicePortListener } from '../../../src/proxier/service-port-listener.ts';
import { DEFAULT_TCP_OPTIONS } from '../../../src/relay/tcp.ts';
import { DEFAULT_UDP_OPTIONS } from '../../../src/relay/udp.ts';
import { Intake } from '../../../src/source/intake.ts';
import type { EndpointSlice, Service } from '../../../src/source/objects.ts';
import { ProxyState } from '../../../src/state/proxy-state.ts';
import { medianOf, usedHeap } from '../../helpers/heap.ts';

const NODE = 'node-1';
const SERVICES = 5000;

/** A listener without a socket: its port, nothing else. */
class Idle implements ServicePortListener {
  port = 0;
  async listen(_host: string, port: number): Promise<void> {
    this.port = port;
  }
  async close(): Promise<void> {}
  destroy(): void {}
  async drained(): Promise<void> {}
  endpointsChanged(): number {
    return 0;
  }
}

const idle: ListenerFactory = () => new Idle();

function service(i: number): Service {
  const ip = `10.100.${i >> 8}.${i & 255}`;
  return {
    metadata: { namespace: 'bench', name: `svc-${i}` },
    spec: {
      clusterIP: ip,
      clusterIPs: [ip],
      ports: [{ name: 'p', protocol: 'TCP', port: 80, targetPort: 8080 }],
    },
  };
}

function slice(i: number, ips: readonly string[]): EndpointSlice {
  return {
    metadata: {
      namespace: 'bench',
      name: `svc-${i}-1`,
      labels: { 'kubernetes.io/service-name': `svc-${i}` },
    },
    addressType: 'IPv4',
    endpoints: ips.map((ip) => ({ addresses: [ip], conditions: { ready: true } })),
    ports: [{ name: 'p', protocol: 'TCP', port: 8080 }],
  };
}

/** The heap per service port of `count` Services (each with the endpoints `ips(i)`) over none. */
async function heapPerServicePort(
  ips: (i: number) => readonly string[],
  services = SERVICES,
): Promise<number> {
  const state = new ProxyState({ nodeName: NODE, warn: () => {} });
  const intake = new Intake(state, { warn: () => {}, nodeName: NODE });
  const proxier = new Proxier(
    { listenHost: '::', tcp: DEFAULT_TCP_OPTIONS, udp: DEFAULT_UDP_OPTIONS, syncPeriodMs: 30_000 },
    {
      source: state,
      allocator: new PortAllocator({ base: 20000, size: 20000 }),
      // Rules are written (nowhere): portals are kept as with iptables.
      portals: { sync: async () => {}, update: async () => {} },
      log: silentLogger(),
      listeners: idle,
      localAddresses: () => ['192.168.1.10'],
    },
  );
  intake.onServicesSynced();
  intake.onEndpointSlicesSynced();
  await proxier.sync();
  const before = await usedHeap();
  for (let i = 1; i <= services; i++) {
    intake.onServiceAdd(service(i));
    intake.onEndpointSliceAdd(slice(i, ips(i)));
  }
  await proxier.sync();
  proxier.releaseChanges();
  assert.equal(proxier.size, services);
  const after = await usedHeap();
  proxier.destroy();
  return (after - before) / services;
}

/**
 * The median of three measures of heapPerServicePort, after one of 500 Services whose figure is dropped:
 * the first run's code (bytecode, feedback, the intake's and proxier's first allocations) is not the
 * service ports', and one measure moves by ~200 bytes with where the collector's pages stand.
 */
async function medianHeapPerServicePort(ips: (i: number) => readonly string[]): Promise<number> {
  await heapPerServicePort(ips, 500);
  return medianOf(3, () => heapPerServicePort(ips));
}

// Before one record per service port (the proxier's, the loop guard's and the state's maps by service
// port folded into the runtime and the state's ports by Service; no index of who lists which endpoint;
// an endpoint of one list without a count) these were ~2,270 and ~3,430 bytes (one measure each, the
// first run's code counted in the first); now ~1,500 and ~2,590.
test('an idle service port, the same five pods behind every Service: under 1,700 bytes in the state and the proxier', async () => {
  const perPort = await medianHeapPerServicePort(() => [
    '10.244.1.5',
    '10.244.2.5',
    '10.244.3.5',
    '10.244.4.5',
    '10.244.5.5',
  ]);
  assert.ok(perPort < 1700, `${perPort.toFixed(0)} bytes a service port`);
});

test('an idle service port, five pods of its own: under 3,000 bytes in the state and the proxier', async () => {
  const perPort = await medianHeapPerServicePort((i) =>
    [1, 2, 3, 4, 5].map((k) => `10.${240 + k}.${i >> 8}.${i & 255}`),
  );
  assert.ok(perPort < 3000, `${perPort.toFixed(0)} bytes a service port`);
});
