// The tracing routes of the metrics server: /debug/connections (the connection table as JSON) and
// /debug/trace (trace events as NDJSON, streamed until the client goes away). Query strings only.
import type http from 'node:http';
import type {
  ConnectionFilter,
  ConnectionListing,
  ConnectionTable,
  ListOptions,
} from '../trace/connection-table.ts';
import type { Subscription, Tracer } from '../trace/tracer.ts';
import type { Route } from './http.ts';
import { sendJSON, sendText } from './http.ts';

type Parsed<T> = { ok: T; error?: undefined } | { ok?: undefined; error: string };

function count(url: URL, name: string): Parsed<number | undefined> {
  const v = url.searchParams.get(name);
  if (v === null || v === '') return { ok: undefined };
  // 16 digits: the connection ids of worker processes start at n × 2^40 (connection-id.ts).
  if (!/^\d{1,16}$/.test(v) || !Number.isSafeInteger(Number(v)))
    return { error: `invalid ${name} "${v}": expected a non-negative integer` };
  return { ok: Number(v) };
}

/** service, client and id from the query string. */
function parseFilter(url: URL): Parsed<ConnectionFilter> {
  const id = count(url, 'id');
  if (id.error !== undefined) return id;
  return {
    ok: {
      service: url.searchParams.get('service') || undefined,
      client: url.searchParams.get('client') || undefined,
      id: id.ok,
    },
  };
}

/** The filter plus state (active|closed|all) and limit. */
function parseListOptions(url: URL): Parsed<ListOptions> {
  const filter = parseFilter(url);
  if (filter.error !== undefined) return filter;
  const limit = count(url, 'limit');
  if (limit.error !== undefined) return limit;
  const state = url.searchParams.get('state') ?? 'all';
  if (state !== 'active' && state !== 'closed' && state !== 'all' && state !== '')
    return { error: `invalid state "${state}": expected active, closed or all` };
  return {
    ok: {
      ...filter.ok,
      state: state === 'active' || state === 'closed' ? state : undefined,
      limit: limit.ok,
    },
  };
}

function parseFollow(url: URL): Parsed<boolean> {
  const v = url.searchParams.get('follow');
  if (v === null || v === '' || v === 'true' || v === '1') return { ok: true };
  if (v === 'false' || v === '0') return { ok: false };
  return { error: `invalid follow "${v}": expected true or false` };
}

const NDJSON_HEADERS = {
  'Content-Type': 'application/x-ndjson',
  'Cache-Control': 'no-store',
  'X-Content-Type-Options': 'nosniff',
};

/**
 * `GET /debug/trace?service=&client=&id=&limit=&follow=`: first the buffered events that match (the
 * newest `limit`, oldest first; all by default), then, unless `follow=false`, new events as they happen
 * until the client disconnects. Followers are capped (the tracer's maxSubscribers): past the cap, a 503
 * that says so. Events come in batches (every 50 ms), each line serialized once for all followers; what a
 * follower does not get (it does not read, or the stream is over its time budget) is reported as a
 * `{"type":"dropped","count":n}` line.
 */
function traceRoute(tracer: Tracer, others: OtherTraces | undefined): Route {
  return async (req, res, url) => {
    const filter = parseFilter(url);
    const limit = count(url, 'limit');
    const follow = parseFollow(url);
    const error = filter.error ?? limit.error ?? follow.error;
    if (error !== undefined) return sendText(res, 400, `${error}\n`);
    if (req.method === 'HEAD') {
      res.writeHead(200, NDJSON_HEADERS);
      res.end();
      return;
    }
    // Subscribed before the backlog is read, so that nothing falls between the two; live events wait
    // (`held`) until the backlog is out, which other processes (--workers) may take a moment to send.
    let held: (Buffer | Uint8Array)[] | undefined = [];
    const emit = (chunk: Buffer | Uint8Array) => {
      if (res.destroyed) return;
      if (held !== undefined) held.push(chunk);
      else res.write(chunk);
    };
    let sub: Subscription | undefined;
    if (follow.ok) {
      sub = tracer.subscribeLines(filter.ok!, { ready: () => ready(res, sub!), write: emit });
      if (sub === undefined) return tooManyFollowers(res, tracer);
      // The other processes' events, as they batch them; past the buffer bound they are dropped.
      const remote = others?.follow(filter.ok!, (data) => {
        if (res.writableLength <= MAX_BUFFERED) emit(data);
      });
      res.on('close', () => {
        sub!.close();
        remote?.close();
      });
    }
    res.writeHead(200, NDJSON_HEADERS);
    const own = tracer.recentLines(filter.ok, limit.ok);
    const backlog =
      others === undefined
        ? own
        : mergeLines([own, ...(await others.recentLines(filter.ok!, limit.ok))], limit.ok);
    if (res.destroyed) return;
    if (backlog !== '') res.write(backlog);
    for (const chunk of held) res.write(chunk);
    held = undefined;
    if (!follow.ok) {
      res.end();
      return;
    }
    // Let the client see the 200 before the first event, which may be long in coming.
    if (backlog === '') res.flushHeaders();
  };
}

