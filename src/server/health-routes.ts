// The health server's routes (kube-proxy's healthz server): /healthz, ready once synced and not stale
// and while this Node is not being deleted; /livez, only not stale. Bodies as kube-proxy writes them.
import type { Route } from './http.ts';
import { sendJSON } from './http.ts';
import type { ProxyHealth } from './proxy-health.ts';

export function healthRoutes(health: ProxyHealth, now: () => number = Date.now): Record<string, Route> {
  return {
    '/healthz': (_req, res) => {
      const s = health.status(now());
      sendJSON(res, s.healthy ? 200 : 503, {
        lastUpdated: s.lastUpdated,
        currentTime: s.currentTime,
        healthy: s.healthy,
        nodeEligible: s.nodeEligible,
        reason: s.reason,
      });
    },
    '/livez': (_req, res) => {
      const s = health.status(now(), { requireSynced: false });
      sendJSON(res, s.healthy ? 200 : 503, {
        lastUpdated: s.lastUpdated,
        currentTime: s.currentTime,
        healthy: s.healthy,
      });
    },
  };
}
