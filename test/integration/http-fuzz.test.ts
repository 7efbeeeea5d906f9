// Fuzz over every HTTP surface of a running proxy: the health server, the metrics server (/metrics,
// /configz, /proxyMode, /debug/*) and a health check node port. Random and malformed methods, targets,
// versions, headers and bodies, sent whole, in slow pieces, cut short or reset. The proxy must live, no
// route may throw, and a valid /healthz must be answered throughout. Bounded in count and time; seeded
// (KUP_FUZZ_SEED=n reruns a failure).
import assert from 'node:assert/strict';
import net from 'node:net';
import { test } from 'node:test';
import { exchange, get, startProxyProcess } from '../helpers/proxy-process.ts';
import { prng } from '../helpers/sniff.ts';

const SEED = Number(process.env.KUP_FUZZ_SEED ?? 0x18_c0ffee);
const MAX_REQUESTS = 400;
const TIME_BUDGET_MS = 5000;
const CONCURRENCY = 8;
const CHECK_EVERY = 50;

type Rng = () => number;
const int = (r: Rng, n: number) => Math.floor(r() * n);
const pick = <T>(r: Rng, xs: readonly T[]): T => xs[int(r, xs.length)]!;
const chance = (r: Rng, p: number) => r() < p;

const PATHS = {
  health: ['/healthz', '/livez', '/'],
  metrics: [
    '/metrics',
    '/configz',
    '/proxyMode',
    '/healthz',
    '/debug/services',
    '/debug/connections',
    '/debug/trace',
  ],
  healthCheck: ['/', '/healthz'],
} as const;

const METHODS = [
  'GET',
  'GET',
  'GET',
  'HEAD',
  'POST',
  'PUT',
  'DELETE',
  'OPTIONS',
  'PATCH',
  'TRACE',
  'CONNECT',
];
const BAD_METHODS = ['get', 'BREW', '', 'G\u00e9T', 'GET GET', 'M-SEARCH', 'PRI', '\x00GET', 'X'.repeat(300)];
const VERSIONS = [
  'HTTP/1.1',
  'HTTP/1.1',
  'HTTP/1.1',
  'HTTP/1.0',
  'HTTP/2.0',
  'HTTP/1.2',
  'HTTP/',
  '',
  'http/1.1',
];
const TARGET_JUNK = [
  '[',
  ']',
  '%',
  '%zz',
  '%00',
  '%2e%2e',
  '%2f',
  '#',
  '?',
  '&',
  '..',
  '/',
  '//',
  '\\',
  '@',
  ':',
  ' ',
  '\t',
  '\u00e9',
  '\u2028',
  '\x00',
  '\x7f',
  '\xff',
  '{',
  '|',
  '^',
  '`',
  '"',
  '<',
  '>',
  '*',
  ';',
  '=',
];
const QUERY_KEYS = ['limit', 'follow', 'id', 'service', 'client', 'state', 'x', ''];
const QUERY_VALUES = [
  '',
  '0',
  '1',
  'true',
  'false',
  '-1',
  '99999999999',
  'NaN',
  '%zz',
  '%ff',
  'all',
  'active',
  'default/web',
  '\u00e9',
  'a'.repeat(2000),
];
const HEADER_NAMES = [
  'Host',
  'Content-Length',
  'Transfer-Encoding',
  'Connection',
  'Upgrade',
  'Expect',
  'Accept',
  'Cookie',
  'X-Forwarded-For',
  'Content-Type',
  'Trailer',
  'Te',
  'Range',
  'Authorization',
];
const HEADER_VALUES = [
  '',
  '0',
  '5',
  '-1',
  '18446744073709551616',
  'abc',
  'chunked',
  'chunked, gzip',
  'gzip',
  'close',
  'keep-alive',
  'upgrade',
  'h2c',
  'websocket',
  '100-continue',
  'bytes=0-',
  '\u00e9',
  '\x01',
  'a'.repeat(9000),
];

function randomBytes(r: Rng, n: number): string {
  let s = '';
  for (let i = 0; i < n; i++) s += String.fromCharCode(int(r, 256));
  return s;
}

function target(r: Rng, paths: readonly string[]): string {
  const roll = r();
  if (roll < 0.04) return '*';
  if (roll < 0.08) return `http://${pick(r, ['example', '[', '[::1', 'a@b', '', '%zz'])}${pick(r, paths)}`;
  if (roll < 0.1) return randomBytes(r, int(r, 40));
  if (roll < 0.12) return `/${'a'.repeat(int(r, 20_000))}`;
  let path: string = pick(r, paths);
  for (let i = int(r, 4); i > 0; i--) {
    const at = int(r, path.length + 1);
    path = path.slice(0, at) + pick(r, TARGET_JUNK) + path.slice(at);
  }
  if (chance(r, 0.15)) path = pick(r, ['//', '/\\', '/..', '//[']) + path;
  if (chance(r, 0.5)) {
    const n = 1 + int(r, 4);
    const params = Array.from({ length: n }, () => `${pick(r, QUERY_KEYS)}=${pick(r, QUERY_VALUES)}`);
    path += `?${params.join(pick(r, ['&', '&&', ';']))}`;
  }
  return path;
}

