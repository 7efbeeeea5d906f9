// A tiny HTTP server helper for the health and metrics servers (node:http, no framework): routes by
// path, GET and HEAD only. Every request gets an answer or a closed connection, never an exception; the
// limits and timeouts are http-guard.ts's.
import type http from 'node:http';
import type { AddressInfo } from 'node:net';
import { parseHostPort } from '../lib/host-port.ts';
import { type Logger, silentLogger } from '../lib/log.ts';
import { readFdLimits } from '../proxier/process-limits.ts';
import { ConnectionBudget } from './connection-budget.ts';
import { createLimitedServer, guardServer, type HttpLimits, httpLimits, totalHandler } from './http-guard.ts';
import { parseRequestTarget } from './request-target.ts';

export type Route = (req: http.IncomingMessage, res: http.ServerResponse, url: URL) => void | Promise<void>;

export type HttpServer = { server: http.Server; port: number; close(): Promise<void> };

export type HttpServerOptions = {
  /** Failed handlers, refused connections and accept errors; default: none. */
  log?: Logger;
  /** Over httpLimits()'s defaults (a per-client cap for servers every pod reaches). */
  limits?: Partial<HttpLimits>;
  /** An accept failed for lack of descriptors. */
  onFdExhausted?: (err: NodeJS.ErrnoException) => void;
};

export function sendJSON(res: http.ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, {
    'Content-Type': 'application/json',
    'X-Content-Type-Options': 'nosniff',
    'Content-Length': Buffer.byteLength(text),
  });
  res.end(text);
}

export function sendText(
  res: http.ServerResponse,
  status: number,
  body: string,
  type = 'text/plain; charset=utf-8',
): void {
  res.writeHead(status, {
    'Content-Type': type,
    'X-Content-Type-Options': 'nosniff',
    'Content-Length': Buffer.byteLength(body),
  });
  res.end(body);
}

/** Finds the route of a request: 400 for a target that is not a path, 404 for no route, 405 for not GET/HEAD. */
function dispatch(
  routes: Readonly<Record<string, Route>>,
  req: http.IncomingMessage,
  res: http.ServerResponse,
): void | Promise<void> {
  const url = parseRequestTarget(req.url);
  if (url === undefined) return sendText(res, 400, '400 bad request target\n');
  const route = Object.hasOwn(routes, url.pathname) ? routes[url.pathname] : undefined;
  if (route === undefined) return sendText(res, 404, '404 page not found\n');
  if (req.method !== 'GET' && req.method !== 'HEAD') {
    res.setHeader('Allow', 'GET, HEAD');
    return sendText(res, 405, 'method not allowed\n');
  }
  return route(req, res, url);
}

/** Listens on `address` (host:port) and dispatches GET and HEAD requests by path. */
export async function startHttpServer(
  address: string,
  routes: Record<string, Route>,
  options: HttpServerOptions = {},
): Promise<HttpServer> {
  const hp = parseHostPort(address);
  if (hp === undefined) throw new Error(`invalid address ${address}`);
  const log = options.log ?? silentLogger();
  const limits = httpLimits(readFdLimits(), options.limits);
  const table = { ...routes };
  const server = createLimitedServer(
    limits,
    totalHandler((req, res) => dispatch(table, req, res), log),
  );
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen({ host: hp.host, port: hp.port }, () => {
      server.off('error', reject);
      resolve();
    });
  });
  guardServer(server, { log, budget: new ConnectionBudget(limits), onFdExhausted: options.onFdExhausted });
  return {
    server,
    port: (server.address() as AddressInfo).port,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
