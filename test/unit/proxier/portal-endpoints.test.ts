import assert from 'node:assert/strict';
import { test } from 'node:test';
import { NO_PORTAL_ENDPOINTS, portalEndpoints } from '../../../src/proxier/portal-endpoints.ts';
import type { ServicePortEndpoints } from '../../../src/state/endpoint.ts';
import { ep } from '../../helpers/endpoints.ts';

const v4 = ep('10.0.0.1', 80);
const v6 = ep('fd00::1', 80);
const notReady = ep('10.0.0.2', 80, { ready: false, serving: false });

function eps(o: Partial<ServicePortEndpoints>): ServicePortEndpoints {
  return { all: [], cluster: [], local: [], hasAnyEndpoints: false, localReadyCount: 0, ...o };
}

test('no endpoints at all, or none usable: every flag false (REJECT)', () => {
  assert.equal(portalEndpoints(undefined), NO_PORTAL_ENDPOINTS);
  assert.deepEqual(portalEndpoints(eps({ all: [notReady] })), NO_PORTAL_ENDPOINTS);
});

test('flags per family: a dual-stack service with IPv4 endpoints only', () => {
  const got = portalEndpoints(eps({ all: [v4], cluster: [v4] }));
  assert.deepEqual(got, {
    IPv4: { any: true, cluster: true, local: false },
    IPv6: { any: false, cluster: false, local: false },
  });
});

test('usable endpoints but an empty local list (DROP for the Local policy)', () => {
  const got = portalEndpoints(eps({ all: [v4, v6], cluster: [v4, v6], local: [] }));
  assert.deepEqual(got.IPv4, { any: true, cluster: true, local: false });
  assert.deepEqual(got.IPv6, { any: true, cluster: true, local: false });
});

test('the same flags are the same object (shared by every service port), other flags another', () => {
  const first = portalEndpoints(eps({ all: [v4], cluster: [v4] }));
  const other = ep('10.0.0.3', 80);
  assert.equal(portalEndpoints(eps({ all: [v4, other], cluster: [v4, other] })), first);
  assert.equal(portalEndpoints(eps({ all: [other], cluster: [other] })), first, 'another service port');
  const emptied = portalEndpoints(eps({ all: [] }));
  assert.notEqual(emptied, first);
  assert.equal(emptied, NO_PORTAL_ENDPOINTS);
  assert.equal(emptied.IPv4.any, false);
});