function headers(r: Rng, eol: string): string {
  const lines: string[] = [];
  if (chance(r, 0.9)) lines.push('Host: x');
  for (let i = int(r, 6); i > 0; i--) {
    const name = chance(r, 0.85) ? pick(r, HEADER_NAMES) : randomBytes(r, 1 + int(r, 12));
    const value = chance(r, 0.9) ? pick(r, HEADER_VALUES) : randomBytes(r, int(r, 30));
    const roll = r();
    if (roll < 0.05)
      lines.push(`${name}`); // no colon
    else if (roll < 0.1)
      lines.push(`${name}: ${value}${eol} folded`); // obs-fold
    else if (roll < 0.13)
      lines.push(`${name} : ${value}`); // space before the colon
    else lines.push(`${name}: ${value}`);
  }
  if (chance(r, 0.03)) lines.push(`X-Huge: ${'h'.repeat(17_000)}`);
  if (chance(r, 0.5)) lines.push('Connection: close');
  return lines.map((l) => l + eol).join('');
}

function body(r: Rng): string {
  const roll = r();
  if (roll < 0.6) return '';
  if (roll < 0.75) return randomBytes(r, int(r, 2000));
  if (roll < 0.9) {
    // Chunked, well-formed or not.
    const size = int(r, 40);
    const declared = chance(r, 0.7) ? size.toString(16) : pick(r, ['zz', '-1', 'ffffffffffffffff', '']);
    return `${declared}\r\n${'c'.repeat(size)}\r\n${pick(r, ['0\r\n\r\n', '', '0\r\nX: y\r\n\r\n', 'junk'])}`;
  }
  return `${int(r, 10)}\r\n`.repeat(int(r, 50));
}

type Fuzzed = { bytes: Buffer; delivery: 'whole' | 'slow' | 'cut' | 'reset'; text: string };

function request(r: Rng, paths: readonly string[]): Fuzzed {
  const eol = chance(r, 0.93) ? '\r\n' : '\n';
  const method = chance(r, 0.9) ? pick(r, METHODS) : pick(r, BAD_METHODS);
  const line = chance(r, 0.03)
    ? randomBytes(r, int(r, 200))
    : `${method} ${target(r, paths)}${chance(r, 0.97) ? ` ${pick(r, VERSIONS)}` : ''}`;
  const text = `${line}${eol}${headers(r, eol)}${eol}${body(r)}`;
  const roll = r();
  const delivery = roll < 0.7 ? 'whole' : roll < 0.85 ? 'slow' : roll < 0.95 ? 'cut' : 'reset';
  return { bytes: Buffer.from(text, 'latin1'), delivery, text };
}

/** Sends one fuzzed request and waits (bounded) for the answer or the close. */
async function send(port: number, f: Fuzzed, r: Rng): Promise<void> {
  if (f.delivery === 'whole') {
    await exchange(port, f.bytes, { idleMs: 150 });
  } else if (f.delivery === 'slow') {
    await exchange(port, f.bytes, { pieces: 2 + int(r, 8), delayMs: 5 + int(r, 30), idleMs: 150 });
  } else {
    const cut = f.bytes.subarray(0, int(r, f.bytes.length + 1));
    const reset = f.delivery === 'reset';
    await new Promise<void>((resolve) => {
      const s = net.connect({ host: '127.0.0.1', port }, () => {
        s.write(cut);
        if (reset) s.resetAndDestroy();
        else s.end();
      });
      s.on('error', () => {});
      s.on('close', () => resolve());
      s.resume();
      setTimeout(() => s.destroy(), 300);
    });
  }
}

test(`fuzz: ${MAX_REQUESTS} hostile requests over every HTTP surface, seed ${SEED}`, async (t) => {
  const proxy = await startProxyProcess();
  t.after(() => proxy.stop());
  const surfaces = [
    { name: 'health', port: proxy.ports.health, paths: PATHS.health },
    { name: 'metrics', port: proxy.ports.metrics, paths: PATHS.metrics },
    { name: 'health check node port', port: proxy.ports.healthCheck, paths: PATHS.healthCheck },
  ];
  const r = prng(SEED);
  // Generated up front: the sequence depends on the seed only, not on timing.
  const plan = Array.from({ length: MAX_REQUESTS }, () => {
    const surface = pick(r, surfaces);
    return { surface, fuzzed: request(r, surface.paths), seed: int(r, 2 ** 31) };
  });
  const deadline = Date.now() + TIME_BUDGET_MS;
  let sent = 0;
  const checkServing = async (after: string) => {
    assert.ok(proxy.alive(), `the proxy died after ${after} (seed ${SEED}): ${proxy.stderr()}`);
    assert.equal(await get(proxy.ports.health, '/healthz'), 200, `health /healthz after ${after}`);
    assert.equal(await get(proxy.ports.metrics, '/healthz'), 200, `metrics /healthz after ${after}`);
    assert.equal(await get(proxy.ports.healthCheck, '/'), 200, `health check after ${after}`);
  };
  for (let batch = 0; batch < MAX_REQUESTS && Date.now() < deadline; batch += CHECK_EVERY) {
    const items = plan.slice(batch, batch + CHECK_EVERY);
    for (let i = 0; i < items.length; i += CONCURRENCY) {
      await Promise.all(
        items.slice(i, i + CONCURRENCY).map((p) => send(p.surface.port, p.fuzzed, prng(p.seed))),
      );
      sent += Math.min(CONCURRENCY, items.length - i);
    }
    await checkServing(`requests ${batch}-${batch + items.length - 1}`);
  }
  const failed = proxy.lines.filter((l) => l.msg === 'HTTP handler failed');
  assert.deepEqual(
    failed.map((l) => l.target),
    [],
    'no route threw (a handled throw is still a bug)',
  );
  t.diagnostic(
    `sent ${sent} of ${MAX_REQUESTS} fuzzed requests (seed ${SEED}) in ${TIME_BUDGET_MS} ms at most`,
  );
  assert.ok(sent >= 100, `at least 100 requests within the time budget (sent ${sent})`);
});
