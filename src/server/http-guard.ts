// What keeps the health, metrics and health check node port servers alive whatever their clients do: a
// connection budget, short header/request/keep-alive timeouts, accept errors logged (never thrown), and
// request handlers made total (a throw is a 500 and a log line). Owns no routes.
import http from 'node:http';
import type { Logger } from '../lib/log.ts';
import type { FdLimits } from '../proxier/process-limits.ts';
import { isFdExhausted } from '../relay/fd-pressure.ts';
import type { ConnectionBudget, ConnectionBudgetLimits } from './connection-budget.ts';

export type HttpLimits = ConnectionBudgetLimits & {
  /** From a connection's first byte (or its previous response) to the end of the headers. */
  readonly headersTimeoutMs: number;
  /** From the same start to the end of the request body. */
  readonly requestTimeoutMs: number;
  /** How long a kept-alive connection may wait for its next request. */
  readonly keepAliveTimeoutMs: number;
  /** How often the two timeouts above are checked (Node's connectionsCheckingInterval). */
  readonly checkIntervalMs: number;
};

/**
 * Node's defaults (headers 60 s, request 300 s, checked every 30 s) kept a slowloris connection 70-90 s;
 * a probe or a scrape sends its headers at once.
 */
const TIMEOUTS = {
  headersTimeoutMs: 5000,
  requestTimeoutMs: 10_000,
  keepAliveTimeoutMs: 5000,
  checkIntervalMs: 1000,
} as const;

/** For servers every pod can reach (health, health check node ports): one client cannot fill them. */
export const PROBE_CLIENT_LIMIT = 32;

/**
 * The limits of one server: `overrides`, else the timeouts above and a connection cap of 1/16 of the
 * descriptor limit, between 64 and 1024 (the rest is the relays'). No per-client cap by default: the
 * metrics server is on loopback, where every client (and each /debug/trace follower) is 127.0.0.1.
 */
export function httpLimits(fdLimits: FdLimits | undefined, overrides: Partial<HttpLimits> = {}): HttpLimits {
  const soft = fdLimits?.soft ?? 65_536;
  return {
    ...TIMEOUTS,
    maxConnections: Math.min(1024, Math.max(64, Math.floor(soft / 16))),
    maxConnectionsPerClient: 0,
    ...overrides,
  };
}

export type GuardDeps = {
  log: Logger;
  /** The server's own, or one shared by several servers (the health check node ports). */
  budget: ConnectionBudget;
  /** An accept failed for lack of descriptors (kup_fd_exhausted_total, and the relays shed). */
  onFdExhausted?: (err: NodeJS.ErrnoException) => void;
};

/** Lines about one kind of trouble: the first at once, then at most one per interval, with the count. */
export class Throttled {
  readonly #intervalMs: number;
  readonly #now: () => number;
  #lastMs = Number.NEGATIVE_INFINITY;
  #unlogged = 0;

  constructor(intervalMs = 10_000, now: () => number = Date.now) {
    this.#intervalMs = intervalMs;
    this.#now = now;
  }

  /** Counts one event; calls `write` with the events since the last line when a line is due. */
  note(write: (events: number) => void): void {
    this.#unlogged++;
    const now = this.#now();
    if (now - this.#lastMs < this.#intervalMs) return;
    write(this.#unlogged);
    this.#lastMs = now;
    this.#unlogged = 0;
  }
}

/** An http.Server with the timeouts of `limits` (listen and guardServer are the caller's). */
export function createLimitedServer(limits: HttpLimits, handler: http.RequestListener): http.Server {
  const server = http.createServer(
    {
      headersTimeout: limits.headersTimeoutMs,
      requestTimeout: limits.requestTimeoutMs,
      connectionsCheckingInterval: limits.checkIntervalMs,
    },
    handler,
  );
  server.keepAliveTimeout = limits.keepAliveTimeoutMs;
  return server;
}

/**
 * Applies the budget to every connection `server` accepts (over it: closed at once, logged at most once
 * per interval) and keeps an `error` listener for good: an accept error after listen() (EMFILE when
 * libuv's reserve descriptor is gone, ENFILE, ENOMEM) is logged and counted, not an uncaught exception.
 * Call once listening.
 */
export function guardServer(server: http.Server, deps: GuardDeps): void {
  const { log, budget } = deps;
  const refused = new Throttled();
  const failed = new Throttled();
  server.on('connection', (socket) => {
    const client = socket.remoteAddress ?? '';
    const refusal = budget.admit(client);
    if (refusal === undefined) {
      socket.once('close', () => budget.release(client));
      return;
    }
    socket.destroy();
    refused.note((connections) =>
      log.warn(
        {
          reason: refusal,
          client,
          connections,
          open: budget.open,
          maxConnections: budget.limits.maxConnections,
          maxConnectionsPerClient: budget.limits.maxConnectionsPerClient,
        },
        'Too many connections, closing new ones',
      ),
    );
  });
  server.on('error', (err: NodeJS.ErrnoException) => {
    if (isFdExhausted(err)) deps.onFdExhausted?.(err);
    failed.note((events) => log.error({ err, events }, 'Accepting a connection failed'));
  });
}

/** A request handler that may throw or return a rejected promise; http-guard makes it total. */
export type Handler = (req: http.IncomingMessage, res: http.ServerResponse) => void | Promise<void>;

/** Long enough to tell the request, short enough for a log line (a target may be 16 KiB). */
const LOGGED_TARGET_CHARS = 200;

/**
 * `handler` made total: a synchronous throw or a rejection becomes a 500 (or, once the headers are out, a
 * closed connection) and a log line (at most one per interval, with the count), never an exception out
 * of the request event.
 */
export function totalHandler(handler: Handler, log: Logger): http.RequestListener {
  const failures = new Throttled();
  const fail = (req: http.IncomingMessage, res: http.ServerResponse, err: unknown) => {
    failures.note((events) =>
      log.error(
        { err, method: req.method, target: req.url?.slice(0, LOGGED_TARGET_CHARS), events },
        'HTTP handler failed',
      ),
    );
    try {
      if (res.headersSent || res.destroyed) throw err;
      const body = 'internal server error\n';
      res.writeHead(500, {
        'Content-Type': 'text/plain; charset=utf-8',
        'X-Content-Type-Options': 'nosniff',
        'Content-Length': Buffer.byteLength(body),
      });
      res.end(body);
    } catch {
      // Too late for a status: the client sees the connection close instead.
      res.destroy();
    }
  };
  return (req, res) => {
    // A response that fails to write (the client went away mid-way) is the client's loss, not a crash.
    res.on('error', () => res.destroy());
    try {
      const result = handler(req, res);
      if (result !== undefined) result.catch((err: unknown) => fail(req, res, err));
    } catch (err) {
      fail(req, res, err);
    }
  };
}
