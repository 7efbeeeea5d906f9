// Structural checks of the API objects we read (Service, EndpointSlice, Node), before any of their
// fields is trusted. Pure: no I/O. An 'error' problem means "skip this object"; a 'warning' means
// "this entry will be ignored". Paths are relative to the object; callers prefix them.
import { canonicalIP, type IPFamily, ipFamilyOf, isValidCIDR, isValidIP } from '../lib/ip.ts';
import { LABEL_SERVICE_NAME } from '../lib/kubernetes-labels.ts';

export type ProblemPath = (string | number)[];

export type Problem = { path: ProblemPath; message: string; severity: 'error' | 'warning' };

/** `spec.ports[0].port`: a path as the user would write it in a manifest. */
export function formatPath(path: ProblemPath): string {
  let out = '';
  for (const part of path) {
    if (typeof part === 'number') out += `[${part}]`;
    else out += out === '' ? part : `.${part}`;
  }
  return out === '' ? '(object)' : out;
}

/** `spec.ports[0].port: must be ... (error)`, one line per problem, for logs. */
export function formatProblem(problem: Problem): string {
  return `${formatPath(problem.path)}: ${problem.message} (${problem.severity})`;
}

/** True when any problem is an error: the object must be skipped as a whole. */
export function hasErrors(problems: readonly Problem[]): boolean {
  return problems.some((p) => p.severity === 'error');
}

/** Problems of a Service object (v1). Unknown fields are ignored. */
export function validateService(obj: unknown): Problem[] {
  const c = new Checker();
  const root = c.object(obj, [], true);
  if (root === undefined) return c.problems;
  c.metadata(root['metadata'], ['metadata'], true);
  const spec = c.object(root['spec'], ['spec'], false);
  if (spec !== undefined) validateServiceSpec(c, spec);
  const status = c.object(root['status'], ['status'], false);
  const lb = status && c.object(status['loadBalancer'], ['status', 'loadBalancer'], false);
  const ingress = lb && c.array(lb['ingress'], ['status', 'loadBalancer', 'ingress']);
  for (const [i, item] of (ingress ?? []).entries()) {
    const path = ['status', 'loadBalancer', 'ingress', i];
    const ing = c.object(item, path, true);
    if (ing === undefined) continue;
    const ip = c.string(ing['ip'], [...path, 'ip']);
    if (ip !== undefined && ip !== '' && !isValidIP(ip)) c.warn([...path, 'ip'], 'not a valid IP; ignored');
    c.string(ing['hostname'], [...path, 'hostname']);
    const mode = c.string(ing['ipMode'], [...path, 'ipMode']);
    if (mode !== undefined && mode !== 'VIP' && mode !== 'Proxy')
      c.warn([...path, 'ipMode'], `unknown ipMode "${mode}"; ingress IP ignored`);
  }
  return c.problems;
}

const SERVICE_TYPES = new Set(['ClusterIP', 'NodePort', 'LoadBalancer', 'ExternalName']);
const PROTOCOLS = new Set(['TCP', 'UDP', 'SCTP']);

function validateServiceSpec(c: Checker, spec: Record<string, unknown>): void {
  const type = c.string(spec['type'], ['spec', 'type']);
  if (type !== undefined && !SERVICE_TYPES.has(type))
    c.warn(['spec', 'type'], `unknown type "${type}"; treated as ClusterIP`);
  const clusterIP = c.string(spec['clusterIP'], ['spec', 'clusterIP']);
  if (clusterIP !== undefined && clusterIP !== '' && clusterIP !== 'None' && !isValidIP(clusterIP))
    c.error(['spec', 'clusterIP'], 'must be a valid IP, "None" or empty');
  const clusterIPs = c.stringArray(spec['clusterIPs'], ['spec', 'clusterIPs']);
  if (clusterIPs !== undefined) validateClusterIPs(c, clusterIPs, clusterIP);
  for (const [i, f] of (c.stringArray(spec['ipFamilies'], ['spec', 'ipFamilies']) ?? []).entries())
    if (f !== 'IPv4' && f !== 'IPv6') c.warn(['spec', 'ipFamilies', i], `unknown IP family "${f}"`);
  c.string(spec['ipFamilyPolicy'], ['spec', 'ipFamilyPolicy']);

  const ports = c.array(spec['ports'], ['spec', 'ports']);
  const seen = new Set<string>();
  for (const [i, item] of (ports ?? []).entries()) {
    const path = ['spec', 'ports', i];
    const port = c.object(item, path, true);
    if (port === undefined) continue;
    const name = c.portName(port['name'], [...path, 'name']) ?? '';
    const protocol = c.string(port['protocol'], [...path, 'protocol']) ?? 'TCP';
    if (!PROTOCOLS.has(protocol))
      c.warn([...path, 'protocol'], `unsupported protocol "${protocol}"; port ignored`);
    c.integer(port['port'], [...path, 'port'], 1, 65535, true);
    c.integer(port['nodePort'], [...path, 'nodePort'], 0, 65535, false);
    const id = `${name}/${protocol}`;
    if (seen.has(id)) c.error(path, `duplicate port name "${name}" for protocol ${protocol}`);
    seen.add(id);
  }

  for (const [i, ip] of (c.stringArray(spec['externalIPs'], ['spec', 'externalIPs']) ?? []).entries())
    if (!isValidIP(ip)) c.warn(['spec', 'externalIPs', i], 'not a valid IP; ignored');
  const ranges = c.stringArray(spec['loadBalancerSourceRanges'], ['spec', 'loadBalancerSourceRanges']);
  for (const [i, cidr] of (ranges ?? []).entries())
    if (!isValidCIDR(cidr.trim()))
      c.warn(['spec', 'loadBalancerSourceRanges', i], 'not a valid CIDR; ignored');

  const affinity = c.string(spec['sessionAffinity'], ['spec', 'sessionAffinity']);
  if (affinity !== undefined && affinity !== 'None' && affinity !== 'ClientIP')
    c.error(['spec', 'sessionAffinity'], 'must be "None" or "ClientIP"');
  const config = c.object(spec['sessionAffinityConfig'], ['spec', 'sessionAffinityConfig'], false);
  const clientIP =
    config && c.object(config['clientIP'], ['spec', 'sessionAffinityConfig', 'clientIP'], false);
  if (clientIP !== undefined) {
    const path = ['spec', 'sessionAffinityConfig', 'clientIP', 'timeoutSeconds'];
    c.integer(clientIP['timeoutSeconds'], path, 1, 86400, false);
  }
  for (const field of ['externalTrafficPolicy', 'internalTrafficPolicy']) {
    const policy = c.string(spec[field], ['spec', field]);
    if (policy !== undefined && policy !== 'Cluster' && policy !== 'Local')
      c.warn(['spec', field], `unknown policy "${policy}"; treated as Cluster`);
  }
  c.integer(spec['healthCheckNodePort'], ['spec', 'healthCheckNodePort'], 0, 65535, false);
  c.string(spec['externalName'], ['spec', 'externalName']);
}

