// The console's static files on a real HTTP server: each file of the fixed list with its type, nosniff,
// the Content-Security-Policy and revalidation; gzip when asked; nothing else (no traversal, no listing, no
// other file of the package); a file missing from the installation is a 500 and one log line, and the
// server goes on.
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { Writable } from 'node:stream';
import { test } from 'node:test';
import { gunzipSync } from 'node:zlib';
import { createLogger } from '../../../src/lib/log.ts';
import { startHttpServer } from '../../../src/server/http.ts';
import {
  acceptsGzip,
  matchesEtag,
  UI_CSP,
  UI_OWN_FILES,
  uiAssetRoutes,
  uiFiles,
} from '../../../src/server/ui-assets.ts';
import { exchange } from '../../helpers/proxy-process.ts';

type T = { after(fn: () => unknown): void };

async function serve(t: T, files = uiFiles()) {
  const lines: string[] = [];
  const log = createLogger({
    destination: new Writable({
      write(chunk, _enc, cb) {
        lines.push(String(chunk));
        cb();
      },
    }),
  });
  const server = await startHttpServer('127.0.0.1:0', uiAssetRoutes(log, files));
  t.after(() => server.close());
  return { base: `http://127.0.0.1:${server.port}`, port: server.port, lines };
}

const TYPES: Record<string, RegExp> = {
  '/ui/': /^text\/html; charset=utf-8$/,
  '/ui/app.js': /^text\/javascript; charset=utf-8$/,
  '/ui/uPlot.esm.js': /^text\/javascript; charset=utf-8$/,
  '/ui/style.css': /^text\/css; charset=utf-8$/,
  '/ui/uPlot.min.css': /^text\/css; charset=utf-8$/,
  '/ui/favicon.svg': /^image\/svg\+xml$/,
};

test('every file of the list is served with its type, nosniff, the CSP and no-cache', async (t) => {
  const { base } = await serve(t);
  const routes = [...uiFiles().keys()];
  assert.equal(routes.length, UI_OWN_FILES.length + 2);
  for (const route of routes) {
    const res = await fetch(`${base}${route}`, { headers: { 'accept-encoding': 'identity' } });
    assert.equal(res.status, 200, route);
    const type = res.headers.get('content-type') ?? '';
    if (TYPES[route]) assert.match(type, TYPES[route], route);
    else assert.match(type, /^text\/javascript; charset=utf-8$/, route);
    assert.equal(res.headers.get('x-content-type-options'), 'nosniff');
    assert.equal(res.headers.get('content-security-policy'), UI_CSP);
    assert.equal(res.headers.get('cache-control'), 'no-cache');
    assert.equal(res.headers.get('x-frame-options'), 'DENY');
    assert.equal(res.headers.get('referrer-policy'), 'no-referrer');
    assert.match(res.headers.get('etag') ?? '', /^"[\w-]{22}"$/);
    assert.ok((await res.arrayBuffer()).byteLength > 0);
  }
  const html = await (await fetch(`${base}/ui/`)).text();
  assert.equal(html, await readFile(new URL('../../../ui/index.html', import.meta.url), 'utf8'));
});

test('the CSP allows no inline script or style and nothing from elsewhere', () => {
  const directives = new Map(
    UI_CSP.split(';')
      .map((d) => d.trim().split(/\s+/) as [string, ...string[]])
      .map(([k, ...v]) => [k, v]),
  );
  assert.deepEqual(directives.get('default-src'), ["'self'"]);
  assert.deepEqual(directives.get('script-src'), ["'self'"]);
  assert.deepEqual(directives.get('style-src'), ["'self'"]);
  assert.deepEqual(directives.get('object-src'), ["'none'"]);
  assert.deepEqual(directives.get('frame-ancestors'), ["'none'"]);
  assert.ok(!UI_CSP.includes('unsafe'), UI_CSP);
});

