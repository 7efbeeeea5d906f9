// `node bench/ui-console.bench.ts [--services N] [--connections N]`: what the live console (/ui) costs with
// many service ports and live connections. The demo's services plus N generated service ports (10,000 by
// default) on the real proxy process (--no-iptables), M held HTTP connections through it (1,000), then
// Debian's chromium (headless, playwright-core) loads /ui/. Reports the page's load time (navigation to the
// first service row, and to the `load` event), the browser's JS heap and DOM nodes (CDP
// Performance.getMetrics) once settled, the proxy's answer times for the console's JSON endpoints, and the
// proxy's RSS before and after the page watched for a while. Needs /usr/bin/chromium.
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { chromium } from 'playwright-core';
import { startDemoProxy } from '../test/helpers/demo-proxy.ts';
import { freePort } from '../test/helpers/proxy-process.ts';
import { waitFor } from '../test/helpers/servers.ts';

const CHROMIUM = '/usr/bin/chromium';
const { values } = parseArgs({
  options: {
    services: { type: 'string', default: '10000' },
    connections: { type: 'string', default: '1000' },
    'watch-seconds': { type: 'string', default: '20' },
  },
});
const services = Number(values.services);
const connections = Number(values.connections);
const watchMs = Number(values['watch-seconds']) * 1000;
if (!existsSync(CHROMIUM)) {
  process.stderr.write(`${CHROMIUM} is missing: apt-get install -y --no-install-recommends chromium\n`);
  process.exit(3);
}

const rssOf = (pid: number) => {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) / 1024 : Number.NaN;
};
const mb = (n: number) => `${n.toFixed(1)} MB`;

/** The proxy's V8 heap in use (MB) after two full garbage collections, through its inspector. */
async function heapAfterGc(inspectPort: number): Promise<number> {
  const list = (await (await fetch(`http://127.0.0.1:${inspectPort}/json/list`)).json()) as {
    webSocketDebuggerUrl: string;
  }[];
  const ws = new WebSocket(list[0]!.webSocketDebuggerUrl);
  await new Promise((resolve, reject) => {
    ws.addEventListener('open', resolve, { once: true });
    ws.addEventListener('error', reject, { once: true });
  });
  let next = 1;
  const call = (method: string) =>
    new Promise<Record<string, number>>((resolve) => {
      const id = next++;
      const onMessage = (e: MessageEvent) => {
        const msg = JSON.parse(String(e.data)) as { id?: number; result?: Record<string, number> };
        if (msg.id !== id) return;
        ws.removeEventListener('message', onMessage);
        resolve(msg.result ?? {});
      };
      ws.addEventListener('message', onMessage);
      ws.send(JSON.stringify({ id, method }));
    });
  await call('HeapProfiler.collectGarbage');
  await call('HeapProfiler.collectGarbage');
  const usage = await call('Runtime.getHeapUsage');
  ws.close();
  return usage.usedSize! / 2 ** 20;
}

/** Median time of `n` GETs of `path`, and the body size. */
async function timeGet(base: string, path: string, n = 15): Promise<{ ms: number; bytes: number }> {
  const times: number[] = [];
  let bytes = 0;
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    const res = await fetch(`${base}${path}`);
    bytes = (await res.arrayBuffer()).byteLength;
    times.push(performance.now() - t0);
  }
  times.sort((a, b) => a - b);
  return { ms: times[Math.floor(n / 2)]!, bytes };
}

/** Opens `n` keep-alive HTTP connections through `port` (each with one answered request) and holds them. */
async function holdConnections(port: number, n: number): Promise<net.Socket[]> {
  const sockets: net.Socket[] = [];
  for (let i = 0; i < n; i += 100) {
    const batch = Array.from(
      { length: Math.min(100, n - i) },
      (_, j) =>
        new Promise<net.Socket>((resolve, reject) => {
          const s = net.connect({ host: '127.0.0.1', port });
          s.once('error', reject);
          s.once('data', () => resolve(s));
          s.write(`GET /held/${i + j} HTTP/1.1\r\nHost: bench.example\r\n\r\n`);
        }),
    );
    sockets.push(...(await Promise.all(batch)));
  }
  return sockets;
}