/** Bytes a follower may leave unread in our buffers (beyond the kernel's) before its events queue. */
const MAX_BUFFERED = 256 * 1024;

/**
 * Whether a follower takes more: not while more than MAX_BUFFERED of what it was sent waits in our
 * buffers; then it resumes on drain. (`write()` returning false says little: it does for every batch
 * over the stream's 16 KiB mark, however fast the reader.)
 */
function ready(res: http.ServerResponse, sub: Subscription): boolean {
  if (res.destroyed || res.writableLength <= MAX_BUFFERED || !res.writableNeedDrain) return true;
  res.once('drain', () => sub.resume());
  return false;
}

function tooManyFollowers(res: http.ServerResponse, tracer: Tracer): void {
  const { maxSubscribers } = tracer.stats();
  const body =
    `too many followers of /debug/trace (at most ${maxSubscribers} at once); ` +
    'try again later, or read the buffered events with follow=false\n';
  res.writeHead(503, {
    'Content-Type': 'text/plain; charset=utf-8',
    'X-Content-Type-Options': 'nosniff',
    'Content-Length': Buffer.byteLength(body),
    'Retry-After': '10',
  });
  res.end(body);
}

/** `GET /debug/connections?service=&client=&id=&state=&limit=`: `{active, recent, totals, dropped}`. */
/** The connection listing of the whole proxy: this process's table and its workers' (--workers). */
export type ListConnections = (options: ListOptions) => ConnectionListing | Promise<ConnectionListing>;

function connectionsRoute(list: ListConnections): Route {
  return async (_req, res, url) => {
    const options = parseListOptions(url);
    if (options.error !== undefined) return sendText(res, 400, `${options.error}\n`);
    sendJSON(res, 200, await list(options.ok));
  };
}

/** The trace events of the other processes of the proxy (--workers). */
export interface OtherTraces {
  /** Their buffered events matching `filter`, NDJSON, one string per process. */
  recentLines(filter: ConnectionFilter, limit: number | undefined): Promise<string[]>;
  /** Their live events matching `filter`, in NDJSON batches, until close(). */
  follow(filter: ConnectionFilter, onLines: (data: Uint8Array) => void): { close(): void };
}

/**
 * NDJSON of several processes (each oldest first) as one, oldest first by each event's `atMs`, the
 * newest `limit`.
 */
export function mergeLines(texts: readonly string[], limit: number | undefined): string {
  const lines = texts.flatMap((t) =>
    t === '' ? [] : t.slice(0, t.endsWith('\n') ? -1 : undefined).split('\n'),
  );
  const timed = lines.map((line) => ({ line, time: eventTime(line) }));
  timed.sort((a, b) => a.time - b.time);
  const kept = limit === undefined ? timed : timed.slice(Math.max(0, timed.length - limit));
  return kept.length === 0 ? '' : `${kept.map((e) => e.line).join('\n')}\n`;
}

/** The `atMs` of an event line; 0 when it has none. */
function eventTime(line: string): number {
  const m = /"atMs":(\d+)/.exec(line);
  return m === null ? 0 : Number(m[1]);
}

/**
 * The routes to merge into the metrics server's; `list` merges the workers' tables in, `others` their
 * trace events.
 */
export function traceRoutes(
  tracer: Tracer,
  table: ConnectionTable,
  list: ListConnections = (options) => table.list(options),
  others?: OtherTraces,
): Record<string, Route> {
  return {
    '/debug/connections': connectionsRoute(list),
    '/debug/trace': traceRoute(tracer, others),
  };
}
