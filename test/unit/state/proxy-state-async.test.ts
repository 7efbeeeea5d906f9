// checkoutAsync: the same snapshots as checkout, in time slices; what arrives during a slice's turn is
// left for the next checkout.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { EndpointSlice, Service } from '../../../src/source/objects.ts';
import { ProxyState, type TimeSlices } from '../../../src/state/proxy-state.ts';
import type { ServicePortKey } from '../../../src/state/service-port.ts';
import type { Snapshot } from '../../../src/state/snapshot.ts';

function svc(name: string, ip: string, port = 80): Service {
  return {
    metadata: { namespace: 'ns', name },
    spec: { clusterIP: ip, ports: [{ name: 'http', protocol: 'TCP', port }] },
  };
}

function slice(service: string, ips: string[]): EndpointSlice {
  return {
    metadata: { namespace: 'ns', name: `${service}-1`, labels: { 'kubernetes.io/service-name': service } },
    addressType: 'IPv4',
    endpoints: ips.map((ip) => ({ addresses: [ip] })),
    ports: [{ name: 'http', protocol: 'TCP', port: 8080 }],
  };
}

const key = (name: string) => `ns/${name}:http/TCP` as ServicePortKey;

/** A turn after every Service, running `during` at the given turns. */
function slicesWith(during: Map<number, () => void>): TimeSlices & { turns: number } {
  return {
    turns: 0,
    get due() {
      return true;
    },
    async turn() {
      this.turns++;
      during.get(this.turns)?.();
    },
  };
}

function load(state: ProxyState, n: number): void {
  for (let i = 0; i < n; i++) {
    state.onServiceAdd(svc(`s${i}`, `10.96.0.${i + 1}`));
    state.onEndpointSliceAdd(slice(`s${i}`, [`10.244.0.${i + 1}`]));
  }
  state.onServicesSynced();
  state.onEndpointSlicesSynced();
}

function summary(snap: Snapshot) {
  return {
    ports: [...snap.servicePorts.keys()].sort(),
    endpoints: [...snap.endpoints].map(([k, e]) => [k, e.cluster.map((x) => x.key)]).sort(),
    changedServicePorts: [...snap.changedServicePorts].sort(),
    changedEndpoints: [...snap.changedEndpoints].sort(),
  };
}

test('checkoutAsync gives the same snapshot as checkout', async () => {
  const a = new ProxyState({ nodeName: 'n', warn: () => {} });
  const b = new ProxyState({ nodeName: 'n', warn: () => {} });
  load(a, 5);
  load(b, 5);
  const slices = slicesWith(new Map());
  assert.deepEqual(summary(await a.checkoutAsync(slices)), summary(b.checkout()));
  assert.equal(slices.turns, 5, 'a turn after each Service');
});

test('events during a turn go to the next checkout, and nothing is lost', async () => {
  const state = new ProxyState({ nodeName: 'n', warn: () => {} });
  load(state, 4);
  const during = new Map([
    // s0 was recomputed already, s3 not yet: both changes belong to the next checkout.
    [1, () => state.onEndpointSliceUpdate(slice('s0', []), slice('s0', ['10.244.1.1']))],
    [2, () => state.onEndpointSliceUpdate(slice('s3', []), slice('s3', ['10.244.1.4']))],
    [3, () => state.onServiceAdd(svc('late', '10.96.1.1'))],
    [4, () => state.onServiceDelete(svc('s1', '10.96.0.2'))],
  ]);
  const first = await state.checkoutAsync(slicesWith(during));
  assert.ok(!first.servicePorts.has(key('late')), 'a Service added during the turn waits');
  assert.ok(first.servicePorts.has(key('s1')), 'a delete during the turn waits');
  assert.deepEqual(
    first.endpoints.get(key('s0'))?.cluster.map((e) => e.key),
    ['10.244.0.1:8080'],
  );
  assert.equal(state.pendingServiceChanges, 2);

  const second = state.checkout();
  assert.deepEqual([...second.changedServicePorts].sort(), [key('late'), key('s1')]);
  assert.ok(second.servicePorts.has(key('late')));
  assert.ok(!second.servicePorts.has(key('s1')));
  assert.deepEqual(
    second.endpoints.get(key('s0'))?.cluster.map((e) => e.key),
    ['10.244.1.1:8080'],
  );
  assert.deepEqual(
    second.endpoints.get(key('s3'))?.cluster.map((e) => e.key),
    ['10.244.1.4:8080'],
  );
  assert.ok(second.changedEndpoints.has(key('s0')));
  assert.equal(state.checkout().changedServicePorts.size, 0, 'then nothing is pending');
});