const inspectPort = await freePort();
const t0 = performance.now();
const proxy = await startDemoProxy({
  nodeArgs: [`--inspect=127.0.0.1:${inspectPort}`],
  extraServicePorts: services,
  fdLimit: services + connections * 3 + 4096,
  startTimeoutMs: 180_000,
});
const startedMs = performance.now() - t0;
const profile = mkdtempSync(join(tmpdir(), 'kup-chromium-'));
const out: string[] = [];
const say = (line: string) => {
  out.push(line);
  process.stdout.write(`${line}\n`);
};
let held: net.Socket[] = [];
try {
  say(`service ports: ${services + 3} (started and all open in ${(startedMs / 1000).toFixed(1)} s)`);
  held = await holdConnections(proxy.proxyPorts.get('demo/echo:http/TCP')!, connections);
  say(`live connections held through demo/echo:http: ${held.length}`);
  const pid = proxy.child.pid!;
  const rssBefore = rssOf(pid);
  const heapBefore = await heapAfterGc(inspectPort);
  for (const path of [
    '/ui/api/overview',
    '/ui/api/services?limit=50',
    '/ui/api/services?limit=50&sort=active',
    '/ui/api/services?limit=50&q=svc-0999',
    '/ui/api/connections?limit=100',
    '/ui/api/connections?limit=100&protocol=http1&endpoint=127.0.0.11',
    '/debug/services',
  ]) {
    const r = await timeGet(proxy.metrics, path, path === '/debug/services' ? 3 : 15);
    say(`GET ${path}: ${r.ms.toFixed(1)} ms median, ${(r.bytes / 1024).toFixed(1)} KiB`);
  }

  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    viewport: { width: 1400, height: 1000 },
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
  try {
    const page = await context.newPage();
    const errors: string[] = [];
    page.on('console', (m) => {
      if (m.type() === 'error') errors.push(m.text());
    });
    page.on('pageerror', (e) => errors.push(String(e)));
    const cdp = await context.newCDPSession(page);
    await cdp.send('Performance.enable');
    const navStart = performance.now();
    await page.goto(`${proxy.metrics}/ui/`, { waitUntil: 'load' });
    const loadMs = performance.now() - navStart;
    await page.waitForSelector('#services-table tbody tr.row');
    await page.waitForSelector('#connections-table tbody tr');
    const firstRowsMs = performance.now() - navStart;
    say(
      `page: load event ${loadMs.toFixed(0)} ms, first service and connection rows ${firstRowsMs.toFixed(0)} ms`,
    );
    // A search over every service port, typed as an operator would.
    const searchStart = performance.now();
    await page.locator('#services-q').fill('svc-09999');
    await waitFor(
      async () => (await page.locator('#services-table tbody tr.row').count()) === 1,
      10_000,
      'one row',
    );
    say(
      `search of one port among ${services + 3}: rows updated ${(performance.now() - searchStart).toFixed(0)} ms after typing (250 ms of it debounce)`,
    );
    await page.locator('#services-q').fill('');
    // Watch a while, with traffic, as an operator would.
    const port = proxy.proxyPorts.get('demo/echo:http/TCP')!;
    const end = Date.now() + watchMs;
    while (Date.now() < end) {
      await (await fetch(`http://127.0.0.1:${port}/watch`)).text();
      await new Promise((r) => setTimeout(r, 100));
    }
    await cdp.send('HeapProfiler.collectGarbage');
    const { metrics } = (await cdp.send('Performance.getMetrics')) as {
      metrics: { name: string; value: number }[];
    };
    const metric = (name: string) => metrics.find((m) => m.name === name)?.value ?? Number.NaN;
    say(
      `browser after ${watchMs / 1000} s: JS heap used ${mb(metric('JSHeapUsedSize') / 2 ** 20)} ` +
        `(total ${mb(metric('JSHeapTotalSize') / 2 ** 20)}), DOM nodes ${metric('Nodes')}, ` +
        `script time ${metric('ScriptDuration').toFixed(2)} s, layout ${metric('LayoutDuration').toFixed(2)} s`,
    );
    const rows = {
      services: await page.locator('#services-table tbody tr').count(),
      connections: await page.locator('#connections-table tbody tr').count(),
      trace: await page.locator('#trace li').count(),
      all: await page.locator('*').count(),
    };
    say(
      `DOM: ${rows.services} service rows, ${rows.connections} connection rows, ${rows.trace} trace lines, ${rows.all} elements`,
    );
    const heapWatched = await heapAfterGc(inspectPort);
    const rssWatched = rssOf(pid);
    await page.close();
    // The rate history is let go a minute after the console last asked.
    await new Promise((r) => setTimeout(r, 65_000));
    say(
      `proxy (after full GCs): V8 heap in use ${mb(heapBefore)} before the page, ${mb(heapWatched)} while ` +
        `watched, ${mb(await heapAfterGc(inspectPort))} a minute after it closed; RSS ${mb(rssBefore)}, ` +
        `${mb(rssWatched)}, ${mb(rssOf(pid))}`,
    );
    if (errors.length > 0) say(`console errors: ${errors.join(' | ')}`);
  } finally {
    await context.close();
  }
} finally {
  for (const s of held) s.destroy();
  await proxy.stop();
  rmSync(profile, { recursive: true, force: true });
}
