// One-off Node programs run inside a test namespace (backends that stream, hold or echo; clients that
// open thousands of connections or UDP ports), for the fault suite. Each prints JSON lines on stdout and
// may read command lines on stdin. Node raises its own soft descriptor limit to the hard one.
import type { ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import type { Sandbox } from './netns.ts';

/** A script running in a namespace: its JSON output lines, and a way to talk to it. */
export class Script {
  readonly child: ChildProcess;
  readonly lines: Record<string, unknown>[] = [];
  readonly exited: Promise<number | null>;
  readonly #waiters = new Set<() => void>();
  stderr = '';

  constructor(sandbox: Sandbox, ns: string, code: string, args: unknown) {
    this.child = sandbox.spawnIn(ns, process.execPath, ['-e', code, JSON.stringify(args)]);
    this.child.stderr?.on('data', (d) => {
      this.stderr = (this.stderr + String(d)).slice(-4000);
    });
    createInterface({ input: this.child.stdout! }).on('line', (line) => {
      try {
        this.lines.push(JSON.parse(line) as Record<string, unknown>);
      } catch {
        return;
      }
      for (const w of this.#waiters) w();
    });
    this.exited = new Promise((resolve) => this.child.once('exit', (code) => resolve(code)));
    this.exited.then(() => {
      for (const w of this.#waiters) w();
    });
  }

  /** The first output line with `key` set, once it comes (rejects on exit or after `timeoutMs`). */
  wait<T = Record<string, unknown>>(key: string, timeoutMs = 30_000): Promise<T> {
    return new Promise((resolve, reject) => {
      const check = () => {
        const line = this.lines.find((l) => l[key] !== undefined);
        if (line !== undefined) {
          done();
          resolve(line as T);
        } else if (this.child.exitCode !== null || this.child.signalCode !== null) {
          done();
          reject(
            new Error(
              `script exited (${this.child.exitCode ?? this.child.signalCode}) before "${key}": ${this.stderr}`,
            ),
          );
        }
      };
      const timer = setTimeout(() => {
        done();
        reject(new Error(`no "${key}" from the script within ${timeoutMs} ms: ${this.stderr}`));
      }, timeoutMs);
      const done = () => {
        clearTimeout(timer);
        this.#waiters.delete(check);
      };
      this.#waiters.add(check);
      check();
    });
  }

  #next = 1;

  /** Sends `{id, op, args}` and resolves with the answer line `{id, ...}` (scripts that take requests). */
  async request<T = Record<string, unknown>>(op: string, args: unknown = {}, timeoutMs = 10_000): Promise<T> {
    const id = this.#next++;
    this.send(JSON.stringify({ id, op, args }));
    const line = await this.wait<Record<string, unknown>>(`reply${id}`, timeoutMs);
    if (line['error'] !== undefined) throw new Error(`${op}: ${String(line['error'])}`);
    return line as T;
  }

  send(line: string): void {
    this.child.stdin?.write(`${line}\n`);
  }

  kill(signal: NodeJS.Signals = 'SIGKILL'): void {
    this.child.kill(signal);
  }
}

/** TCP server on `port`: `stream` writes 64 KiB every 5 ms up to `bytes`; `hold` writes "x" and keeps
 * the connection; `echo` echoes and ends when the client does. Prints {listening}. */
export const TCP_SERVER = `
const net = require('node:net');
const { port, mode, bytes = 64 << 20 } = JSON.parse(process.argv[1]);
const chunk = Buffer.alloc(64 << 10, 120);
const server = net.createServer({ allowHalfOpen: true }, (s) => {
  s.on('error', () => {});
  if (mode === 'hold') s.write('x');
  else if (mode === 'echo') s.pipe(s);
  else {
    let sent = 0;
    const timer = setInterval(() => {
      if (sent >= bytes || s.destroyed) { clearInterval(timer); s.end(); return; }
      s.write(chunk); sent += chunk.length;
    }, 5);
    s.on('close', () => clearInterval(timer));
  }
});
server.maxConnections = 100000;
server.listen({ host: '::', port, backlog: 8192 }, () => console.log(JSON.stringify({ listening: port })));
`;

/** Reads one connection to the end: prints {first} on the first byte, then {done, bytes, how, ms}. */
export const STREAM_CLIENT = `
const net = require('node:net');
const { host, port } = JSON.parse(process.argv[1]);
const started = Date.now();
let bytes = 0, first = 0, how = '';
const s = net.connect({ host, port });
s.on('data', (d) => { bytes += d.length; if (!first) { first = Date.now(); console.log(JSON.stringify({ first: bytes })); } });
s.on('end', () => { how ||= 'end'; });
s.on('error', (e) => { how ||= e.code || 'error'; });
s.on('close', () => {
  console.log(JSON.stringify({ done: true, bytes, how: how || 'close', msAfterFirst: Date.now() - first, ms: Date.now() - started }));
  process.exit(0);
});
`;

/**
 * Opens `count` connections (`batch` at a time), each sending "ping" and expecting it back (`expect`
 * "echo") or one "x" (`expect` "x"); prints {ready, ok, failed, closed}, holds them until a "close" line on
 * stdin, then prints {done}.
 */
export const MANY_TCP = `
const net = require('node:net');
const { host, port, count, batch = 500, expect = 'echo', timeoutMs = 10000 } = JSON.parse(process.argv[1]);
const sockets = [];
const counts = { ok: 0, failed: 0, closedEarly: 0 };
function one() {
  return new Promise((resolve) => {
    const s = net.connect({ host, port });
    sockets.push(s);
    let got = '', settled = false;
    const settle = (how) => { if (settled) return; settled = true; clearTimeout(t); counts[how]++; resolve(); };
    const t = setTimeout(() => settle('failed'), timeoutMs);
    s.on('connect', () => { if (expect === 'echo') s.write('ping'); });
    s.on('data', (d) => { got += d; if ((expect === 'echo' && got === 'ping') || (expect === 'x' && got === 'x')) settle('ok'); });
    s.on('error', () => {});
    s.on('close', () => settle('closedEarly'));
  });
}
(async () => {
  for (let i = 0; i < count; i += batch) await Promise.all(Array.from({ length: Math.min(batch, count - i) }, one));
  console.log(JSON.stringify({ ready: true, ...counts }));
})();
require('node:readline').createInterface({ input: process.stdin }).on('line', (line) => {
  if (line !== 'close') return;
  for (const s of sockets) s.destroy();
  setTimeout(() => { console.log(JSON.stringify({ done: true })); process.exit(0); }, 100);
});
`;

/**
 * Sends one datagram from each of `count` fresh UDP sockets, `batch` at a time `waitMs` apart, to
 * host:port; every socket stays open to the end, so each is its own client port. Prints {done, sent,
 * replies, ports} (distinct source ports used).
 */
export const UDP_BURST = `
const dgram = require('node:dgram');
const { host, port, count, batch = 1000, waitMs = 100 } = JSON.parse(process.argv[1]);
let sent = 0, replies = 0;
const ports = new Set();
const all = [];
(async () => {
  for (let i = 0; i < count; i += batch) {
    const sockets = [];
    const sends = [];
    for (let j = 0; j < Math.min(batch, count - i); j++) {
      const u = dgram.createSocket('udp4');
      u.on('error', () => {});
      u.on('message', () => replies++);
      sockets.push(u);
      sends.push(new Promise((resolve) => u.bind(0, () => {
        ports.add(u.address().port);
        u.send('q', port, host, () => { sent++; resolve(); });
      })));
    }
    await Promise.all(sends);
    await new Promise((r) => setTimeout(r, waitMs));
    all.push(...sockets);
  }
  for (const u of all) u.close();
  console.log(JSON.stringify({ done: true, sent, replies, ports: ports.size }));
  process.exit(0);
})();
`;

/**
 * The stand-in API server (test/helpers/fake-apiserver.ts) as a process in a namespace, so that a proxy in
 * that namespace can reach it on loopback. Prints {ready, kubeconfig}; then takes requests
 * `{id, op, args}` (create, update, remove with `makeService`/`makeEndpointSlice` arguments; stop,
 * restart, expireHistory, cutWatches, setFailing) and answers `{replyN: true}`.
 */
export const FAKE_API = `
const { mkdtempSync } = require('node:fs');
const { tmpdir } = require('node:os');
const { join } = require('node:path');
const { module, token } = JSON.parse(process.argv[1]);
(async () => {
  const f = await import(module);
  const api = await f.startFakeApiServer({ token });
  const kubeconfig = await api.writeKubeconfig(mkdtempSync(join(tmpdir(), 'kup-fake-api-')));
  const build = (a) => a.kind === 'Service'
    ? f.makeService(a.namespace, a.name, a.spec)
    : f.makeEndpointSlice(a.namespace, a.name, a.service, a.endpoints, a.ports);
  const ops = {
    create: (a) => api.create(build(a)),
    update: (a) => api.update(build(a)),
    remove: (a) => api.remove(a.kind, a.namespace, a.name),
    stop: () => api.stop(),
    restart: () => api.restart(),
    expireHistory: () => api.expireHistory(),
    cutWatches: () => api.cutWatches(),
    setFailing: (a) => api.setFailing(a.status),
    requests: () => ({ count: api.requests.length }),
  };
  require('node:readline').createInterface({ input: process.stdin }).on('line', async (line) => {
    const { id, op, args } = JSON.parse(line);
    try {
      const r = await ops[op](args);
      console.log(JSON.stringify({ ['reply' + id]: true, ...(op === 'requests' ? r : {}) }));
    } catch (e) {
      console.log(JSON.stringify({ ['reply' + id]: true, error: e.message }));
    }
  });
  console.log(JSON.stringify({ ready: true, kubeconfig, url: api.url }));
})();
`;
