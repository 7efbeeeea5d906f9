// The console's static files under /ui/: a fixed list of files of this package (ui/ and the charting
// library's build), read once on first request and served with their type, an ETag to revalidate, gzip when
// asked for, nosniff and a Content-Security-Policy that runs only this origin's scripts and styles. No part
// of a request ever reaches the file system: a path is either in the list or a 404 (http.ts's dispatch).
import { createHash } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import type http from 'node:http';
import { fileURLToPath } from 'node:url';
import { gzipSync } from 'node:zlib';
import type { Logger } from '../lib/log.ts';
import type { Route } from './http.ts';

/** No inline script or style, no plugin, no framing, no form posts, no other origin. */
export const UI_CSP =
  "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
  "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/** Headers every /ui response carries, the JSON ones included. */
export const UI_SECURITY_HEADERS: Readonly<Record<string, string>> = {
  'X-Content-Type-Options': 'nosniff',
  'Content-Security-Policy': UI_CSP,
  'Referrer-Policy': 'no-referrer',
  'X-Frame-Options': 'DENY',
  'Cross-Origin-Opener-Policy': 'same-origin',
  'Cross-Origin-Resource-Policy': 'same-origin',
};

const TYPES: Readonly<Record<string, string>> = {
  html: 'text/html; charset=utf-8',
  js: 'text/javascript; charset=utf-8',
  css: 'text/css; charset=utf-8',
  svg: 'image/svg+xml',
};

const UI_DIR = new URL('../../ui/', import.meta.url);

/** Where a file of a dependency is, or undefined when the dependency is not installed. */
function dependencyFile(specifier: string): URL | undefined {
  try {
    return new URL(import.meta.resolve(specifier));
  } catch {
    return undefined;
  }
}

/** The console's own files, in ui/ of the package: the page is served as `/ui/`, the others by name. */
export const UI_OWN_FILES = [
  'index.html',
  'app.js',
  'api.js',
  'charts.js',
  'connections.js',
  'dom.js',
  'filters.js',
  'format.js',
  'services.js',
  'trace.js',
  'style.css',
  'favicon.svg',
] as const;

/**
 * Route → file: ui/'s files and the charting library's. The page is `/ui/` so that its relative URLs also
 * work behind a path prefix. Undefined: a dependency that is not installed.
 */
export function uiFiles(): ReadonlyMap<string, URL | undefined> {
  return new Map<string, URL | undefined>([
    ...UI_OWN_FILES.map((f): [string, URL] => [f === 'index.html' ? '/ui/' : `/ui/${f}`, new URL(f, UI_DIR)]),
    ['/ui/uPlot.esm.js', dependencyFile('uplot/dist/uPlot.esm.js')],
    ['/ui/uPlot.min.css', dependencyFile('uplot/dist/uPlot.min.css')],
  ]);
}

type Loaded = { type: string; etag: string; raw: Buffer; gzip: Buffer };

/** The GET/HEAD routes of the static files, and `/ui` redirected to `/ui/`. */
export function uiAssetRoutes(log: Logger, files = uiFiles()): Record<string, Route> {
  const routes: Record<string, Route> = {
    // Relative, so that a path prefix (kubectl proxy, an ingress) is kept.
    '/ui': (_req, res) => {
      res.writeHead(308, { Location: 'ui/', 'Content-Length': 0, ...UI_SECURITY_HEADERS });
      res.end();
    },
  };
  for (const [route, file] of files) {
    let loading: Promise<Loaded | undefined> | undefined;
    routes[route] = async (req, res) => {
      loading ??= load(route, file, log);
      const asset = await loading;
      if (asset === undefined) {
        const body = `the console file for ${route} is missing from this installation\n`;
        res.writeHead(500, {
          'Content-Type': 'text/plain; charset=utf-8',
          'Content-Length': Buffer.byteLength(body),
          ...UI_SECURITY_HEADERS,
        });
        res.end(body);
        return;
      }
      send(req, res, asset);
    };
  }
  return routes;
}

async function load(route: string, file: URL | undefined, log: Logger): Promise<Loaded | undefined> {
  const ext = route.endsWith('/') ? 'html' : route.slice(route.lastIndexOf('.') + 1);
  try {
    if (file === undefined) throw new Error('the dependency is not installed');
    const raw = await readFile(file);
    const hash = createHash('sha256').update(raw).digest('base64url').slice(0, 22);
    return { type: TYPES[ext] ?? 'application/octet-stream', etag: `"${hash}"`, raw, gzip: gzipSync(raw) };
  } catch (err) {
    log.error(
      { err, route, file: file === undefined ? undefined : fileURLToPath(file) },
      'Console file missing, /ui cannot be served whole',
    );
    return undefined;
  }
}

function send(req: http.IncomingMessage, res: http.ServerResponse, asset: Loaded): void {
  const gzip = acceptsGzip(req.headers['accept-encoding']);
  // A strong ETag names one representation: the gzipped one has its own.
  const etag = gzip ? `${asset.etag.slice(0, -1)}-gz"` : asset.etag;
  const headers: Record<string, string | number> = {
    'Content-Type': asset.type,
    // Revalidated on every load (a new version of the package changes the files, not their names).
    'Cache-Control': 'no-cache',
    ETag: etag,
    Vary: 'Accept-Encoding',
    ...UI_SECURITY_HEADERS,
  };
  if (matchesEtag(req.headers['if-none-match'], etag)) {
    res.writeHead(304, headers);
    res.end();
    return;
  }
  const body = gzip ? asset.gzip : asset.raw;
  if (gzip) headers['Content-Encoding'] = 'gzip';
  headers['Content-Length'] = body.length;
  res.writeHead(200, headers);
  res.end(body);
}

/** `gzip` listed without `q=0` (RFC 9110 §12.5.3); `*` is not taken to mean it. */
export function acceptsGzip(header: string | undefined): boolean {
  if (header === undefined) return false;
  for (const part of header.toLowerCase().split(',')) {
    const [coding, ...params] = part.split(';').map((s) => s.trim());
    if (coding !== 'gzip') continue;
    return !params.some((p) => /^q=0(\.0{0,3})?$/.test(p));
  }
  return false;
}

/** If-None-Match holds `etag` (weak comparison, as RFC 9110 §13.1.2 asks) or `*`. */
export function matchesEtag(header: string | undefined, etag: string): boolean {
  if (header === undefined) return false;
  return header.split(',').some((t) => {
    const tag = t.trim().replace(/^W\//, '');
    return tag === '*' || tag === etag;
  });
}
