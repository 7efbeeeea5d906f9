// The console in a real browser: Debian's chromium, headless, driven by playwright-core (which downloads
// nothing), on the real proxy process serving the demo manifest. The page loads without a console error
// or CSP violation, shows the demo's services (one page of them), a request through the proxy shows in the
// live table within a second, the filters narrow the table and the trace, the trace pauses, client text
// is shown as text (never markup), and a screenshot is written (KUP_UI_SCREENSHOT=path for the README's).
// Runs in CI as root; skips only outside CI, without chromium or as another user.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { mkdtemp, rm, stat } from 'node:fs/promises';
import http from 'node:http';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { test } from 'node:test';
import { type BrowserContext, chromium, type Page } from 'playwright-core';
import { type DemoProxy, startDemoProxy } from '../helpers/demo-proxy.ts';
import { waitFor } from '../helpers/servers.ts';

const CHROMIUM = '/usr/bin/chromium';
const FLAGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];
const EXTRA = 100;

function skipReason(): string | false {
  if (process.env.CI) return false;
  if (!existsSync(CHROMIUM))
    return `${CHROMIUM} is missing (apt-get install -y --no-install-recommends chromium)`;
  if (process.getuid?.() !== 0) return 'not root (CI runs it as root)';
  return false;
}

/** One GET on its own connection. */
function get(port: number, path: string, localAddress?: string): Promise<void> {
  return new Promise((done, fail) => {
    http
      .get(
        { host: '127.0.0.1', port, path, localAddress, agent: false, headers: { host: 'shop.example' } },
        (res) => {
          res.resume();
          res.on('end', done);
        },
      )
      .on('error', fail);
  });
}

/** The text of the connection table's rows. */
const tableText = (page: Page) => page.locator('#connections-table tbody').innerText();

