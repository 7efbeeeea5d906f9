// The PROXY protocol on loopback (--no-iptables): the endpoints of an annotated Service get a header
// naming the client and the listener it connected to, before any byte of the client's; other Services
// get none; a bad value is one warning and no header; a change applies to new connections only; and a
// real server (nginx, `listen … proxy_protocol`) reads what we send.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import type { ProxyProtocolMode } from '../../src/config/config.ts';
import { ANNOTATION_PROXY_PROTOCOL } from '../../src/lib/kubernetes-labels.ts';
import { service, slice, startManifestProxy } from '../helpers/manifests.ts';
import { freePort } from '../helpers/proxy-process.ts';
import { type ProxyHeader, proxyProtocolServer } from '../helpers/proxy-protocol-parser.ts';
import { waitFor } from '../helpers/servers.ts';

type After = { after(fn: () => unknown): void };

/** A Service on `clusterIP` whose one endpoint is 127.0.0.1:`port`, annotated with `pp` unless undefined. */
function annotated(name: string, clusterIP: string, port: number, pp: string | undefined) {
  const svc = service(name, clusterIP, [{ name: 'tcp', port: 80, targetPort: port }]);
  return [
    pp === undefined
      ? svc
      : { ...svc, metadata: { ...svc.metadata, annotations: { [ANNOTATION_PROXY_PROTOCOL]: pp } } },
    slice(name, `${name}-1`, [{ ip: '127.0.0.1' }], [{ name: 'tcp', port }]),
  ];
}

/** A backend that records the header (or its absence) and answers it as JSON. */
async function backend(t: After) {
  const b = await proxyProtocolServer('127.0.0.1', (header, rest) =>
    JSON.stringify({ header: header ?? null, rest: rest.toString('latin1') }),
  );
  t.after(() => b.server.close());
  return b;
}

/** Connects to `port`, sends one line once connected, and reads the answer; `localPort` is ours. */
function ask(
  port: number,
  line = 'hello\n',
  host = '127.0.0.1',
): Promise<{ header: ProxyHeader | null; rest: string; localPort: number }> {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host, port });
    const chunks: Buffer[] = [];
    const timer = setTimeout(() => socket.destroy(new Error(`no answer from ${port}`)), 5000);
    socket.on('connect', () => socket.write(line));
    socket.on('data', (c) => chunks.push(c));
    socket.on('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
    socket.on('end', () => {
      clearTimeout(timer);
      const localPort = socket.localPort ?? 0;
      socket.destroy();
      try {
        resolve({ ...JSON.parse(Buffer.concat(chunks).toString()), localPort });
      } catch (err) {
        reject(err);
      }
    });
  });
}

test('annotated v1 and v2: the client and the listener it reached, before its bytes; others get none', async (t) => {
  const [b1, b2, b3, b4] = await Promise.all([backend(t), backend(t), backend(t), backend(t)]);
  const proxy = await startManifestProxy([
    ...annotated('pp1', '10.96.0.1', b1.port, 'v1'),
    ...annotated('pp2', '10.96.0.2', b2.port, 'v2'),
    ...annotated('plain', '10.96.0.3', b3.port, undefined),
    ...annotated('bad', '10.96.0.4', b4.port, 'V2 please'),
  ]);
  t.after(() => proxy.close());
  const keys = ['pp1', 'pp2', 'plain', 'bad'].map((n) => `default/${n}:tcp/TCP`);
  await waitFor(() => keys.every((k) => proxy.proxyPort(k) !== undefined), 5000, 'four service ports');
  const [p1, p2, p3, p4] = keys.map((k) => proxy.proxyPort(k)!) as [number, number, number, number];

  const v1 = await ask(p1);
  assert.deepEqual(v1.header, {
    version: 1,
    family: 'TCP4',
    source: '127.0.0.1',
    sourcePort: v1.localPort,
    destination: '127.0.0.1',
    destinationPort: p1,
  });
  assert.equal(v1.rest, 'hello\n', 'the client bytes follow the header untouched');
  const v2 = await ask(p2, 'binary?\n');
  assert.deepEqual(v2.header, {
    version: 2,
    family: 'TCP4',
    source: '127.0.0.1',
    sourcePort: v2.localPort,
    destination: '127.0.0.1',
    destinationPort: p2,
  });
  assert.equal(v2.rest, 'binary?\n');
  // Our header never reaches a Service that did not ask for it.
  const plain = await ask(p3);
  assert.equal(plain.header, null);
  assert.equal(plain.rest, 'hello\n');
  // A bad value: served, without the header, and one warning naming the Service.
  const bad = await ask(p4);
  assert.equal(bad.header, null);
  assert.equal(bad.rest, 'hello\n');
  const warnings = proxy.logs.filter((l) => l.includes('Ignoring unknown proxy-protocol annotation value'));
  assert.equal(warnings.length, 1, warnings.join(''));
  assert.match(warnings[0]!, /"service":"default\/bad"/);
  assert.match(warnings[0]!, /"value":"V2 please"/);
  // /debug/services says which service ports send it.
  const debug = proxy.server.proxier.status();
  const pp = (name: string) => debug.find((s) => s.servicePort.serviceName === name)?.proxyProtocol;
  assert.deepEqual(['pp1', 'pp2', 'plain', 'bad'].map(pp), ['v1', 'v2', undefined, undefined]);
  // So does the console; and the connection table records the client's bytes, not our header.
  const base = `http://127.0.0.1:${proxy.server.metricsServer!.port}`;
  const ui = (await (await fetch(`${base}/ui/api/services?limit=50&expand=default/pp1:tcp/TCP`)).json()) as {
    detail?: { proxyProtocol?: string };
  };
  assert.equal(ui.detail?.proxyProtocol, 'v1');
  const rows = proxy.server.connections.list({ service: 'default/pp1:tcp', state: 'closed' }).recent;
  assert.equal(rows.length, 1);
  assert.equal(rows[0]!.bytesFromClient, 'hello\n'.length);
});

