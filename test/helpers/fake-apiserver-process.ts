// The stand-in API server (fake-apiserver.ts) in a child process, for tests that measure the proxy's own
// event loop: an endless answer written in the same process would share (and stall) it. Commands go in as
// JSON lines on stdin, one reply line each; the child exits with its stdin.
import { type ChildProcess, spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import type { ApiObject, HostileMode, HostileOptions } from './fake-apiserver.ts';

const CHILD = `
const { mkdtempSync, rmSync } = require('node:fs');
const { tmpdir } = require('node:os');
const { join } = require('node:path');
(async () => {
  const f = await import(process.argv[1]);
  const api = await f.startFakeApiServer();
  const dir = mkdtempSync(join(tmpdir(), 'kup-fake-api-'));
  process.on('exit', () => rmSync(dir, { recursive: true, force: true }));
  const kubeconfig = await api.writeKubeconfig(dir);
  const ops = {
    create: (obj) => api.create(obj),
    update: (obj) => api.update(obj),
    hostile: ({ mode, options }) => api.hostile(mode, options),
    expireHistory: () => api.expireHistory(),
    closeWatches: () => api.closeWatches(),
    sendBookmark: () => api.sendBookmark(),
    stats: () => ({
      hostileBytes: api.hostileBytes,
      requests: api.requests.map((r) => ({ verb: r.verb, path: r.path })),
    }),
  };
  require('node:readline').createInterface({ input: process.stdin }).on('line', async (line) => {
    const { id, op, args } = JSON.parse(line);
    let reply;
    try {
      reply = { id, value: (await ops[op](args)) ?? null };
    } catch (e) {
      reply = { id, error: e.message };
    }
    process.stdout.write(JSON.stringify(reply) + '\\n');
  });
  process.stdin.on('end', () => process.exit(0));
  process.stdout.write(JSON.stringify({ id: 0, value: { url: api.url, kubeconfig } }) + '\\n');
})();
`;

export type Stats = { hostileBytes: number; requests: { verb: string; path: string }[] };

export class FakeApiServerProcess {
  readonly url: string;
  /** Path of a kubeconfig for it (in a fresh temporary directory). */
  readonly kubeconfig: string;
  readonly #child: ChildProcess;
  readonly #call: (op: string, args?: unknown) => Promise<unknown>;

  constructor(
    child: ChildProcess,
    call: (op: string, args?: unknown) => Promise<unknown>,
    ready: { url: string; kubeconfig: string },
  ) {
    this.#child = child;
    this.#call = call;
    this.url = ready.url;
    this.kubeconfig = ready.kubeconfig;
  }

  create(obj: ApiObject): Promise<unknown> {
    return this.#call('create', obj);
  }
  update(obj: ApiObject): Promise<unknown> {
    return this.#call('update', obj);
  }
  hostile(mode: HostileMode | null, options: HostileOptions = {}): Promise<unknown> {
    return this.#call('hostile', { mode, options });
  }
  expireHistory(): Promise<unknown> {
    return this.#call('expireHistory');
  }
  closeWatches(): Promise<unknown> {
    return this.#call('closeWatches');
  }
  sendBookmark(): Promise<unknown> {
    return this.#call('sendBookmark');
  }
  stats(): Promise<Stats> {
    return this.#call('stats') as Promise<Stats>;
  }

  /** Ends the child (its stdin closes) and waits for it, at most 5 s before a SIGKILL. */
  async close(): Promise<void> {
    if (this.#child.exitCode !== null || this.#child.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => this.#child.once('exit', () => resolve()));
    this.#child.stdin?.end();
    const timer = setTimeout(() => this.#child.kill('SIGKILL'), 5000);
    await exited;
    clearTimeout(timer);
  }
}

/** Starts the stand-in in a child process (Node running this one's binary) and waits until it listens. */
export async function startFakeApiServerProcess(): Promise<FakeApiServerProcess> {
  const module = new URL('./fake-apiserver.ts', import.meta.url).href;
  const child = spawn(process.execPath, ['-e', CHILD, module], { stdio: ['pipe', 'pipe', 'inherit'] });
  const pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  let next = 1;
  let ready: (v: unknown) => void = () => {};
  const started = new Promise((resolve) => {
    ready = resolve;
  });
  createInterface({ input: child.stdout! }).on('line', (line) => {
    const reply = JSON.parse(line) as { id: number; value?: unknown; error?: string };
    if (reply.id === 0) return ready(reply.value);
    const p = pending.get(reply.id);
    pending.delete(reply.id);
    if (reply.error !== undefined) p?.reject(new Error(reply.error));
    else p?.resolve(reply.value);
  });
  child.once('exit', (code) => {
    for (const p of pending.values()) p.reject(new Error(`the stand-in exited (${code})`));
    pending.clear();
  });
  const call = (op: string, args?: unknown) =>
    new Promise<unknown>((resolve, reject) => {
      const id = next++;
      pending.set(id, { resolve, reject });
      child.stdin!.write(`${JSON.stringify({ id, op, args })}\n`);
    });
  const timeout = setTimeout(() => child.kill('SIGKILL'), 15_000);
  const value = (await Promise.race([
    started,
    new Promise((_, reject) =>
      child.once('exit', (code) => reject(new Error(`the stand-in exited (${code})`))),
    ),
  ])) as { url: string; kubeconfig: string };
  clearTimeout(timeout);
  return new FakeApiServerProcess(child, call, value);
}
