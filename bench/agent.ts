// The benchmark's hands inside a namespace: a process started there (`node bench/agent.ts`) that reads one
// JSON request a line on stdin and answers one JSON line on stdout (`{id, ...}`). It makes HTTP requests on
// new connections, polls until an answer comes, and holds thousands of idle connections. Only talks to
// the addresses it is given (namespaces of the benchmark).
import net from 'node:net';
import { createInterface } from 'node:readline';

type Reply = Record<string, unknown>;

const REQUEST = 'GET / HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n';
const KEEP_ALIVE = 'GET / HTTP/1.1\r\nHost: bench\r\n\r\n';

/** One HTTP/1.1 GET on a new connection; the status and body of the answer, or why there was none. */
function get(host: string, port: number, timeoutMs: number, path = '/'): Promise<Reply> {
  return new Promise((resolve) => {
    const s = net.connect({ host, port, noDelay: true });
    let data = '';
    let done = false;
    const finish = (r: Reply) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      s.destroy();
      resolve({ ...r, t: Date.now() });
    };
    const timer = setTimeout(() => finish({ ok: false, error: 'ETIMEDOUT' }), timeoutMs);
    s.on('connect', () => s.write(path === '/' ? REQUEST : REQUEST.replace(' / ', ` ${path} `)));
    s.setEncoding('utf8');
    s.on('data', (c: string) => {
      data += c;
    });
    s.on('end', () => {
      const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(data)?.[1] ?? 0);
      const body = data.slice(data.indexOf('\r\n\r\n') + 4);
      finish(status > 0 ? { ok: true, status, body } : { ok: false, error: 'EMPTY' });
    });
    s.on('error', (e: NodeJS.ErrnoException) => finish({ ok: false, error: e.code ?? e.message }));
  });
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * GETs host:port every `intervalMs` until an answer has status 200 and (when given) a body matching
 * `match`; `t` is the epoch ms at which that answer completed. Each try ends after `timeoutMs`. With
 * `concurrent` > 1 a new try starts every `intervalMs` even while earlier ones wait, up to that many at
 * once: a SYN to a ClusterIP that is not programmed yet is dropped, and would hold a one-at-a-time loop
 * for the whole `timeoutMs`.
 */
async function pollHttp(a: {
  host: string;
  port: number;
  match?: string;
  intervalMs?: number;
  timeoutMs?: number;
  maxMs?: number;
  path?: string;
  concurrent?: number;
}): Promise<Reply> {
  const until = Date.now() + (a.maxMs ?? 60_000);
  const re = a.match === undefined ? undefined : new RegExp(a.match);
  const limit = Math.max(1, a.concurrent ?? 1);
  let tries = 0;
  let inFlight = 0;
  let last: Reply = {};
  let found: Reply | undefined;
  let wake = () => {};
  const one = async () => {
    inFlight++;
    tries++;
    const r = await get(a.host, a.port, a.timeoutMs ?? 500, a.path);
    inFlight--;
    if (r['ok'] && r['status'] === 200 && (!re || re.test(String(r['body'])))) {
      // Several tries may succeed: the earliest answer counts.
      if (!found || Number(r['t']) < Number(found['t'])) found = r;
    } else last = r;
    wake();
  };
  while (!found && Date.now() < until) {
    const started = Date.now();
    void one();
    // At the limit, wait for a try to end; then keep `intervalMs` between starts.
    while (inFlight >= limit && !found) await new Promise<void>((r) => (wake = r));
    if (found) break;
    const wait = started + (a.intervalMs ?? 10) - Date.now();
    if (wait > 0) await sleep(wait);
  }
  if (found) return { ok: true, t: found['t'], tries, body: found['body'] };
  return {
    ok: false,
    error: `no matching answer within ${a.maxMs ?? 60_000} ms (last: ${JSON.stringify(last)})`,
    tries,
  };
}

/** Polls a JSON array URL (/debug/services) until it lists `count` entries with a proxy port. */
async function pollServices(a: {
  host: string;
  port: number;
  count: number;
  intervalMs?: number;
  maxMs?: number;
}) {
  const until = Date.now() + (a.maxMs ?? 120_000);
  let seen = 0;
  while (Date.now() < until) {
    const started = Date.now();
    const r = await get(a.host, a.port, 5_000, '/debug/services');
    if (r['ok'] && r['status'] === 200) {
      try {
        const list = JSON.parse(String(r['body'])) as { proxyPort?: number }[];
        seen = list.filter((s) => (s.proxyPort ?? 0) > 0).length;
        if (seen >= a.count) return { ok: true, t: r['t'], seen };
      } catch {}
    }
    const wait = started + (a.intervalMs ?? 100) - Date.now();
    if (wait > 0) await sleep(wait);
  }
  return { ok: false, error: `only ${seen} of ${a.count} service ports listed`, seen };
}