test('--proxy-protocol is the default of Services without the annotation; `off` turns it off for one', async (t) => {
  const [b1, b2] = await Promise.all([backend(t), backend(t)]);
  const proxy = await startManifestProxy(
    [...annotated('dflt', '10.96.0.1', b1.port, undefined), ...annotated('off', '10.96.0.2', b2.port, 'off')],
    { proxyProtocol: 'v2' },
  );
  t.after(() => proxy.close());
  const keys = ['dflt', 'off'].map((n) => `default/${n}:tcp/TCP`);
  await waitFor(() => keys.every((k) => proxy.proxyPort(k) !== undefined), 5000, 'both service ports');
  assert.equal((await ask(proxy.proxyPort(keys[0]!)!)).header?.version, 2);
  assert.equal((await ask(proxy.proxyPort(keys[1]!)!)).header, null);
});

test('a changed annotation applies to new connections; one already accepted keeps what it had', async (t) => {
  const b = await backend(t);
  const objects = (pp: string | undefined) => annotated('web', '10.96.0.1', b.port, pp);
  const proxy = await startManifestProxy(objects('v1'));
  t.after(() => proxy.close());
  const key = 'default/web:tcp/TCP';
  await waitFor(() => proxy.proxyPort(key) !== undefined, 5000, 'web to open');
  const port = proxy.proxyPort(key)!;
  const status = () => proxy.server.proxier.get(key as never)?.proxyProtocol;

  // Accepted and relayed under v1, its line sent only after the change to v2.
  const early = net.connect({ host: '127.0.0.1', port });
  t.after(() => early.destroy());
  await new Promise((r) => early.once('connect', r));
  await waitFor(
    () => proxy.server.proxier.status()[0]!.context.stats.active === 1,
    3000,
    'the connection to be relayed',
  );
  await proxy.write(objects('v2'));
  await waitFor(() => status() === 'v2', 5000, 'the change to v2');
  const answer = new Promise<string>((resolve) => {
    const chunks: Buffer[] = [];
    early.on('data', (c) => chunks.push(c));
    early.on('end', () => resolve(Buffer.concat(chunks).toString()));
  });
  early.write('late\n');
  const earlyHeader = JSON.parse(await answer) as { header: ProxyHeader | null; rest: string };
  assert.equal(earlyHeader.header?.version, 1, 'one header, the one of its accept; none added mid-stream');
  assert.equal(earlyHeader.rest, 'late\n');
  assert.equal((await ask(port)).header?.version, 2, 'a new connection: v2');

  // Removed: new connections get none.
  await proxy.write(objects(undefined));
  await waitFor(() => status() === undefined, 5000, 'the annotation to go');
  assert.equal((await ask(port)).header, null);
});

