// A tiny HTTP server helper for the health and metrics servers (node:http, no framework).
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { parseHostPort } from '../lib/host-port.ts';

export type Route = (req: http.IncomingMessage, res: http.ServerResponse, url: URL) => void | Promise<void>;

export type HttpServer = { server: http.Server; port: number; close(): Promise<void> };

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

/** Listens on `address` (host:port) and dispatches GET requests by path. */
export async function startHttpServer(address: string, routes: Record<string, Route>): Promise<HttpServer> {
  const hp = parseHostPort(address);
  if (hp === undefined) throw new Error(`invalid address ${address}`);
  const server = http.createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://localhost');
    const route = routes[url.pathname];
    if (route === undefined) return sendText(res, 404, '404 page not found\n');
    if (req.method !== 'GET' && req.method !== 'HEAD') return sendText(res, 405, 'method not allowed\n');
    Promise.resolve(route(req, res, url)).catch((err: Error) => {
      if (!res.headersSent) sendText(res, 500, `${err.message}\n`);
      else res.destroy();
    });
  });
  server.keepAliveTimeout = 5000;
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen({ host: hp.host, port: hp.port }, () => {
      server.off('error', reject);
      resolve();
    });
  });
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
