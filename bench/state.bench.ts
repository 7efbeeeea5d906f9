// Times the intake + state at 10,000 services × 5 endpoints: the initial build + checkout, then one
// endpoint change + checkout and one Service change + checkout. Prints; asserts nothing.
// Run: node bench/state.bench.ts
import { performance } from 'node:perf_hooks';
import { Intake } from '../src/source/intake.ts';
import type { EndpointSlice, Service } from '../src/source/objects.ts';
import { ProxyState } from '../src/state/proxy-state.ts';

const SERVICES = 10_000;
const ENDPOINTS = 5;
const ROUNDS = 20;

const octets = (i: number) => `${(i >> 8) & 255}.${i & 255}`;

function service(i: number, affinity: 'None' | 'ClientIP' = 'None'): Service {
  return {
    metadata: { namespace: 'bench', name: `svc-${i}` },
    spec: {
      clusterIP: `10.96.${octets(i)}`,
      ports: [{ name: 'http', protocol: 'TCP', port: 80 }],
      sessionAffinity: affinity,
    },
  };
}

function slice(i: number, hosts: number[]): EndpointSlice {
  return {
    metadata: {
      namespace: 'bench',
      name: `svc-${i}-abcde`,
      labels: { 'kubernetes.io/service-name': `svc-${i}` },
    },
    addressType: 'IPv4',
    endpoints: hosts.map((h) => ({ addresses: [`10.${octets(i)}.${h}`], nodeName: `node-${h}` })),
    ports: [{ name: 'http', protocol: 'TCP', port: 8080 }],
  };
}

function time(fn: () => void): number {
  const start = performance.now();
  fn();
  return performance.now() - start;
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[s.length >> 1] ?? Number.NaN;
}

const state = new ProxyState({ nodeName: 'node-1', warn: () => {} });
// Events reach the state through the intake (validation, selection), as from a source.
const intake = new Intake(state, { warn: () => {} });
const hosts = Array.from({ length: ENDPOINTS }, (_, h) => h + 1);

const build = time(() => {
  for (let i = 0; i < SERVICES; i++) {
    intake.onServiceAdd(service(i));
    intake.onEndpointSliceAdd(slice(i, hosts));
  }
  intake.onServicesSynced();
  intake.onEndpointSlicesSynced();
});
const first = time(() => state.checkout());

const endpointChange: number[] = [];
const serviceChange: number[] = [];
for (let r = 0; r < ROUNDS; r++) {
  const i = (r * 7919) % SERVICES;
  endpointChange.push(
    time(() => {
      intake.onEndpointSliceUpdate(slice(i, hosts), slice(i, r % 2 === 0 ? hosts.slice(1) : hosts));
      state.checkout();
    }),
  );
  serviceChange.push(
    time(() => {
      intake.onServiceUpdate(service(i), service(i, r % 2 === 0 ? 'ClientIP' : 'None'));
      state.checkout();
    }),
  );
}

const fmt = (ms: number) => `${ms.toFixed(ms < 10 ? 3 : 0)} ms`;
console.log(`state: ${SERVICES} services × ${ENDPOINTS} endpoints`);
console.log(`  build (events)                 ${fmt(build)}`);
console.log(`  first checkout                 ${fmt(first)}`);
console.log(`  1 slice change + checkout      ${fmt(median(endpointChange))} (median of ${ROUNDS})`);
console.log(`  1 service change + checkout    ${fmt(median(serviceChange))} (median of ${ROUNDS})`);
