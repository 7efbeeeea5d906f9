// Service object → the ServicePorts kube-proxy would program for it (newBaseServiceInfo, ShouldSkipService).
// Pure: no I/O; anything it drops is reported through `warn`. Expects an object that passed validateService,
// but never throws on one that did not.

import { canonicalIP, ipFamilyOf, isValidCIDR } from '../lib/ip.ts';
import { ANNOTATION_PROXY_PROTOCOL, ANNOTATION_TRACE } from '../lib/kubernetes-labels.ts';
import { sameList } from '../lib/lists.ts';
import type { Service, ServicePortSpec } from '../source/objects.ts';
import {
  DEFAULT_STICKY_MAX_AGE_SECONDS,
  type IPFamily,
  MAX_STICKY_MAX_AGE_SECONDS,
  type Protocol,
  type ProxyProtocolMode,
  type ServicePort,
  servicePortKey,
  servicePortName,
  type TraceMode,
} from './service-port.ts';

/** How the state module reports input it ignores: a short message and key/values (pino style). */
export type Warn = (msg: string, fields: Record<string, unknown>) => void;

/**
 * kube-proxy's ShouldSkipService: no cluster IP (`""`, `None`: headless) or type ExternalName.
 * Such a Service has no service ports.
 */
export function shouldSkipService(svc: Service): boolean {
  const spec = svc.spec;
  if (spec === undefined || spec.type === 'ExternalName') return true;
  const primary = spec.clusterIPs?.[0] ?? spec.clusterIP;
  return primary === undefined || primary === '' || primary === 'None';
}

/**
 * One ServicePort per `spec.ports[]` entry we can proxy, in spec order. Skipped services give [];
 * SCTP and unknown protocols are skipped with a warning. IPs are canonical; externalIPs, LB IPs and
 * source ranges are kept only for the families the Service has cluster IPs for (kube-proxy runs one
 * proxier per family, and the other family's has no entry for the Service).
 */
export function servicePortsFromService(svc: Service, warn: Warn): readonly ServicePort[] {
  const spec = svc.spec;
  if (spec === undefined || shouldSkipService(svc)) return [];
  const namespace = svc.metadata?.namespace ?? '';
  const name = svc.metadata?.name ?? '';
  const service = `${namespace}/${name}`;

  const clusterIPs = clusterIPsOf(svc);
  if (clusterIPs.length === 0) {
    warn('Service has no valid cluster IP; skipped', { service });
    return [];
  }
  const families = new Set(clusterIPs.map((ip) => ipFamilyOf(ip)));
  const inFamilies = (ip: string): boolean => families.has(ipFamilyOf(ip));

  const allExternalIPs = uniqueIPs(spec.externalIPs ?? []);
  const allLBIPs = uniqueIPs(
    (svc.status?.loadBalancer?.ingress ?? [])
      // kube-proxy's IsVIPMode: ipMode Proxy means the LB delivers to nodes itself.
      .filter((ing) => ing.ipMode === undefined || ing.ipMode === null || ing.ipMode === 'VIP')
      .map((ing) => ing.ip ?? ''),
  );
  const otherFamily = [...allExternalIPs, ...allLBIPs].filter((ip) => !inFamilies(ip));
  if (otherFamily.length > 0)
    warn('Service IPs of a family without a cluster IP ignored', { service, ips: otherFamily });
  const externalIPs = kept(allExternalIPs.filter(inFamilies));
  const lbIPs = kept(allLBIPs.filter(inFamilies));
  const sourceRanges = kept(
    (spec.loadBalancerSourceRanges ?? [])
      .map((r) => (typeof r === 'string' ? r.trim() : ''))
      .filter((r) => isValidCIDR(r) && inFamilies(r.slice(0, r.indexOf('/')))),
  );

  const type = spec.type ?? 'ClusterIP';
  const clientIP = spec.sessionAffinity === 'ClientIP';
  const timeout = spec.sessionAffinityConfig?.clientIP?.timeoutSeconds;
  const stickyMaxAgeSeconds =
    clientIP && typeof timeout === 'number' && isInRange(timeout, 1, MAX_STICKY_MAX_AGE_SECONDS)
      ? timeout
      : DEFAULT_STICKY_MAX_AGE_SECONDS;
  const trace = traceMode(svc, service, warn);
  const proxyProtocol = proxyProtocolMode(svc, service, warn);
  // A LoadBalancer is always externally accessible, so this does not depend on the port.
  const hcNodePort =
    type === 'LoadBalancer' && spec.externalTrafficPolicy === 'Local'
      ? healthCheckNodePort(svc, service, warn)
      : 0;

  const out: ServicePort[] = [];
  const keys = new Set<string>();
  for (const p of spec.ports ?? []) {
    const protocol = protocolOf(p, service, warn);
    if (protocol === undefined || !isPort(p.port)) continue;
    const portName = typeof p.name === 'string' ? p.name : '';
    const spn = servicePortName(namespace, name, portName);
    const key = servicePortKey(spn, protocol);
    if (keys.has(key)) {
      warn('Service port skipped: duplicate name and protocol', { service, port: portName, protocol });
      continue;
    }
    keys.add(key);
    const nodePort = isPort(p.nodePort) ? p.nodePort : 0;
    // kube-proxy's per-port ExternallyAccessible, plus the type (a NodePort without one yet still is).
    const externallyAccessible =
      nodePort !== 0 ||
      externalIPs.length > 0 ||
      lbIPs.length > 0 ||
      type === 'NodePort' ||
      type === 'LoadBalancer';
    const externalPolicyLocal = externallyAccessible && spec.externalTrafficPolicy === 'Local';
    out.push({
      key,
      name: spn,
      namespace,
      serviceName: name,
      portName,
      protocol,
      clusterIPs,
      port: p.port,
      nodePort,
      externalIPs,
      loadBalancerIPs: lbIPs,
      loadBalancerSourceRanges: sourceRanges,
      sessionAffinity: clientIP ? 'ClientIP' : 'None',
      stickyMaxAgeSeconds,
      externallyAccessible,
      externalPolicyLocal,
      internalPolicyLocal: spec.internalTrafficPolicy === 'Local',
      healthCheckNodePort: hcNodePort,
      trace,
      proxyProtocol,
    });
  }
  return kept(out);
}