test('the page has no inline script, no inline style and no external URL', async () => {
  for (const file of UI_OWN_FILES) {
    const text = await readFile(new URL(`../../../ui/${file}`, import.meta.url), 'utf8');
    assert.doesNotMatch(text, /https?:\/\/(?!www\.w3\.org\/2000\/svg)/, `${file} names another origin`);
    assert.doesNotMatch(
      text,
      /\binnerHTML\b|outerHTML\s*=|insertAdjacentHTML|document\.write|\beval\(/,
      file,
    );
    if (file === 'index.html') {
      assert.doesNotMatch(text, /<script(?![^>]*\bsrc=)[^>]*>/, 'inline script');
      assert.doesNotMatch(text, /<style|\sstyle=|\son[a-z]+=/, 'inline style or handler');
    }
  }
});

test('/ui redirects to /ui/, relatively (a path prefix is kept)', async (t) => {
  const { base } = await serve(t);
  const res = await fetch(`${base}/ui`, { redirect: 'manual' });
  assert.equal(res.status, 308);
  assert.equal(res.headers.get('location'), 'ui/');
});

test('gzip when asked, and an ETag per representation that revalidates to 304', async (t) => {
  const { base } = await serve(t);
  const raw = await readFile(new URL('../../../ui/app.js', import.meta.url));
  const plain = await fetch(`${base}/ui/app.js`, { headers: { 'accept-encoding': 'identity' } });
  assert.equal(plain.headers.get('content-encoding'), null);
  const etag = plain.headers.get('etag')!;
  const zipped = await exchange(
    Number(new URL(base).port),
    'GET /ui/app.js HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip, br\r\nConnection: close\r\n\r\n',
  );
  assert.match(zipped.text, /\r\ncontent-encoding: gzip\r\n/i);
  assert.match(zipped.text, /\r\nvary: accept-encoding\r\n/i);
  const body = Buffer.from(zipped.text.slice(zipped.text.indexOf('\r\n\r\n') + 4), 'latin1');
  assert.deepEqual(gunzipSync(body), raw);
  const again = await fetch(`${base}/ui/app.js`, {
    headers: { 'accept-encoding': 'identity', 'if-none-match': etag },
  });
  assert.equal(again.status, 304);
  assert.equal((await again.arrayBuffer()).byteLength, 0);
  const stale = await fetch(`${base}/ui/app.js`, {
    headers: { 'accept-encoding': 'identity', 'if-none-match': '"something-else"' },
  });
  assert.equal(stale.status, 200);
});

test('nothing outside the list: traversal, listing and other files are 404s', async (t) => {
  const { port } = await serve(t);
  for (const path of [
    '/ui/../package.json',
    '/ui/..%2fpackage.json',
    '/ui/%2e%2e/package.json',
    '/ui/index.html',
    '/ui/api/',
    '/ui//app.js',
    '/ui/app.js/',
    '/ui/APP.JS',
    '/ui/app.js%00',
    '/ui/uPlot.d.ts',
    '/ui/node_modules/uplot/package.json',
    '/',
    '/package.json',
  ]) {
    const reply = await exchange(port, `GET ${path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`);
    assert.equal(reply.status, 404, `${path}: ${reply.text.slice(0, 80)}`);
  }
  // Dot segments resolve as URLs do, to a file of the list or to nothing; a query string is ignored.
  for (const [path, type] of [
    ['/ui/.', 'text/html'],
    ['/ui/%2e', 'text/html'],
    ['/ui/x/../app.js', 'text/javascript'],
    ['/ui/app.js?x=../../package.json', 'text/javascript'],
  ]) {
    const reply = await exchange(port, `GET ${path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`);
    assert.equal(reply.status, 200, path);
    assert.match(reply.text, new RegExp(`\r\ncontent-type: ${type}`, 'i'), path);
  }
});

test('a file missing from the installation: a 500 that says so, one log line, the rest still served', async (t) => {
  const files = new Map(uiFiles());
  files.set('/ui/app.js', new URL('file:///nonexistent/kup/app.js'));
  files.set('/ui/uPlot.esm.js', undefined);
  const { base, lines } = await serve(t, files);
  for (let i = 0; i < 3; i++) {
    const res = await fetch(`${base}/ui/app.js`);
    assert.equal(res.status, 500);
    assert.match(await res.text(), /missing from this installation/);
  }
  assert.equal((await fetch(`${base}/ui/uPlot.esm.js`)).status, 500);
  assert.equal((await fetch(`${base}/ui/`)).status, 200);
  const logged = lines.map((l) => JSON.parse(l) as { msg: string; route: string; level: string });
  assert.deepEqual(
    logged.map((l) => [l.level, l.msg, l.route]),
    [
      ['error', 'Console file missing, /ui cannot be served whole', '/ui/app.js'],
      ['error', 'Console file missing, /ui cannot be served whole', '/ui/uPlot.esm.js'],
    ],
  );
});

const GZIP_CASES = [
  { name: 'absent', header: undefined, want: false },
  { name: 'gzip', header: 'gzip', want: true },
  { name: 'in a list', header: 'br, gzip;q=0.8, deflate', want: true },
  { name: 'refused with q=0', header: 'gzip;q=0, br', want: false },
  { name: 'refused with q=0.000', header: 'GZIP; q=0.000', want: false },
  { name: 'wildcard is not taken', header: '*', want: false },
  { name: 'x-gzip is not gzip', header: 'x-gzip', want: false },
];
for (const c of GZIP_CASES) test(`acceptsGzip: ${c.name}`, () => assert.equal(acceptsGzip(c.header), c.want));

const ETAG_CASES = [
  { name: 'absent', header: undefined, want: false },
  { name: 'same', header: '"abc"', want: true },
  { name: 'weak form of the same', header: 'W/"abc"', want: true },
  { name: 'in a list', header: '"x", "abc"', want: true },
  { name: 'star', header: '*', want: true },
  { name: 'other', header: '"abd"', want: false },
];
for (const c of ETAG_CASES)
  test(`matchesEtag: ${c.name}`, () => assert.equal(matchesEtag(c.header, '"abc"'), c.want));
