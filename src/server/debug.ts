// /debug/services: one JSON object per running service port (the contract in DESIGN.md), plus the
// service ports that should run but could not be opened. Pure: builds the body from proxier status.
import type { ProxyError } from '../lib/errors.ts';
import type { Proxier, ServicePortStatus } from '../proxier/proxier.ts';
import { parseServicePortKey, type ServicePortKey } from '../state/service-port.ts';
import type { Route } from './http.ts';
import { sendJSON } from './http.ts';

export type DebugServicePort = {
  service: string;
  protocol: 'TCP' | 'UDP';
  clusterIP: string;
  clusterIPs: readonly string[];
  port: number;
  proxyPort: number;
  nodePort: number;
  externalIPs: readonly string[];
  loadBalancerIPs: readonly string[];
  endpoints: string[];
  /**
   * The listener of the node-local list, when the service port has one beside the cluster-wide list
   * (externalTrafficPolicy / internalTrafficPolicy Local), and that list.
   */
  localProxyPort?: number;
  localEndpoints?: string[];
  /** Endpoints left out because they lead back to this proxy (a forwarding loop). */
  loopEndpoints?: string[];
  /** The PROXY protocol header its TCP connections send their endpoint first (absent: none). */
  proxyProtocol?: 'v1' | 'v2';
  /**
   * The listeners of its external destinations, by destination (an IP, or `node` for the NodePort):
   * with the PROXY protocol and rules in front, each portal has its own, to know what the client asked for.
   */
  portalProxyPorts?: Record<string, { proxyPort: number; localProxyPort?: number }>;
  /** Endpoints skipped by outlier ejection, and when they come back. */
  ejected?: { endpoint: string; until: string }[];
  sessionAffinity: 'None' | 'ClientIP';
  stickyMaxAgeSeconds?: number;
  connections: {
    accepted: number;
    active: number;
    noEndpoints: number;
    connectFailed: number;
    connectFailures: Record<string, number>;
  };
  error?: { code: string; message: string };
};

/** The metrics server's /debug/services. */
export function debugRoutes(proxier: () => Proxier): Record<string, Route> {
  return {
    '/debug/services': (_req, res) => {
      const p = proxier();
      sendJSON(res, 200, debugServices(p.status(), p.failures(), p.nodePortErrors()));
    },
  };
}

function debugServices(
  running: readonly ServicePortStatus[],
  failures: ReadonlyMap<ServicePortKey, ProxyError> = new Map(),
  nodePortErrors: ReadonlyMap<ServicePortKey, ProxyError> = new Map(),
): DebugServicePort[] {
  const out: DebugServicePort[] = running.map((status) => {
    const { servicePort: sp, proxyPort, endpoints, context } = status;
    return {
      ...errorField(nodePortErrors.get(sp.key)),
      service: sp.name,
      protocol: sp.protocol,
      clusterIP: sp.clusterIPs[0] ?? '',
      clusterIPs: sp.clusterIPs,
      port: sp.port,
      proxyPort,
      nodePort: sp.nodePort,
      externalIPs: sp.externalIPs,
      loadBalancerIPs: sp.loadBalancerIPs,
      endpoints: endpoints.map((e) => e.key).sort(),
      ...(status.localProxyPort === 0
        ? {}
        : {
            localProxyPort: status.localProxyPort,
            localEndpoints: status.localEndpoints.map((e) => e.key).sort(),
          }),
      ...(status.loopEndpoints.length === 0 ? {} : { loopEndpoints: [...status.loopEndpoints].sort() }),
      ...(status.proxyProtocol === undefined ? {} : { proxyProtocol: status.proxyProtocol }),
      ...portalPortsField(status.portalPorts),
      ...ejectedField(context.balancer.outlier?.ejected(Date.now())),
      sessionAffinity: sp.sessionAffinity,
      ...(sp.sessionAffinity === 'ClientIP' ? { stickyMaxAgeSeconds: sp.stickyMaxAgeSeconds } : {}),
      connections: {
        accepted: context.stats.accepted,
        active: context.stats.active,
        noEndpoints: context.stats.noEndpoints,
        connectFailed: context.stats.connectFailed,
        connectFailures: { ...context.stats.connectFailures },
      },
    };
  });
  for (const [key, err] of failures) {
    const { name, protocol } = parseServicePortKey(key);
    out.push({
      service: name,
      protocol,
      clusterIP: '',
      clusterIPs: [],
      port: 0,
      proxyPort: 0,
      nodePort: 0,
      externalIPs: [],
      loadBalancerIPs: [],
      endpoints: [],
      sessionAffinity: 'None',
      connections: { accepted: 0, active: 0, noEndpoints: 0, connectFailed: 0, connectFailures: {} },
      error: { code: err.code, message: err.message },
    });
  }
  out.sort((a, b) =>
    a.service < b.service ? -1 : a.service > b.service ? 1 : a.protocol < b.protocol ? -1 : 1,
  );
  return out;
}

function errorField(err: ProxyError | undefined): { error?: { code: string; message: string } } {
  return err === undefined ? {} : { error: { code: err.code, message: err.message } };
}

function portalPortsField(ports: ServicePortStatus['portalPorts']) {
  if (ports.size === 0) return {};
  const out: Record<string, { proxyPort: number; localProxyPort?: number }> = {};
  for (const [via, p] of ports) out[via] = p.localProxyPort === 0 ? { proxyPort: p.proxyPort } : { ...p };
  return { portalProxyPorts: out };
}

function ejectedField(list: { endpoint: string; untilMs: number }[] | undefined) {
  if (list === undefined || list.length === 0) return {};
  return { ejected: list.map((e) => ({ endpoint: e.endpoint, until: new Date(e.untilMs).toISOString() })) };
}
