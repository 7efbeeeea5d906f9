// ServiceHealthServer on real loopback sockets: 200 with the local endpoint count, 503 without endpoints
// or when the proxy is unhealthy, any path, a port change closes the old server, a taken port is retried.
import assert from 'node:assert/strict';
import http from 'node:http';
import net, { type AddressInfo } from 'node:net';
import { type TestContext, test } from 'node:test';
import { pino } from 'pino';
import { ServiceHealthServer } from '../../src/server/service-health.ts';

type Reply = { status: number; headers: http.IncomingHttpHeaders; body: unknown };

function get(port: number, path = '/'): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = http.get({ host: '127.0.0.1', port, path, agent: false }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        text += chunk;
      });
      res.on('end', () =>
        resolve({ status: res.statusCode ?? 0, headers: res.headers, body: JSON.parse(text) }),
      );
    });
    req.on('error', reject);
    req.setTimeout(2000, () => req.destroy(new Error('timeout')));
  });
}

/** A port that was free a moment ago (the kernel does not hand it out again at once). */
async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

function setup(t: TestContext, bindAddresses: string[] | undefined = ['127.0.0.1']) {
  const lines: { level: number; msg: string; port?: number }[] = [];
  const log = pino({ level: 'debug' }, { write: (s: string) => lines.push(JSON.parse(s)) });
  const hcs = new ServiceHealthServer({ log, bindAddresses });
  t.after(() => hcs.close());
  return { hcs, lines };
}

const web = { namespace: 'default', name: 'web' };

test('200 with the local endpoint count, 503 with none, on any path', async (t) => {
  const { hcs } = setup(t);
  const [p1, p2] = [await freePort(), await freePort()];
  await hcs.syncServices(
    new Map([
      [p1, web],
      [p2, { namespace: 'shop', name: 'cart' }],
    ]),
  );
  hcs.syncEndpoints(new Map([['default/web', 2]]));

  const ok = await get(p1, '/anything/at/all?x=1');
  assert.equal(ok.status, 200);
  assert.equal(ok.headers['content-type'], 'application/json');
  assert.equal(ok.headers['x-content-type-options'], 'nosniff');
  assert.equal(ok.headers['x-load-balancing-endpoint-weight'], '2');
  assert.deepEqual(ok.body, { service: web, localEndpoints: 2, serviceProxyHealthy: true });

  const none = await get(p2);
  assert.equal(none.status, 503);
  assert.equal(none.headers['x-load-balancing-endpoint-weight'], '0');
  assert.deepEqual(none.body, {
    service: { namespace: 'shop', name: 'cart' },
    localEndpoints: 0,
    serviceProxyHealthy: true,
  });

  hcs.syncEndpoints(new Map([['default/web', 0]]));
  assert.equal((await get(p1)).status, 503);
});

test('503 while the proxy is unhealthy, even with local endpoints', async (t) => {
  const { hcs } = setup(t);
  const port = await freePort();
  await hcs.syncServices(new Map([[port, web]]));
  hcs.syncEndpoints(new Map([['default/web', 3]]));
  hcs.setProxyHealthy(false);
  const sick = await get(port);
  assert.equal(sick.status, 503);
  assert.equal(sick.headers['x-load-balancing-endpoint-weight'], '3');
  assert.deepEqual(sick.body, { service: web, localEndpoints: 3, serviceProxyHealthy: false });
  hcs.setProxyHealthy(true);
  assert.equal((await get(port)).status, 200);
});

test('a port change closes the old server; a removed service closes its server', async (t) => {
  const { hcs, lines } = setup(t);
  const [p1, p2] = [await freePort(), await freePort()];
  hcs.syncEndpoints(new Map([['default/web', 1]]));
  await hcs.syncServices(new Map([[p1, web]]));
  assert.equal((await get(p1)).status, 200);
  await hcs.syncServices(new Map([[p2, web]]));
  await assert.rejects(get(p1), { code: 'ECONNREFUSED' });
  assert.equal((await get(p2)).status, 200);
  assert.deepEqual(hcs.listeningPorts, [p2]);
  await hcs.syncServices(new Map());
  await assert.rejects(get(p2), { code: 'ECONNREFUSED' });
  assert.deepEqual(
    lines.filter((l) => l.msg.includes('service health check')).map((l) => `${l.msg} ${l.port}`),
    [
      `Opened service health check ${p1}`,
      `Closed service health check ${p1}`,
      `Opened service health check ${p2}`,
      `Closed service health check ${p2}`,
    ],
  );
});

test('a taken port is warned about once and retried at each sync until it is free', async (t) => {
  const { hcs, lines } = setup(t);
  const blocker = net.createServer();
  await new Promise<void>((resolve) => blocker.listen(0, '127.0.0.1', resolve));
  t.after(() => new Promise<void>((resolve) => blocker.close(() => resolve())));
  const { port } = blocker.address() as AddressInfo;
  hcs.syncEndpoints(new Map([['default/web', 1]]));
  const wanted = new Map([[port, web]]);

  await hcs.syncServices(wanted);
  await hcs.syncServices(wanted);
  assert.deepEqual(hcs.listeningPorts, []);
  const failures = lines.filter((l) => l.msg.startsWith('Failed to start service health check'));
  assert.deepEqual(
    failures.map((l) => l.level),
    [40, 20],
    'warn once, then debug',
  );

  await new Promise<void>((resolve) => blocker.close(() => resolve()));
  await hcs.syncServices(wanted);
  assert.deepEqual(hcs.listeningPorts, [port]);
  assert.equal((await get(port)).status, 200);
});

test('all addresses by default; close() releases every port and later syncs do nothing', async (t) => {
  const { hcs } = setup(t, undefined);
  const port = await freePort();
  hcs.syncEndpoints(new Map([['default/web', 1]]));
  await hcs.syncServices(new Map([[port, web]]));
  assert.equal((await get(port)).status, 200);
  await hcs.close();
  await assert.rejects(get(port), { code: 'ECONNREFUSED' });
  await hcs.syncServices(new Map([[port, web]]));
  assert.deepEqual(hcs.listeningPorts, []);
  await hcs.close();
});