/** nginx from Debian, if installed: its binary path. */
function nginxBinary(): string | undefined {
  for (const path of ['/usr/sbin/nginx', '/usr/bin/nginx'])
    if (spawnSync(path, ['-v']).status === 0) return path;
  return undefined;
}

test('a real PROXY protocol server: nginx `listen … proxy_protocol` logs and answers the client address', async (t) => {
  const nginx = nginxBinary();
  if (nginx === undefined) {
    assert.ok(process.env.CI === undefined, 'CI installs nginx (.ci/run)');
    t.skip('nginx is not installed');
    return;
  }
  const dir = await mkdtemp(join(tmpdir(), 'kup-pp-nginx-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const port = await freePort();
  await writeFile(
    join(dir, 'nginx.conf'),
    `master_process off;
error_log ${dir}/error.log;
pid ${dir}/nginx.pid;
events { worker_connections 64; }
http {
  client_body_temp_path ${dir}/body;
  proxy_temp_path ${dir}/proxy;
  fastcgi_temp_path ${dir}/fastcgi;
  uwsgi_temp_path ${dir}/uwsgi;
  scgi_temp_path ${dir}/scgi;
  log_format pp '$proxy_protocol_addr:$proxy_protocol_port -> $proxy_protocol_server_addr:$proxy_protocol_server_port "$request"';
  server {
    listen 127.0.0.1:${port} proxy_protocol;
    access_log ${dir}/access.log pp;
    location / { return 200 "$proxy_protocol_addr $proxy_protocol_port $proxy_protocol_server_addr $proxy_protocol_server_port\n"; }
  }
}
`,
  );
  const child = spawn(nginx, ['-p', dir, '-c', join(dir, 'nginx.conf'), '-g', 'daemon off;'], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  child.stderr.on('data', (d) => (stderr += String(d)));
  // One process (master_process off): a master killed would leave its worker behind, orphaned, still
  // listening (every run of this test left one until it was a single process).
  t.after(async () => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((resolve) => child.once('exit', resolve));
    child.kill('SIGKILL');
    await exited;
  });
  await waitFor(
    () =>
      new Promise<boolean>((resolve) => {
        const s = net.connect({ host: '127.0.0.1', port });
        s.on('connect', () => resolve(s.destroy() === s));
        s.on('error', () => resolve(false));
      }),
    10_000,
    `nginx to listen (${stderr})`,
  );
  const objects = (pp: ProxyProtocolMode) => annotated('web', '10.96.0.1', port, pp);
  const proxy = await startManifestProxy([...objects('v1'), ...annotated('web2', '10.96.0.2', port, 'v2')]);
  t.after(() => proxy.close());
  const keys = ['web', 'web2'].map((n) => `default/${n}:tcp/TCP`);
  await waitFor(() => keys.every((k) => proxy.proxyPort(k) !== undefined), 5000, 'both service ports');
  for (const key of keys) {
    const proxyPort = proxy.proxyPort(key)!;
    const res = await fetch(`http://127.0.0.1:${proxyPort}/${key.includes('web2') ? 'v2' : 'v1'}`);
    assert.equal(res.status, 200, `nginx accepted our ${key} header`);
    const [addr, clientPort, serverAddr, serverPort] = (await res.text()).trim().split(' ');
    assert.equal(addr, '127.0.0.1');
    assert.ok(Number(clientPort) > 0 && Number(clientPort) !== port);
    assert.equal(serverAddr, '127.0.0.1');
    assert.equal(Number(serverPort), proxyPort, 'the destination is the listener the client reached');
  }
  await waitFor(
    async () =>
      ((await readFile(join(dir, 'access.log'), 'utf8').catch(() => '')).match(/\n/g) ?? []).length >= 2,
    5000,
    'the access log',
  );
  const log = await readFile(join(dir, 'access.log'), 'utf8');
  assert.match(
    log,
    new RegExp(
      `^127\\.0\\.0\\.1:\\d+ -> 127\\.0\\.0\\.1:${proxy.proxyPort(keys[0]!)} "GET /v1 HTTP/1\\.1"$`,
      'm',
    ),
  );
  assert.match(
    log,
    new RegExp(
      `^127\\.0\\.0\\.1:\\d+ -> 127\\.0\\.0\\.1:${proxy.proxyPort(keys[1]!)} "GET /v2 HTTP/1\\.1"$`,
      'm',
    ),
  );
});
