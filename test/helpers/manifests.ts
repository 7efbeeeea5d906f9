// Builders for manifest text (Services and EndpointSlices as the API has them) and a running proxy on a
// manifest, for integration tests.
import { mkdtemp, rename, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { stringify } from 'yaml';
import type { Config } from '../../src/config/config.ts';
import { DEFAULT_CONFIG } from '../../src/config/config.ts';
import { createLogger } from '../../src/lib/log.ts';
import { ProxyServer, type ProxyServerDeps } from '../../src/proxy-server.ts';

export type PortSpec = { name: string; port: number; targetPort: number; protocol?: 'TCP' | 'UDP' };

export function service(
  name: string,
  clusterIP: string,
  ports: PortSpec[],
  extra: {
    namespace?: string;
    sessionAffinity?: 'ClientIP';
    timeoutSeconds?: number;
    nodePort?: number;
  } = {},
) {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name, namespace: extra.namespace ?? 'default' },
    spec: {
      clusterIP,
      clusterIPs: [clusterIP],
      ports: ports.map((p) => ({
        name: p.name,
        port: p.port,
        targetPort: p.targetPort,
        protocol: p.protocol ?? 'TCP',
      })),
      ...(extra.sessionAffinity
        ? {
            sessionAffinity: extra.sessionAffinity,
            sessionAffinityConfig: { clientIP: { timeoutSeconds: extra.timeoutSeconds ?? 10800 } },
          }
        : {}),
    },
  };
}

/** A port of dualStackService: `protocol` TCP unless given. */
export type ApiPort = {
  name: string;
  port: number;
  targetPort: number;
  protocol?: 'TCP' | 'UDP';
  nodePort?: number;
};

/**
 * A Service as the API has it with every cluster IP (primary first), its families and family policy;
 * `spec`/`status` merged over the defaults.
 */
export function dualStackService(
  name: string,
  clusterIPs: string[],
  ports: ApiPort[],
  spec: object = {},
  status?: object,
) {
  const base = service(name, clusterIPs[0]!, ports);
  return {
    ...base,
    spec: {
      ...base.spec,
      clusterIPs,
      ipFamilies: clusterIPs.map((ip) => (ip.includes(':') ? 'IPv6' : 'IPv4')),
      ipFamilyPolicy: clusterIPs.length > 1 ? 'RequireDualStack' : 'SingleStack',
      ports: ports.map((p) => ({ protocol: 'TCP', ...p })),
      ...spec,
    },
    ...(status ? { status } : {}),
  };
}

export function slice(
  serviceName: string,
  name: string,
  endpoints: { ip: string; ready?: boolean; serving?: boolean; terminating?: boolean }[],
  ports: { name: string; port: number; protocol?: 'TCP' | 'UDP' }[],
  namespace = 'default',
) {
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: { name, namespace, labels: { 'kubernetes.io/service-name': serviceName } },
    addressType: 'IPv4',
    ports: ports.map((p) => ({ name: p.name, port: p.port, protocol: p.protocol ?? 'TCP' })),
    endpoints: endpoints.map((e) => ({
      addresses: [e.ip],
      conditions: { ready: e.ready ?? true, serving: e.serving ?? true, terminating: e.terminating ?? false },
    })),
  };
}

export function toYaml(objects: unknown[]): string {
  return objects.map((o) => stringify(o)).join('---\n');
}

export type ManifestProxy = {
  server: ProxyServer;
  file: string;
  logs: string[];
  /** Replaces the manifest the way editors do: write a new file, rename it over the old one. */
  write(objects: unknown[] | string): Promise<void>;
  /** The proxy port of `ns/name:port/PROTO`, once it is open. */
  proxyPort(key: string): number | undefined;
  close(): Promise<void>;
};

/** Starts a ProxyServer (no iptables, servers on ephemeral loopback ports) on a manifest in a temp dir. */
export async function startManifestProxy(
  objects: unknown[],
  overrides: Partial<Config> = {},
  deps: Omit<ProxyServerDeps, 'log'> = {},
): Promise<ManifestProxy> {
  const dir = await mkdtemp(join(tmpdir(), 'kup-manifest-'));
  const file = join(dir, 'services.yaml');
  let n = 0;
  const write = async (content: unknown[] | string) => {
    const tmp = join(dir, `.services.yaml.${n++}`);
    await writeFile(tmp, typeof content === 'string' ? content : toYaml(content));
    await rename(tmp, file);
  };
  await write(objects);
  const logs: string[] = [];
  const destination = new Writable({
    write(chunk, _enc, cb) {
      logs.push(chunk.toString());
      cb();
    },
  });
  const config: Config = {
    ...DEFAULT_CONFIG,
    // In this process: one relaying process (the worker mode has tests of its own).
    workers: 1,
    manifest: file,
    iptables: false,
    hostnameOverride: 'node-1',
    healthzBindAddress: '127.0.0.1:0',
    metricsBindAddress: '127.0.0.1:0',
    bindAddress: '127.0.0.1',
    iptablesMinSyncPeriodMs: 0,
    ...overrides,
  };
  const server = new ProxyServer(config, { ...deps, log: createLogger({ level: 'debug', destination }) });
  await server.start();
  return {
    server,
    file,
    logs,
    write,
    proxyPort: (key) => server.proxier.get(key as never)?.proxyPort,
    close: async () => {
      await server.close();
      await rm(dir, { recursive: true, force: true });
    },
  };
}