const NONE: readonly never[] = Object.freeze([]);

/**
 * A list that lives as long as its service ports: the shared empty one, else a copy of its length
 * (filter and push leave room for 17 or more: 150 bytes for a list of one, per Service and list).
 */
function kept<T>(list: T[]): readonly T[] {
  return list.length === 0 ? NONE : list.slice();
}

/** Valid cluster IPs, canonical, primary first, at most one per family (spec.clusterIPs, else clusterIP). */
export function clusterIPsOf(svc: Service): readonly string[] {
  const spec = svc.spec;
  const listed =
    spec?.clusterIPs !== undefined && spec.clusterIPs.length > 0 ? spec.clusterIPs : [spec?.clusterIP];
  const out: string[] = [];
  const families = new Set<IPFamily>();
  for (const ip of listed) {
    const family = typeof ip === 'string' ? ipFamilyOf(ip) : undefined;
    if (family === undefined || families.has(family)) continue;
    families.add(family);
    out.push(canonicalIP(ip!));
  }
  return kept(out);
}

/** True when the two lists hold equal service ports in the same order (every field compared). */
export function sameServicePorts(a: readonly ServicePort[], b: readonly ServicePort[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (!sameServicePort(a[i]!, b[i]!)) return false;
  return true;
}

/** True when every field of the two service ports is equal. */
export function sameServicePort(a: ServicePort, b: ServicePort): boolean {
  if (a === b) return true;
  for (const field of Object.keys(a) as (keyof ServicePort)[]) {
    const x = a[field];
    const y = b[field];
    if (Array.isArray(x) && Array.isArray(y) ? !sameList(x, y) : x !== y) return false;
  }
  return Object.keys(a).length === Object.keys(b).length;
}

function isPort(v: unknown): v is number {
  return typeof v === 'number' && isInRange(v, 1, 65535);
}

function isInRange(v: number, min: number, max: number): boolean {
  return Number.isInteger(v) && v >= min && v <= max;
}

function uniqueIPs(ips: readonly unknown[]): string[] {
  const out = new Set<string>();
  for (const ip of ips) if (typeof ip === 'string' && ipFamilyOf(ip) !== undefined) out.add(canonicalIP(ip));
  return [...out];
}

function protocolOf(port: ServicePortSpec, service: string, warn: Warn): Protocol | undefined {
  const protocol = port.protocol ?? 'TCP';
  if (protocol === 'TCP' || protocol === 'UDP') return protocol;
  const why = protocol === 'SCTP' ? 'SCTP is not supported' : 'unknown protocol';
  warn(`Service port skipped: ${why}`, { service, port: port.name ?? '', protocol });
  return undefined;
}

function traceMode(svc: Service, service: string, warn: Warn): TraceMode | undefined {
  const value = svc.metadata?.annotations?.[ANNOTATION_TRACE];
  if (value === undefined) return undefined;
  if (value === 'none' || value === 'connections' || value === 'protocols') return value;
  warn('Ignoring unknown trace annotation value', { service, annotation: ANNOTATION_TRACE, value });
  return undefined;
}

function proxyProtocolMode(svc: Service, service: string, warn: Warn): ProxyProtocolMode | undefined {
  const value = svc.metadata?.annotations?.[ANNOTATION_PROXY_PROTOCOL];
  if (value === undefined) return undefined;
  if (value === 'off' || value === 'v1' || value === 'v2') return value;
  // An endpoint that expects a header would take garbage for one, one that does not would read ours as
  // the request: neither is guessed, the Service is served without.
  warn('Ignoring unknown proxy-protocol annotation value; the Service is served without the header', {
    service,
    annotation: ANNOTATION_PROXY_PROTOCOL,
    value,
  });
  return 'off';
}

function healthCheckNodePort(svc: Service, service: string, warn: Warn): number {
  const port = svc.spec?.healthCheckNodePort;
  if (isPort(port)) return port;
  // kube-proxy logs this as an error and serves no health check for the Service.
  warn('Service has no healthCheckNodePort', { service });
  return 0;
}