function validateClusterIPs(c: Checker, ips: string[], clusterIP: string | undefined): void {
  const families = new Set<IPFamily>();
  for (const [i, ip] of ips.entries()) {
    const family = ipFamilyOf(ip);
    if (ip === 'None' && ips.length === 1) continue;
    if (family === undefined) c.error(['spec', 'clusterIPs', i], 'must be a valid IP (or a single "None")');
    else if (families.has(family)) c.error(['spec', 'clusterIPs', i], `a second ${family} cluster IP`);
    else families.add(family);
  }
  if (ips.length > 2) c.error(['spec', 'clusterIPs'], 'at most two cluster IPs (one per family)');
  const first = ips[0];
  if (first !== undefined && clusterIP !== undefined && clusterIP !== '' && !sameIP(first, clusterIP))
    c.error(['spec', 'clusterIPs', 0], 'must equal spec.clusterIP');
}

function sameIP(a: string, b: string): boolean {
  return a === b || (isValidIP(a) && isValidIP(b) && canonicalIP(a) === canonicalIP(b));
}

/** Problems of a discovery.k8s.io/v1 EndpointSlice object. Unknown fields are ignored. */
export function validateEndpointSlice(obj: unknown): Problem[] {
  const c = new Checker();
  const root = c.object(obj, [], true);
  if (root === undefined) return c.problems;
  const meta = c.metadata(root['metadata'], ['metadata'], true);
  const serviceName = meta?.labels?.[LABEL_SERVICE_NAME];
  if (serviceName !== undefined && serviceName !== '' && !DNS_SUBDOMAIN.test(serviceName))
    c.error(['metadata', 'labels', LABEL_SERVICE_NAME], 'must be a valid Service name');
  const addressType = c.string(root['addressType'], ['addressType']);
  if (addressType === undefined) c.error(['addressType'], 'required');
  else if (addressType !== 'IPv4' && addressType !== 'IPv6' && addressType !== 'FQDN')
    c.error(['addressType'], 'must be "IPv4", "IPv6" or "FQDN"');
  const family = addressType === 'IPv4' || addressType === 'IPv6' ? addressType : undefined;

  for (const [i, item] of (c.array(root['endpoints'], ['endpoints']) ?? []).entries()) {
    const path = ['endpoints', i];
    const ep = c.object(item, path, true);
    if (ep === undefined) continue;
    const addresses = c.stringArray(ep['addresses'], [...path, 'addresses']);
    for (const [j, address] of (addresses ?? []).entries()) {
      if (family !== undefined && ipFamilyOf(address) !== family)
        c.warn([...path, 'addresses', j], `not a valid ${family} address; ignored`);
    }
    const conditions = c.object(ep['conditions'], [...path, 'conditions'], false);
    for (const cond of ['ready', 'serving', 'terminating'])
      if (conditions !== undefined) c.boolean(conditions[cond], [...path, 'conditions', cond]);
    c.string(ep['nodeName'], [...path, 'nodeName']);
    c.string(ep['zone'], [...path, 'zone']);
    const hints = c.object(ep['hints'], [...path, 'hints'], false);
    for (const kind of ['forZones', 'forNodes']) {
      for (const [j, hint] of (hints && c.array(hints[kind], [...path, 'hints', kind]))?.entries() ?? []) {
        const h = c.object(hint, [...path, 'hints', kind, j], true);
        if (h !== undefined) c.string(h['name'], [...path, 'hints', kind, j, 'name']);
      }
    }
  }

  for (const [i, item] of (c.array(root['ports'], ['ports']) ?? []).entries()) {
    const path = ['ports', i];
    const port = c.object(item, path, true);
    if (port === undefined) continue;
    c.portName(port['name'], [...path, 'name']);
    const protocol = c.string(port['protocol'], [...path, 'protocol']);
    if (protocol !== undefined && !PROTOCOLS.has(protocol))
      c.warn([...path, 'protocol'], `unsupported protocol "${protocol}"; port ignored`);
    if (c.integer(port['port'], [...path, 'port'], 0, 65535, false) === 0)
      c.warn([...path, 'port'], 'port 0; ignored');
  }
  return c.problems;
}

