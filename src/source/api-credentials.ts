// Where the API server is and how to authenticate to it, resolved as kube-proxy's kubeconfig loading
// (client-node's loadFromDefault) resolves it: the --kubeconfig file, else KUBECONFIG, ~/.kube/config, the
// in-cluster service account, else http://localhost:8080; --master replaces the server URL. A kubeconfig
// file is client-node's to read (kubeconfig-credentials.ts, imported only then: loading client-node is
// ~0.4 s of the start and ~25 MB of heap). The service account and the default are a token file, a CA
// file and a URL, read here exactly as client-node reads them.
import { accessSync, readFileSync } from 'node:fs';
import { isIPv6 } from 'node:net';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { Agent } from 'undici';
import type { ApiCredentials } from './api-session.ts';

export const SERVICE_ACCOUNT_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';
/** client-node's FileAuth rereads the token file after this long (as client-go). */
const TOKEN_REREAD_MS = 60_000;

export type KubeConfigOptions = { kubeconfig?: string; master?: string };

/** What the options and the environment resolve to; `kubeconfig`: a file, read by client-node. */
export type CredentialSource =
  | { kind: 'kubeconfig' }
  | { kind: 'in-cluster'; server: string; skipTLSVerify: boolean; caFile: string; tokenFile: string }
  | { kind: 'default'; server: string; skipTLSVerify: boolean };

/** What the resolution looks at. */
export type Environment = {
  env: Record<string, string | undefined>;
  platform: string;
  /** os.homedir(): its .kube/config is checked before client-node's loadFromDefault (api-session). */
  homedir: string;
  serviceAccountDir: string;
  exists(path: string): boolean;
};

/**
 * Decides, without reading any file's content, where the credentials come from (pure but for `exists`).
 * Any kubeconfig file that would be read, or Windows (client-node asks WSL), goes to client-node.
 */
export function resolveCredentialSource(
  options: KubeConfigOptions,
  environment: Environment,
): CredentialSource {
  const { env, exists } = environment;
  if (options.kubeconfig || environment.platform === 'win32' || env.KUBECONFIG) return { kind: 'kubeconfig' };
  if (exists(join(environment.homedir, '.kube', 'config'))) return { kind: 'kubeconfig' };
  const home = env.HOME;
  if (home && exists(home) && exists(join(home, '.kube', 'config'))) return { kind: 'kubeconfig' };
  const dir = environment.serviceAccountDir;
  if (exists(`${dir}/token`)) {
    // client-node's loadFromCluster: http only on the ports kubectl proxy and insecure servers use.
    const host = env.KUBERNETES_SERVICE_HOST;
    const port = env.KUBERNETES_SERVICE_PORT;
    const scheme = port === '80' || port === '8080' || port === '8001' ? 'http' : 'https';
    const serverHost = host && isIPv6(host) ? `[${host}]` : host;
    const server = options.master || `${scheme}://${serverHost}:${port}`;
    return {
      kind: 'in-cluster',
      server,
      skipTLSVerify: isPlain(server),
      caFile: `${dir}/ca.crt`,
      tokenFile: `${dir}/token`,
    };
  }
  const server = options.master || 'http://localhost:8080';
  return { kind: 'default', server, skipTLSVerify: isPlain(server) };
}

/**
 * client-node refuses http:// unless insecure-skip-tls-verify is set; client-go just talks plain HTTP
 * (there is no certificate to verify), and `--master http://127.0.0.1:8080` must keep working.
 */
function isPlain(server: string): boolean {
  return server.startsWith('http:');
}

export type FileReader = (path: string) => Buffer;

/**
 * The in-cluster or default credentials, as client-node computes them: the CA file read for each
 * request, the token file reread after 60 s (an empty token sends no Authorization), a dispatcher only
 * when there are TLS options.
 */
export function builtInCredentials(
  source: Exclude<CredentialSource, { kind: 'kubeconfig' }>,
  deps: { readFile: FileReader; nowMs: () => number },
): ApiCredentials {
  const server = source.server.replace(/\/+$/, '');
  let token: string | undefined;
  let readAt = 0;
  return {
    async authenticate() {
      const connect: { ca?: Buffer; rejectUnauthorized?: boolean } = {};
      if (source.skipTLSVerify) connect.rejectUnauthorized = false;
      if (source.kind === 'in-cluster') connect.ca = deps.readFile(source.caFile);
      const headers: Record<string, string> = {};
      if (source.kind === 'in-cluster') {
        const now = deps.nowMs();
        if (token === undefined || now - readAt > TOKEN_REREAD_MS) {
          token = deps.readFile(source.tokenFile).toString('utf-8');
          readAt = now;
        }
        if (token) headers.Authorization = `Bearer ${token}`;
      }
      const tls = connect.ca !== undefined || connect.rejectUnauthorized !== undefined;
      const dispatcher = tls
        ? new Agent({ connect: { ...connect, keepAlive: true, keepAliveInitialDelay: 30_000 } })
        : undefined;
      return { server, headers, dispatcher };
    },
  };
}

function exists(path: string): boolean {
  try {
    accessSync(path);
    return true;
  } catch {
    return false;
  }
}

/** This process's environment, as client-node would see it. */
export function processEnvironment(): Environment {
  return {
    env: process.env,
    platform: process.platform,
    homedir: homedir(),
    serviceAccountDir: SERVICE_ACCOUNT_DIR,
    exists,
  };
}

/**
 * The credentials for `options`: a kubeconfig file through client-node (loaded now, on demand), else the
 * service account or the default. Throws when a named file cannot be read or parsed.
 */
export async function loadApiCredentials(
  options: KubeConfigOptions,
  environment: Environment = processEnvironment(),
): Promise<ApiCredentials> {
  const source = resolveCredentialSource(options, environment);
  if (source.kind !== 'kubeconfig')
    return builtInCredentials(source, { readFile: (p) => readFileSync(p), nowMs: Date.now });
  const { loadKubeConfig, kubeConfigCredentials } = await import('./kubeconfig-credentials.ts');
  return kubeConfigCredentials(loadKubeConfig(options));
}