test('the live console in chromium', { skip: skipReason() }, async (t) => {
  const proxy: DemoProxy = await startDemoProxy({ extraServicePorts: EXTRA });
  t.after(() => proxy.stop());
  const profile = await mkdtemp(join(tmpdir(), 'kup-chromium-'));
  const context: BrowserContext = await chromium
    .launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      args: FLAGS,
      viewport: { width: 1400, height: 1000 },
    })
    .catch(async (err: unknown) => {
      await rm(profile, { recursive: true, force: true });
      throw err;
    });
  // The browser first: a profile removed under a running chromium is written again.
  t.after(async () => {
    await context.close();
    await rm(profile, { recursive: true, force: true });
  });
  const page = await context.newPage();
  const problems: string[] = [];
  page.on('console', (m) => {
    if (m.type() === 'error' || m.type() === 'warning') problems.push(`console ${m.type()}: ${m.text()}`);
  });
  page.on('pageerror', (err) => problems.push(`page error: ${err.message}`));
  page.on('requestfailed', (r) => {
    // The trace stream is cut when a filter changes: that abort is the page's own doing.
    if (!r.url().includes('/debug/trace'))
      problems.push(`request failed: ${r.url()} ${r.failure()?.errorText}`);
  });
  const echo = proxy.proxyPorts.get('demo/echo:http/TCP')!;
  const sticky = proxy.proxyPorts.get('demo/sticky:http/TCP')!;

  await t.test('loads and shows the demo services, one page of them', async () => {
    const res = await page.goto(`${proxy.metrics}/ui`);
    assert.equal(res?.status(), 200);
    assert.ok(page.url().endsWith('/ui/'), page.url());
    await page.locator('#services-table tbody tr.row').first().waitFor();
    const first = await page.locator('#services-table tbody tr.row td:first-child').allInnerTexts();
    assert.deepEqual(first.slice(0, 3), ['demo/echo:http TCP', 'demo/echo:udp UDP', 'demo/sticky:http TCP']);
    assert.equal(first.length, 50, 'one page, not a row per service port');
    assert.equal(await page.locator('#services-page').innerText(), `1–50 of ${EXTRA + 3}`);
    await page.locator('#sync .badge.ok').waitFor();
    assert.match(await page.locator('#sync').innerText(), /iptables-restore failures\s+n\/a/);
    // Six charts' worth of canvases: three totals, none in rows yet but the sparklines.
    assert.equal(await page.locator('#total-charts .uplot').count(), 3);
    await page.locator('#trace-status', { hasText: 'following' }).waitFor();
  });

  await t.test('a request through the proxy shows in the live table within a second', async () => {
    const path = `/within-a-second-${Date.now()}`;
    const t0 = performance.now();
    await get(echo, path);
    await page.locator('#connections-table tbody tr', { hasText: path }).waitFor({ timeout: 1000 });
    const ms = performance.now() - t0;
    t.diagnostic(`request to row in the table: ${ms.toFixed(0)} ms`);
    const row = await page.locator('#connections-table tbody tr', { hasText: path }).innerText();
    assert.match(row, /demo\/echo:http/);
    assert.match(row, /TCP\/http1/);
    assert.match(row, new RegExp(`GET ${path} host=shop\\.example 200`));
    assert.match(row, /client-fin|endpoint-fin/);
    // And in the trace.
    await page
      .locator('#trace li', { hasText: `GET ${path} host=shop.example 200` })
      .first()
      .waitFor({ timeout: 1000 });
  });

  await t.test('the filters narrow the table and the trace', async () => {
    await page.locator('#filters input[name=service]').fill('demo/sticky');
    await page.locator('#filters input[name=service]').press('Enter');
    const stickyPath = `/sticky-${Date.now()}`;
    await get(sticky, stickyPath);
    await get(echo, `/echo-${Date.now()}`);
    await page.locator('#connections-table tbody tr', { hasText: stickyPath }).waitFor({ timeout: 2000 });
    await waitFor(
      async () =>
        (await page.locator('#connections-table tbody tr.row td:nth-child(2)').allInnerTexts()).every(
          (s) => s === 'demo/sticky:http',
        ),
      3000,
      'only demo/sticky:http rows',
    );
    assert.doesNotMatch(await tableText(page), /demo\/echo/);
    await page.locator('#trace li', { hasText: stickyPath }).first().waitFor({ timeout: 2000 });
    assert.doesNotMatch(await page.locator('#trace').innerText(), /demo\/echo/);
    // Protocol and client too.
    await page.locator('#filters select[name=protocol]').selectOption('UDP');
    await page
      .locator('#connections-table tbody td', { hasText: 'no connections match' })
      .waitFor({ timeout: 3000 });
    await page.locator('#filters button[type=reset]').click();
    await get(echo, '/after-clear', '127.0.0.9');
    await page.locator('#connections-table tbody tr', { hasText: '127.0.0.9' }).waitFor({ timeout: 2000 });
  });

  await t.test('the trace pauses and resumes', async () => {
    await page.locator('#trace-pause').click();
    const path = `/while-paused-${Date.now()}`;
    await get(echo, path);
    await page.locator('#trace-status', { hasText: 'new events not shown' }).waitFor({ timeout: 2000 });
    assert.doesNotMatch(await page.locator('#trace').innerText(), new RegExp(path));
    await page.locator('#trace-pause').click();
    await page.locator('#trace li', { hasText: path }).first().waitFor({ timeout: 1000 });
  });

  await t.test('a service port opens to its endpoints and charts; a screenshot', async () => {
    await page.locator('#services-q').fill('demo');
    await waitFor(
      async () => (await page.locator('#services-table tbody tr.row').count()) === 3,
      3000,
      'the three demo service ports',
    );
    await page.locator('#services-table tbody tr.row', { hasText: 'demo/echo:http' }).click();
    const detail = page.locator('#services-table tr.detail');
    await detail.waitFor();
    await detail.locator('td', { hasText: '127.0.0.11:' }).first().waitFor();
    assert.match(await detail.innerText(), /127\.0\.0\.12:\d+\s+ready/);
    assert.equal(await detail.locator('.uplot').count(), 3);
    // A few seconds of traffic, so that the charts have lines (samples are 2 s apart).
    const until = Date.now() + 7000;
    for (let i = 0; Date.now() < until; i++) {
      await get(i % 3 === 0 ? sticky : echo, ['/api/items', '/cart', '/checkout', '/healthz'][i % 4]!);
      await new Promise((r) => setTimeout(r, 120));
    }
    await page.waitForTimeout(2200);
    const picks = await detail.locator('tbody tr td.num').allInnerTexts();
    assert.ok(
      picks.every((p) => Number(p) > 0),
      `picks ${picks}`,
    );
    const file = process.env.KUP_UI_SCREENSHOT
      ? resolve(process.env.KUP_UI_SCREENSHOT)
      : join(profile, 'ui.png');
    await page.screenshot({ path: file, fullPage: true });
    assert.ok((await stat(file)).size > 20_000);
    t.diagnostic(`screenshot: ${file}`);
  });

  await t.test('client text is text: no markup, no reordering', async () => {
    const hostile = '/<img/src=x/onerror=window.__pwned=1>\u202Eevil';
    const reply = await new Promise<string>((done) => {
      const socket = net.connect({ host: '127.0.0.1', port: echo }, () =>
        socket.end(Buffer.from(`GET ${hostile} HTTP/1.1\r\nHost: x\r\n\r\n`, 'utf8')),
      );
      let text = '';
      socket.on('data', (d) => {
        text += d;
      });
      socket.on('error', () => {});
      socket.on('close', () => done(text));
      socket.setTimeout(3000, () => socket.destroy());
    });
    t.diagnostic(`the pod answered: ${reply.split('\r\n')[0]}`);
    await page
      .locator('#connections-table tbody tr', { hasText: '<img/src=x/onerror=window.__pwned=1>' })
      .first()
      .waitFor({ timeout: 2000 });
    const found = {
      images: await page.locator('#connections-table img, #trace img').count(),
      pwned: await page.evaluate(() => (globalThis as { __pwned?: number }).__pwned),
      bidi: (await page.locator('body').innerText()).includes('\u202E'),
    };
    assert.deepEqual(found, { images: 0, pwned: undefined, bidi: false });
  });

  assert.deepEqual(problems, []);
});
