// A session with the API server: for each list or watch the credentials' auth headers and dispatcher,
// taken afresh so rotated tokens and certificates are picked up; requests whose failures name their URL,
// the API server's errors, and JSON bodies read within a bound. Holds no state between requests.
import { Agent, type Dispatcher, fetch, type Response } from 'undici';
import { ProxyError } from '../lib/errors.ts';
import { jsonSafe } from '../lib/printable.ts';
import { VERSION } from '../lib/version.ts';
import { JsonValueCounter } from './json-values.ts';

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
 * What a kubeconfig resolves to: the API server's URL and, for each list or watch, auth headers and a
 * dispatcher (TLS material, proxy) computed afresh, so rotated tokens and certificates are picked up.
 * client-node computes them for a kubeconfig file (kubeconfig-credentials.ts); the in-cluster service
 * account and the no-kubeconfig default are ours (api-credentials.ts).
 */
export interface ApiCredentials {
  /**
   * For one list or watch: the server URL (no trailing /), headers, and a dispatcher (undefined: no TLS
   * options, a plain keep-alive Agent). Throws when the kubeconfig names no current cluster.
   */
  authenticate(): Promise<{
    server: string;
    headers: Record<string, string>;
    dispatcher: Dispatcher | undefined;
  }>;
}

/** A session for one list or watch: the credentials' headers and dispatcher, taken now. */
export async function openSession(credentials: ApiCredentials): Promise<Session> {
  const auth = await credentials.authenticate();
  const base = auth.server;
  const headers = { ...auth.headers, Accept: 'application/json', 'User-Agent': USER_AGENT };
  // Without TLS options there is no dispatcher of the credentials'; ours can be destroyed at the end.
  const dispatcher =
    auth.dispatcher ?? new Agent({ connect: { keepAlive: true, keepAliveInitialDelay: 30_000 } });
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

/** What an error body is read for (a Status, a proxy's page): the rest is left unread. */
const MAX_ERROR_BODY_BYTES = 64 * 1024;

/** The URL as errors name it: scheme, host, port and path (the query can hold a long continue token). */
export function describeUrl(url: URL): string {
  return `${url.origin}${url.pathname}`;
}

/**
 * GET `url` with the session's credentials. A request that gets no HTTP answer (refused, reset, a TLS
 * mismatch) fails with KUP_ERR_API_REQUEST naming the URL; our own aborts pass through as they are.
 */
export async function get(session: Session, url: URL, signal: AbortSignal): Promise<Response> {
  try {
    return await fetch(url, session.init(signal));
  } catch (err) {
    if (signal.aborted) throw err;
    // undici's TypeError('fetch failed') says nothing; its cause says what happened.
    const cause = err instanceof Error && err.cause instanceof Error ? err.cause : err;
    const message = cause instanceof Error ? cause.message : String(cause);
    throw new ProxyError(
      'KUP_ERR_API_REQUEST',
      `GET ${describeUrl(url)}: ${truncate(message)}${schemeHint(url, cause)}`,
      { cause },
    );
  }
}

/** A hint when the failure looks like a scheme that does not match the server (TLS vs plain HTTP). */
function schemeHint(url: URL, cause: unknown): string {
  const code = String((cause as { code?: unknown } | null)?.code ?? '');
  if (url.protocol === 'https:' && code.startsWith('ERR_SSL_')) {
    return ' (the answer is not TLS: a plain HTTP server? check the scheme of the server URL)';
  }
  if (url.protocol === 'http:' && (code === 'UND_ERR_SOCKET' || code.startsWith('HPE_'))) {
    return ' (no HTTP answer: a TLS server? check the scheme of the server URL)';
  }
  return '';
}

/** True when the answer is JSON, or says nothing of its type (then we take what we asked for). */
export function isJsonAnswer(res: Response): boolean {
  const type = res.headers.get('content-type');
  if (type === null || type.trim() === '') return true;
  const media = (type.split(';')[0] ?? '').trim().toLowerCase();
  return media === 'application/json' || media.endsWith('+json');
}

/**
 * The API server's Status message for a failed response, as an ApiError with the HTTP status and the URL;
 * for an answer that is not JSON (a proxy's HTML page), its type and the start of its text.
 */
export async function apiError(res: Response, url: URL): Promise<ApiError> {
  const text = await readText(res, MAX_ERROR_BODY_BYTES).catch(() => '');
  let message = res.statusText || `HTTP ${res.status}`;
  if (isJsonAnswer(res)) {
    try {
      const status: unknown = JSON.parse(text);
      if (isRecord(status) && typeof status.message === 'string') message = status.message;
    } catch {
      // Not a Status body: the status line says enough.
    }
  } else {
    message = `${message} (${contentType(res)}: ${snippet(text)})`;
  }
  return new ApiError(res.status, `GET ${describeUrl(url)}: ${res.status}: ${truncate(message, 400)}`);
}

/** A 200 answer that is not JSON (a proxy's or a web server's page): KUP_ERR_API_RESPONSE naming the URL. */
export async function notJsonError(res: Response, url: URL): Promise<ProxyError> {
  const text = await readText(res, MAX_ERROR_BODY_BYTES).catch(() => '');
  return new ProxyError(
    'KUP_ERR_API_RESPONSE',
    `GET ${describeUrl(url)}: answered ${contentType(res)}, not JSON (not the API server? a proxy in front of it?): ${snippet(text)}`,
  );
}

/** What readJson reads of one body at most, and the error it fails with past it. */
export type BodyBounds = {
  maxBytes: number;
  /** Values the body may begin (JsonValueCounter), counted as it is read, before it is parsed. */
  maxValues: number;
  /** The error for a body past `maxBytes` ('bytes') or `maxValues` ('values'). */
  exceeded: (bound: 'bytes' | 'values') => Error;
};

/**
 * The body as JSON, touching the watchdog for every chunk (a large list takes a while). A body past a
 * bound fails with `bounds.exceeded()` and is not read further, nor parsed; one that is not JSON or does
 * not parse fails with KUP_ERR_API_RESPONSE naming the URL.
 */
export async function readJson(
  res: Response,
  url: URL,
  bounds: BodyBounds,
  touch: () => void,
): Promise<{ value: unknown; bytes: number }> {
  if (!isJsonAnswer(res)) throw await notJsonError(res, url);
  const declared = Number(res.headers.get('content-length') ?? Number.NaN);
  if (declared > bounds.maxBytes) {
    await res.body?.cancel().catch(() => {});
    throw bounds.exceeded('bytes');
  }
  if (res.body === null) return { value: undefined, bytes: 0 };
  // Decoded chunk by chunk, not kept and joined as bytes: a list page joined into one buffer took a
  // megabyte of malloc'd memory per page, which the process kept (as RSS) long after it was freed.
  const decoder = new TextDecoder('utf-8', { fatal: false });
  const parts: string[] = [];
  const values = new JsonValueCounter();
  let bytes = 0;
  for await (const chunk of res.body) {
    touch();
    bytes += chunk.byteLength;
    // Leaving the loop cancels the body: the connection is dropped, nothing more is read.
    if (bytes > bounds.maxBytes) throw bounds.exceeded('bytes');
    if (values.push(chunk) >= bounds.maxValues) throw bounds.exceeded('values');
    parts.push(decoder.decode(chunk, { stream: true }));
  }
  parts.push(decoder.decode());
  try {
    return { value: JSON.parse(parts.join('')), bytes };
  } catch (err) {
    throw new ProxyError(
      'KUP_ERR_API_RESPONSE',
      `GET ${describeUrl(url)}: the body is not valid JSON (${truncate((err as Error).message)})`,
    );
  }
}

/** Up to `maxBytes` of the body as text; the rest is cancelled, not read. */
async function readText(res: Response, maxBytes: number): Promise<string> {
  if (res.body === null) return '';
  const chunks: Uint8Array[] = [];
  let bytes = 0;
  for await (const chunk of res.body) {
    chunks.push(chunk);
    bytes += chunk.byteLength;
    if (bytes >= maxBytes) break;
  }
  return Buffer.concat(chunks, bytes).subarray(0, maxBytes).toString('utf8');
}

function contentType(res: Response): string {
  return truncate(res.headers.get('content-type') ?? 'no content type', 100);
}

/**
 * The start of a text for a log line: whitespace runs as one space, quoted, with every control, bidi and
 * line-breaking character escaped (jsonSafe).
 */
export function snippet(text: string): string {
  return jsonSafe(JSON.stringify(truncate(text.replace(/\s+/g, ' ').trim())));
}

/** A JSON object (not null, not an array). */
export function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** A message or an object's text, cut for a log line. */
export function truncate(text: string, max = 200): string {
  return text.length > max ? `${text.slice(0, max)}…` : text;
}
