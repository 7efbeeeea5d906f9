// A session with the API server: the kubeconfig (loaded as kube-proxy does), and for each request fresh
// auth headers and a dispatcher computed by client-node, so rotated tokens and certificates are picked up;
// the API server's errors and JSON bodies. Holds no state between requests.
import { HttpMethod, KubeConfig, RequestContext } from '@kubernetes/client-node';
import { Agent, type Dispatcher, type Response } from 'undici';
import { VERSION } from '../lib/version.ts';

/**
 * Loads the kubeconfig as kube-proxy does: the `--kubeconfig` file, else KUBECONFIG, ~/.kube/config or
 * the in-cluster service account (client-node's loadFromDefault); `--master` replaces the server URL of
 * the current cluster. Throws when a named file cannot be read or parsed.
 */
export function loadKubeConfig(options: { kubeconfig?: string; master?: string }): KubeConfig {
  const kc = new KubeConfig();
  if (options.kubeconfig) kc.loadFromFile(options.kubeconfig);
  else kc.loadFromDefault();
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

/** An HTTP status from the API server, or the `code` of a watch ERROR event. */
export class ApiError extends Error {
  readonly statusCode: number;
  constructor(statusCode: number, message: string) {
    super(message);
    this.name = 'ApiError';
    this.statusCode = statusCode;
  }
}

/** Query parameters; undefined ones are left out. */
export type Query = Record<string, string | number | undefined>;
/** One request's credentials: build a URL, the fetch init (auth headers, TLS dispatcher, signal). */
export type Session = {
  url(path: string, query: Query): URL;
  init(signal: AbortSignal): { headers: Record<string, string>; dispatcher: Dispatcher; signal: AbortSignal };
  dispatcher: Dispatcher;
};

const USER_AGENT = `kube-userspace-proxy/${VERSION}`;

/**
 * Auth headers and a dispatcher (TLS material, proxy) for the current context, computed afresh by
 * client-node for each list or watch, so rotated tokens and certificates are picked up.
 */
export async function openSession(kc: KubeConfig): Promise<Session> {
  const cluster = kc.getCurrentCluster();
  if (cluster === null) throw new Error('the kubeconfig has no current cluster');
  const base = cluster.server.replace(/\/+$/, '');
  const ctx = new RequestContext(base, HttpMethod.GET);
  await kc.applySecurityAuthentication(ctx);
  const headers = { ...ctx.getHeaders(), Accept: 'application/json', 'User-Agent': USER_AGENT };
  // Without TLS options client-node leaves the global dispatcher; ours can be destroyed at the end.
  const dispatcher =
    ctx.getDispatcher() ?? new Agent({ connect: { keepAlive: true, keepAliveInitialDelay: 30_000 } });
  return {
    url(path, query) {
      const url = new URL(base + path);
      for (const [k, v] of Object.entries(query)) if (v !== undefined) url.searchParams.set(k, String(v));
      return url;
    },
    init: (signal) => ({ headers, dispatcher, signal }),
    dispatcher,
  };
}

/** The API server's Status message for a failed response, as an ApiError with the HTTP status. */
export async function apiError(res: Response): Promise<ApiError> {
  let message = res.statusText || `HTTP ${res.status}`;
  try {
    const text = await res.text();
    const status: unknown = JSON.parse(text);
    if (isRecord(status) && typeof status.message === 'string') message = status.message;
  } catch {
    // Not a Status body: the status line says enough.
  }
  return new ApiError(res.status, `${res.status}: ${truncate(message)}`);
}

/** The body as JSON, touching the watchdog for every chunk (a large list takes a while). */
export async function readJson(res: Response, touch: () => void): Promise<unknown> {
  if (res.body === null) return undefined;
  const chunks: Uint8Array[] = [];
  for await (const chunk of res.body) {
    touch();
    chunks.push(chunk);
  }
  return JSON.parse(Buffer.concat(chunks).toString('utf8'));
}

/** A JSON object (not null, not an array). */
export function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** A message or an object's text, cut for a log line. */
export function truncate(text: string, max = 200): string {
  return text.length > max ? `${text.slice(0, max)}…` : text;
}
