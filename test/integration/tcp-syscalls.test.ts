// What one proxied connection costs in system calls, counted by strace on the proxy as users run it
// (the bin, a manifest, --workers 1): the native relay's path, accept to close. Every call here is on
// every connection's path, so a call added to it shows up as one per connection. The budget holds the
// three the relay no longer makes: SO_ERROR after a connect that epoll reported clean (only a failed
// connect is asked which error), TCP_CORK on and off around the answer that leaves with the FIN
// (MSG_MORE on its send holds it instead), and the peek for the end of stream after a FIN that came with
// no error pending; and the epoll_ctl calls of a level-triggered watch (a MOD of each side at the
// connect, a DEL at an end of stream): each side is added once, edge-triggered, and stays till its close.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { requireRootOrSkip } from '../helpers/netns.ts';
import { startProxyProcess } from '../helpers/proxy-process.ts';
import { waitFor } from '../helpers/servers.ts';

const CONNECTIONS = 200;

/** One connection through `port`: a request, the whole answer (the endpoint's 'pod' and its FIN), close. */
function roundTrip(port: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, '127.0.0.1', () => socket.end('GET / HTTP/1.0\r\n\r\n'));
    let text = '';
    socket.setTimeout(5000, () => socket.destroy(new Error('no answer in 5 s')));
    socket.on('data', (d) => {
      text += String(d);
    });
    socket.on('error', reject);
    socket.on('close', () => resolve(text));
  });
}

/**
 * strace -f's trace: calls by system call name (a call another thread interrupted is counted once, at its
 * start), and the recvfrom calls that peek.
 */
function parseTrace(text: string): { calls: Map<string, number>; peeks: number } {
  const calls = new Map<string, number>();
  let peeks = 0;
  for (const line of text.split('\n')) {
    // "1234  recvfrom(21, ..." or "1234  <... recvfrom resumed>..." (not counted again)
    const call = /^\d+\s+([a-z_0-9]+)\(/.exec(line);
    if (call === null) continue;
    const name = call[1] as string;
    calls.set(name, (calls.get(name) ?? 0) + 1);
    if (name === 'recvfrom' && line.includes('MSG_PEEK')) peeks++;
  }
  return { calls, peeks };
}

test('a proxied connection makes no SO_ERROR, TCP_CORK or end-of-stream peek call, and adds each side to epoll once', async (t) => {
  if (!requireRootOrSkip(t)) return; // strace attaches to a process that is not its child
  const proxy = await startProxyProcess({ extraArgs: ['--workers=1'] });
  t.after(() => proxy.stop());
  // Warm: the first connections compile the path.
  for (let i = 0; i < 20; i++) assert.equal(await roundTrip(proxy.ports.proxy), 'pod');
  const dir = await mkdtemp(join(tmpdir(), 'kup-strace-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const out = join(dir, 'trace.txt');
  const strace = spawn('strace', ['-f', '-o', out, '-p', String(proxy.child.pid)], { stdio: 'pipe' });
  let straceErr = '';
  strace.stderr.on('data', (d) => {
    straceErr += String(d);
  });
  const exited = new Promise<void>((resolve) => strace.once('exit', () => resolve()));
  const spawned = await new Promise<Error | undefined>((resolve) => {
    strace.once('spawn', () => resolve(undefined));
    strace.once('error', resolve);
  });
  assert.equal(spawned, undefined, 'strace is installed (CI: .ci/run installs it)');
  // Attached once strace says so for the main thread (its thread id is the process id).
  const mainAttached = new RegExp(`Process ${proxy.child.pid} attached`);
  await waitFor(() => mainAttached.test(straceErr), 10_000, 'strace attached to the main thread');
  for (let i = 0; i < CONNECTIONS; i++) assert.equal(await roundTrip(proxy.ports.proxy), 'pod');
  // The relay's last events (the client's close) come after the client's 'close'.
  await new Promise((r) => setTimeout(r, 200));
  strace.kill('SIGINT');
  await exited; // SIGINT: it detaches
  const { calls, peeks } = parseTrace(await readFile(out, 'utf8'));
  assert.ok(calls.size > 0, `strace's trace: ${straceErr}`);
  const per = (name: string) => (calls.get(name) ?? 0) / CONNECTIONS;
  t.diagnostic(
    `per connection: ${[...calls]
      .filter(([, n]) => n >= CONNECTIONS / 2)
      .map(([name, n]) => `${name} ${(n / CONNECTIONS).toFixed(2)}`)
      .join(', ')}`,
  );
  // Every connection was relayed natively: one socket and one connect each.
  assert.ok(per('connect') >= 1 && per('connect') < 1.1, `connect ${per('connect')}`);
  // TCP_NODELAY on the dialled socket; was 2 (+ TCP_CORK on, and off again when the FIN was not next).
  assert.ok(per('setsockopt') < 1.1, `setsockopt ${per('setsockopt')} a connection`);
  // Was 1 (SO_ERROR after every connect).
  assert.ok(per('getsockopt') < 0.1, `getsockopt ${per('getsockopt')} a connection`);
  // Was 1 (recv MSG_PEEK for the end of stream behind the answer).
  assert.ok(peeks / CONNECTIONS < 0.1, `${peeks / CONNECTIONS} peeks a connection`);
  // The relay reads with recv(), not read() (a socket's read() takes the VFS's way to the same
  // sock_recvmsg): the request and its answer (the ends of stream come with EPOLLRDHUP), none through read().
  assert.ok(per('recvfrom') >= 2, `recvfrom ${per('recvfrom')} a connection`);
  assert.ok(per('read') < 0.5, `read ${per('read')} a connection`);
  // An ADD for each side; was 5 (the client's and the endpoint's MOD at the connect, a DEL at the end of
  // stream).
  assert.ok(per('epoll_ctl') < 2.1, `epoll_ctl ${per('epoll_ctl')} a connection`);
});
