import assert from 'node:assert/strict';
import { test } from 'node:test';
import { NO_PORTAL_ENDPOINTS } from '../../../src/proxier/portal-endpoints.ts';
import { noPortals, type PortalSpec } from '../../../src/proxier/portal-programmer.ts';
import { PortalTracker } from '../../../src/proxier/portal-tracker.ts';
import type { ServicePortRuntime } from '../../../src/proxier/service-port-runtime.ts';
import { collectGarbage } from '../../helpers/heap.ts';
import { portal } from '../../helpers/portals.ts';

/** What portalOf reads of a running service port. */
function runtime(name: string): ServicePortRuntime {
  const { servicePort } = portal('default', name, 'http', { clusterIPs: ['10.96.0.1'] });
  return {
    servicePort,
    proxyPort: 30000,
    localProxyPort: 0,
    portalPorts: new Map(),
    endpoints: NO_PORTAL_ENDPOINTS,
  } as unknown as ServicePortRuntime;
}

test('no rules to write (a worker, --no-iptables): no portal is built for program(), none is kept', async () => {
  const tracker = new PortalTracker(noPortals, false);
  assert.equal(tracker.enabled, false);
  const rt = runtime('a');
  let built: WeakRef<PortalSpec> | undefined;
  (() => {
    built = new WeakRef(tracker.portalOf(rt, undefined));
  })();
  tracker.touch(rt.servicePort.key);
  const fail = () => {
    throw new Error('a portal was built');
  };
  await tracker.program(true, true, fail, fail);
  await tracker.program(false, false, fail, fail);
  assert.equal(tracker.pending, false);
  await collectGarbage();
  assert.equal(built?.deref(), undefined, 'the portal was not kept for the next call');
});

test('rules written: the same portal object while nothing it depends on changed', () => {
  const tracker = new PortalTracker({ sync: async () => {} }, false);
  const rt = runtime('a');
  assert.equal(tracker.portalOf(rt, undefined), tracker.portalOf(rt, undefined));
});
