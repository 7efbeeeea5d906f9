// A kubeconfig file, read by client-node as kube-proxy reads it (every auth form: tokens, client
// certificates, exec, OIDC and the cloud providers). Imported only when a kubeconfig file is in play:
// client-node costs ~0.4 s and ~25 MB of heap to load, which the in-cluster and no-kubeconfig starts
// skip (api-credentials.ts).
import { homedir } from 'node:os';
import { delimiter, join } from 'node:path';
import { HttpMethod, KubeConfig, RequestContext } from '@kubernetes/client-node';
import { readRegularFileSync } from '../lib/read-regular-file.ts';
import { readYaml } from '../lib/safe-yaml.ts';
import { linePosition } from '../lib/text-position.ts';
import type { ApiCredentials } from './api-session.ts';

/**
 * Loads the kubeconfig as kube-proxy does: the `--kubeconfig` file, else KUBECONFIG, ~/.kube/config or
 * the in-cluster service account (client-node's loadFromDefault); `--master` replaces the server URL of
 * the current cluster. Throws when a named file cannot be read or parsed.
 */
export function loadKubeConfig(options: { kubeconfig?: string; master?: string }): KubeConfig {
  const kc = new KubeConfig();
  if (options.kubeconfig) {
    checkKubeconfigFile(options.kubeconfig);
    kc.loadFromFile(options.kubeconfig);
  } else {
    const fromEnv = process.env.KUBECONFIG;
    const files = fromEnv ? fromEnv.split(delimiter).filter(Boolean) : [join(homedir(), '.kube', 'config')];
    for (const file of files) checkKubeconfigFile(file, { optional: true });
    kc.loadFromDefault();
  }
  const master = options.master;
  if (master) {
    const current = kc.getCurrentCluster();
    if (current === null) {
      kc.loadFromClusterAndUser({ name: 'master', server: master, skipTLSVerify: false }, { name: 'master' });
    } else {
      kc.clusters = kc.clusters.map((c) => (c === current ? { ...c, server: master } : c));
    }
  }
  // client-node refuses http:// unless insecure-skip-tls-verify is set; client-go just talks plain HTTP
  // (there is no certificate to verify), and `--master http://127.0.0.1:8080` must keep working.
  const current = kc.getCurrentCluster();
  if (current?.server.startsWith('http:') && !current.skipTLSVerify) {
    kc.clusters = kc.clusters.map((c) => (c === current ? { ...c, skipTLSVerify: true } : c));
  }
  return kc;
}

/**
 * Reads a kubeconfig file as the manifest is read before client-node does (whose js-yaml load has no
 * limits): only a regular file (a FIFO would block the start for good), opened non-blocking, and YAML
 * within the alias and nesting limits (a 700-byte alias bomb would freeze it). Throws naming file:line:col.
 * `optional`: a file that does not exist is client-node's to skip.
 */
function checkKubeconfigFile(file: string, options: { optional?: boolean } = {}): void {
  let text: string;
  try {
    text = readRegularFileSync(file).toString('utf8');
  } catch (err) {
    if (options.optional && (err as NodeJS.ErrnoException).code === 'ENOENT') return;
    throw new Error(`kubeconfig ${file}: ${(err as Error).message}`, { cause: err });
  }
  const read = readYaml(text);
  if (read.error === undefined) return;
  const { line, col } = linePosition(text, read.error.offset);
  throw new Error(`kubeconfig ${file}:${line}:${col}: ${read.error.message}`);
}

/** The credentials of the kubeconfig's current context, computed by client-node for each request. */
export function kubeConfigCredentials(kc: KubeConfig): ApiCredentials {
  return {
    async authenticate() {
      const cluster = kc.getCurrentCluster();
      if (cluster === null) throw new Error('the kubeconfig has no current cluster');
      const server = cluster.server.replace(/\/+$/, '');
      const ctx = new RequestContext(server, HttpMethod.GET);
      await kc.applySecurityAuthentication(ctx);
      return { server, headers: ctx.getHeaders(), dispatcher: ctx.getDispatcher() };
    },
  };
}