const held: net.Socket[] = [];

/**
 * Opens `n` connections to host:port (at most `concurrency` opening at once), makes one keep-alive
 * request on each and keeps them open, idle, until `release`.
 */
async function hold(a: { host: string; port: number; n: number; concurrency?: number; timeoutMs?: number }) {
  let next = 0;
  let failed = 0;
  let firstError = '';
  const one = () =>
    new Promise<void>((resolve) => {
      const s = net.connect({ host: a.host, port: a.port, noDelay: true });
      const timer = setTimeout(() => fail('ETIMEDOUT'), a.timeoutMs ?? 10_000);
      let settled = false;
      const fail = (why: string) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        failed++;
        firstError ||= why;
        s.destroy();
        resolve();
      };
      s.on('connect', () => s.write(KEEP_ALIVE));
      s.once('data', () => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        held.push(s);
        resolve();
      });
      s.on('error', (e: NodeJS.ErrnoException) => fail(e.code ?? e.message));
      s.on('close', () => fail('closed'));
    });
  const worker = async () => {
    while (next < a.n) {
      next++;
      await one();
    }
  };
  await Promise.all(Array.from({ length: a.concurrency ?? 64 }, worker));
  // Still open a moment later (a peer that closes idle connections at once would show here).
  await sleep(200);
  const open = held.filter((s) => !s.destroyed && s.readyState === 'open').length;
  return { ok: failed === 0, open, failed, error: firstError || undefined };
}

function release() {
  const n = held.length;
  for (const s of held.splice(0)) s.destroy();
  return { ok: true, released: n };
}

/**
 * A full, memory-reducing garbage collection in a Node process whose inspector listens on
 * 127.0.0.1:`port` (after SIGUSR1), so RSS is read without a startup's or a load's garbage in it.
 * Returns the V8 heap in use afterwards.
 */
async function gc(a: { port: number; timeoutMs?: number }): Promise<Reply> {
  const until = Date.now() + (a.timeoutMs ?? 10_000);
  let url: string | undefined;
  while (!url && Date.now() < until) {
    try {
      const list = (await (await fetch(`http://127.0.0.1:${a.port}/json/list`)).json()) as {
        webSocketDebuggerUrl?: string;
      }[];
      url = list[0]?.webSocketDebuggerUrl;
    } catch {
      await sleep(50);
    }
  }
  if (!url) return { ok: false, error: `no inspector on 127.0.0.1:${a.port}` };
  const ws = new WebSocket(url);
  const pending = new Map<number, (v: Record<string, unknown>) => void>();
  ws.addEventListener('message', (e) => {
    const msg = JSON.parse(String(e.data)) as { id?: number; result?: Record<string, unknown> };
    pending.get(msg.id ?? 0)?.(msg.result ?? {});
  });
  await new Promise((resolve, reject) => {
    ws.addEventListener('open', resolve, { once: true });
    ws.addEventListener('error', () => reject(new Error(`inspector websocket ${url} failed`)), {
      once: true,
    });
  });
  let next = 1;
  const call = (method: string) =>
    new Promise<Record<string, unknown>>((resolve) => {
      const id = next++;
      pending.set(id, resolve);
      ws.send(JSON.stringify({ id, method }));
    });
  await call('HeapProfiler.collectGarbage');
  await call('HeapProfiler.collectGarbage');
  const usage = await call('Runtime.getHeapUsage');
  ws.close();
  return { ok: true, heapUsed: usage['usedSize'], heapTotal: usage['totalSize'] };
}

type Args = Record<string, unknown> & { host: string; port: number };
const ops: Record<string, (a: Args) => Promise<Reply> | Reply> = {
  get: (a) => get(a.host, a.port, Number(a['timeoutMs'] ?? 2000), String(a['path'] ?? '/')),
  pollHttp: (a) => pollHttp(a),
  pollServices: (a) => pollServices(a as Args & { count: number }),
  hold: (a) => hold(a as Args & { n: number }),
  release: () => release(),
  gc: (a) => gc(a),
  now: () => ({ ok: true, t: Date.now() }),
};

const out = (o: Reply) => process.stdout.write(`${JSON.stringify(o)}\n`);
createInterface({ input: process.stdin }).on('line', async (line) => {
  const { id, op, args } = JSON.parse(line) as { id: number; op: string; args: Args };
  try {
    const fn = ops[op];
    out({ id, ...(fn ? await fn(args) : { ok: false, error: `no op ${op}` }) });
  } catch (err) {
    out({ id, ok: false, error: (err as Error).message });
  }
});
process.stdin.on('end', () => process.exit(0));
out({ ready: true });