/** Problems of a v1 Node object (we read its name and labels). */
export function validateNode(obj: unknown): Problem[] {
  const c = new Checker();
  const root = c.object(obj, [], true);
  if (root !== undefined) c.metadata(root['metadata'], ['metadata'], false);
  return c.problems;
}

const DNS_SUBDOMAIN = /^(?=.{1,253}$)[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*$/;
const DNS_LABEL = /^(?=.{1,63}$)[a-z0-9](?:[-a-z0-9]*[a-z0-9])?$/;

type Metadata = { labels?: Record<string, string> };

// Collects problems while reading fields; each reader returns the value only when it has the right type.
class Checker {
  readonly problems: Problem[] = [];

  error(path: ProblemPath, message: string): void {
    this.problems.push({ path, message, severity: 'error' });
  }

  warn(path: ProblemPath, message: string): void {
    this.problems.push({ path, message, severity: 'warning' });
  }

  object(v: unknown, path: ProblemPath, required: boolean): Record<string, unknown> | undefined {
    if (v === undefined || v === null) {
      if (required) this.error(path, 'required');
      return undefined;
    }
    if (typeof v === 'object' && !Array.isArray(v)) return v as Record<string, unknown>;
    this.error(path, 'must be an object');
    return undefined;
  }

  array(v: unknown, path: ProblemPath): unknown[] | undefined {
    if (v === undefined || v === null) return undefined;
    if (Array.isArray(v)) return v;
    this.error(path, 'must be an array');
    return undefined;
  }

  string(v: unknown, path: ProblemPath): string | undefined {
    if (v === undefined || v === null) return undefined;
    if (typeof v === 'string') return v;
    this.error(path, 'must be a string');
    return undefined;
  }

  boolean(v: unknown, path: ProblemPath): boolean | undefined {
    if (v === undefined || v === null) return undefined;
    if (typeof v === 'boolean') return v;
    this.error(path, 'must be a boolean');
    return undefined;
  }

  stringArray(v: unknown, path: ProblemPath): string[] | undefined {
    const items = this.array(v, path);
    if (items === undefined) return undefined;
    const out: string[] = [];
    for (const [i, item] of items.entries()) {
      if (typeof item === 'string') out.push(item);
      else this.error([...path, i], 'must be a string');
    }
    return out;
  }

  integer(v: unknown, path: ProblemPath, min: number, max: number, required: boolean): number | undefined {
    if (v === undefined || v === null) {
      if (required) this.error(path, 'required');
      return undefined;
    }
    if (typeof v !== 'number' || !Number.isInteger(v)) this.error(path, 'must be an integer');
    else if (v < min || v > max) this.error(path, `must be between ${min} and ${max}`);
    else return v;
    return undefined;
  }

  portName(v: unknown, path: ProblemPath): string | undefined {
    const name = this.string(v, path);
    if (name !== undefined && name !== '' && !DNS_LABEL.test(name))
      this.error(path, 'must be a DNS label (lower-case letters, digits and "-", at most 63)');
    return name;
  }

  stringMap(v: unknown, path: ProblemPath): Record<string, string> | undefined {
    const map = this.object(v, path, false);
    if (map === undefined) return undefined;
    const out: Record<string, string> = {};
    for (const [key, value] of Object.entries(map)) {
      if (typeof value === 'string') out[key] = value;
      else this.error([...path, key], 'must be a string');
    }
    return out;
  }

  metadata(v: unknown, path: ProblemPath, namespaced: boolean): Metadata | undefined {
    const meta = this.object(v, path, true);
    if (meta === undefined) return undefined;
    for (const field of namespaced ? ['name', 'namespace'] : ['name']) {
      const value = meta[field];
      if (value === undefined || value === null || value === '') this.error([...path, field], 'required');
      else if (typeof value !== 'string') this.error([...path, field], 'must be a string');
      else if (!DNS_SUBDOMAIN.test(value))
        this.error([...path, field], 'must be a DNS subdomain (lower-case letters, digits, "-" and ".")');
    }
    this.stringMap(meta['annotations'], [...path, 'annotations']);
    const labels = this.stringMap(meta['labels'], [...path, 'labels']);
    return labels === undefined ? {} : { labels };
  }
}
