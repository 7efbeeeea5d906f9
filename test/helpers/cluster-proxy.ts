// The proxy as a real process in a namespace cluster, for end-to-end tests: a node namespace veth'd to
// an "outside" namespace and bridged to pod namespaces (IPv4 and IPv6), one agent process per namespace
// that serves and sends test traffic on request, and the CLI run as a child inside the node namespace.
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtemp, rename, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import type { TestContext } from 'node:test';
import type { DebugServicePort } from '../../src/server/debug.ts';
import { toYaml } from './manifests.ts';
import type { Sandbox } from './netns.ts';

/** The CLI the tests run, as users do. */
export const PROXY_BIN = new URL('../../bin/kube-userspace-proxy.js', import.meta.url).pathname;

/** Answers requests (one JSON line each on stdin, `{id, ...}`) with one JSON line each on stdout. */
const AGENT = String.raw`
const net = require('node:net'), dgram = require('node:dgram'), http = require('node:http');
const out = (o) => process.stdout.write(JSON.stringify(o) + '\n');
const servers = new Map();
const polls = new Map();
const streams = new Map();

function tcp({ host, port, timeoutMs = 2000, localAddress }) {
  return new Promise((resolve) => {
    const started = Date.now();
    const s = net.connect({ host, port, ...(localAddress ? { localAddress } : {}) });
    let data = '';
    let done = false;
    const finish = (r) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      s.destroy();
      resolve({ ...r, ms: Date.now() - started });
    };
    const timer = setTimeout(() => finish({ ok: false, error: 'ETIMEDOUT' }), timeoutMs);
    s.on('data', (c) => (data += c));
    s.on('end', () => finish(data === '' ? { ok: false, error: 'EMPTY' } : { ok: true, data }));
    s.on('error', (e) => finish({ ok: false, error: e.code || e.message }));
  });
}

function udp({ host, port, timeoutMs = 2000, send = 'ping', localPort = 0 }) {
  return new Promise((resolve) => {
    const u = dgram.createSocket(net.isIPv6(host) ? 'udp6' : 'udp4');
    const timer = setTimeout(() => { u.close(); resolve({ ok: false, error: 'ETIMEDOUT' }); }, timeoutMs);
    u.on('error', (e) => { clearTimeout(timer); u.close(); resolve({ ok: false, error: e.code || e.message }); });
    // Not connected: a reply from any address is taken, and its source is reported.
    u.on('message', (m, r) => {
      clearTimeout(timer);
      u.close();
      resolve({ ok: true, data: String(m), from: { address: r.address, port: r.port } });
    });
    u.bind(localPort, () => u.send(send, port, host));
  });
}

// A connected socket: an ICMP unreachable for a datagram is reported (ECONNREFUSED) instead of ignored.
function udpConnected({ host, port, timeoutMs = 2000, send = 'ping' }) {
  return new Promise((resolve) => {
    const started = Date.now();
    const u = dgram.createSocket(net.isIPv6(host) ? 'udp6' : 'udp4');
    let done = false;
    const finish = (r) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      try { u.close(); } catch {}
      resolve({ ...r, ms: Date.now() - started });
    };
    const timer = setTimeout(() => finish({ ok: false, error: 'ETIMEDOUT' }), timeoutMs);
    u.on('error', (e) => finish({ ok: false, error: e.code || e.message }));
    u.on('message', (m) => finish({ ok: true, data: String(m) }));
    u.connect(port, host, () => u.send(send));
  });
}

// One connected UDP socket (one source port, so one proxy session) sending "<seq>" every intervalMs until
// stopped (or maxMs / maxSends); resolves once the first reply came (or with an error after 5 s).
function udpStreamStart({ key, host, port, intervalMs = 20, maxMs = 30000, maxSends = 3000 }) {
  const st = { sent: 0, replies: [], errors: [], stopped: false, timer: undefined, socket: undefined };
  streams.set(key, st);
  const until = Date.now() + maxMs;
  return new Promise((resolve) => {
    let first = true;
    const giveUp = setTimeout(() => { if (first) { first = false; resolve({ ok: false, error: 'no reply within 5 s' }); } }, 5000);
    const u = dgram.createSocket(net.isIPv6(host) ? 'udp6' : 'udp4');
    st.socket = u;
    u.on('error', (e) => { if (st.errors.length < 1000) st.errors.push({ t: Date.now(), error: e.code || e.message }); });
    u.on('message', (m) => {
      if (st.replies.length < 10000) st.replies.push({ t: Date.now(), data: String(m) });
      if (first) { first = false; clearTimeout(giveUp); resolve({ ok: true }); }
    });
    u.connect(port, host, () => {
      const tick = () => {
        if (st.stopped || Date.now() >= until || st.sent >= maxSends) return;
        u.send(String(st.sent++));
        st.timer = setTimeout(tick, intervalMs);
      };
      tick();
    });
  });
}

function udpStreamPeek({ key }) {
  const st = streams.get(key);
  if (!st) return { ok: false, error: 'no such stream' };
  return { ok: true, sent: st.sent, replies: st.replies.slice(), errors: st.errors.slice() };
}

function udpStreamStop({ key }) {
  const st = streams.get(key);
  if (!st) return { ok: false, error: 'no such stream' };
  st.stopped = true;
  clearTimeout(st.timer);
  try { st.socket.close(); } catch {}
  streams.delete(key);
  return { ok: true, sent: st.sent, replies: st.replies, errors: st.errors };
}

function get({ url, timeoutMs = 2000 }) {
  return new Promise((resolve) => {
    const req = http.get(url, { timeout: timeoutMs }, (res) => {
      let body = '';
      res.setEncoding('utf8').on('data', (c) => (body += c));
      res.on('end', () => resolve({ ok: true, status: res.statusCode, body }));
    });
    req.on('timeout', () => req.destroy(new Error('ETIMEDOUT')));
    req.on('error', (e) => resolve({ ok: false, error: e.code || e.message }));
  });
}

function listen(server, host, port, bind) {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    bind(() => { server.off('error', reject); resolve(); });
  });
}

async function serve({ key, name, host = '::', tcpPort, udpPort, proxyProtocol = false }) {
  const list = [];
  if (tcpPort) {
    // proxyProtocol: wait for the first bytes (the header the proxy sends before any of the client's),
    // and answer the name and those bytes in base64.
    const s = net.createServer((c) => {
      c.on('error', () => {});
      if (!proxyProtocol) return c.end(name);
      c.once('data', (d) => c.end(name + '|' + d.toString('base64')));
    });
    await listen(s, host, tcpPort, (cb) => s.listen({ host, port: tcpPort }, cb));
    list.push(s);
  }
  if (udpPort) {
    for (const [type, addr] of [['udp4', '0.0.0.0'], ['udp6', '::']]) {
      const u = dgram.createSocket({ type, ipv6Only: type === 'udp6' });
      u.on('message', (m, r) => u.send(name + ':' + m, r.port, r.address));
      await listen(u, addr, udpPort, (cb) => u.bind(udpPort, addr, cb));
      list.push(u);
    }
  }
  servers.set(key, list);
  return { ok: true };
}

function unserve({ key }) {
  for (const s of servers.get(key) || []) s.close();
  servers.delete(key);
  return { ok: true };
}

// TCP requests every intervalMs until stopped (or maxMs); resolves once the first one succeeded.
function pollStart({ key, host, port, intervalMs = 20, timeoutMs = 200, maxMs = 30000, maxSamples = 5000 }) {
  const p = { samples: [], stopped: false };
  polls.set(key, p);
  const until = Date.now() + maxMs;
  return new Promise((resolve) => {
    let first = true;
    (async () => {
      while (!p.stopped && Date.now() < until && p.samples.length < maxSamples) {
        const t = Date.now();
        const r = await tcp({ host, port, timeoutMs });
        p.samples.push({ t, ok: r.ok, error: r.error });
        if (first && r.ok) { first = false; resolve({ ok: true }); }
        const wait = t + intervalMs - Date.now();
        if (wait > 0) await new Promise((w) => setTimeout(w, wait));
      }
      if (first) resolve({ ok: false, error: 'no successful request' });
    })();
  });
}

function pollStop({ key }) {
  const p = polls.get(key);
  if (!p) return { ok: false, error: 'no such poll' };
  p.stopped = true;
  polls.delete(key);
  return { ok: true, samples: p.samples };
}

const ops = { tcp, udp, udpConnected, udpStreamStart, udpStreamPeek, udpStreamStop, get, serve, unserve, pollStart, pollStop };
require('node:readline').createInterface({ input: process.stdin }).on('line', async (line) => {
  const { id, op, args } = JSON.parse(line);
  try {
    out({ id, ...(await ops[op](args)) });
  } catch (e) {
    out({ id, ok: false, error: e.code || e.message });
  }
});
process.stdin.on('end', () => process.exit(0));
out({ ready: true });
`;

export type TcpResult = { ok: boolean; data?: string; error?: string; ms: number };
export type UdpResult = {
  ok: boolean;
  data?: string;
  error?: string;
  from?: { address: string; port: number };
};
export type PollSample = { t: number; ok: boolean; error?: string };
/** What a UDP stream saw: datagrams sent, each reply (epoch ms, text) and each socket error. */
export type UdpStream = {
  sent: number;
  replies: { t: number; data: string }[];
  errors: { t: number; error: string }[];
};

/** A helper process inside one namespace: clients and servers for test traffic. */
export class Agent {
  readonly ns: string;
  readonly #child: ChildProcess;
  readonly #pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  #next = 1;
  #exited: Error | undefined;

  private constructor(sandbox: Sandbox, ns: string) {
    this.ns = ns;
    this.#child = sandbox.spawnIn(ns, process.execPath, ['-e', AGENT]);
    this.#child.stderr?.resume();
    this.#child.on('exit', (code, signal) => {
      this.#exited = new Error(`agent in ${ns} exited (${code ?? signal})`);
      for (const p of this.#pending.values()) p.reject(this.#exited);
      this.#pending.clear();
    });
  }

  /** Starts an agent in `ns` and waits (up to 10 s) until it reads requests. */
  static async start(sandbox: Sandbox, ns: string): Promise<Agent> {
    const agent = new Agent(sandbox, ns);
    const ready = new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`agent in ${ns} not ready within 10 s`)), 10_000);
      agent.#child.once('exit', () => reject(new Error(`agent in ${ns} exited before it was ready`)));
      createInterface({ input: agent.#child.stdout! }).on('line', (line) => {
        const msg = JSON.parse(line) as { id?: number; ready?: boolean };
        if (msg.ready) {
          clearTimeout(timer);
          resolve();
          return;
        }
        const p = agent.#pending.get(msg.id ?? 0);
        agent.#pending.delete(msg.id ?? 0);
        p?.resolve(msg);
      });
    });
    await ready;
    return agent;
  }

  /** Sends one request; rejects when no answer comes within `deadlineMs`. */
  request<T>(op: string, args: Record<string, unknown>, deadlineMs = 15_000): Promise<T> {
    if (this.#exited) return Promise.reject(this.#exited);
    const id = this.#next++;
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#pending.delete(id);
        reject(new Error(`agent in ${this.ns}: no answer to ${op} within ${deadlineMs} ms`));
      }, deadlineMs);
      this.#pending.set(id, {
        resolve: (v) => {
          clearTimeout(timer);
          resolve(v as T);
        },
        reject: (e) => {
          clearTimeout(timer);
          reject(e);
        },
      });
      this.#child.stdin!.write(`${JSON.stringify({ id, op, args })}\n`);
    });
  }

  /**
   * Connects, reads until the server ends; `ok` when something was received. `error` tells a refused
   * connect (ECONNREFUSED), a reset, a silent peer (ETIMEDOUT after `timeoutMs`) and an accepted connection
   * closed without a byte (EMPTY) apart; `ms` is how long it took. `localAddress` picks the source address.
   */
  tcp(
    host: string,
    port: number,
    timeoutMs = 2000,
    options: { localAddress?: string } = {},
  ): Promise<TcpResult> {
    return this.request('tcp', { host, port, timeoutMs, ...options });
  }

  /**
   * Sends one datagram from a connected socket and waits for the reply; an ICMP port unreachable comes
   * back as `error: 'ECONNREFUSED'`, silence as ETIMEDOUT after `timeoutMs`.
   */
  udpConnected(host: string, port: number, options: { timeoutMs?: number; send?: string } = {}) {
    return this.request<TcpResult>('udpConnected', { host, port, ...options });
  }

  /**
   * Starts sending a numbered datagram every `intervalMs` from one connected socket (at most `maxMs`,
   * default 30 s); resolves once the first reply came, rejects when none came within 5 s.
   */
  async udpStreamStart(key: string, host: string, port: number, intervalMs = 20, maxMs = 30_000) {
    const r = await this.request<{ ok: boolean; error?: string }>('udpStreamStart', {
      key,
      host,
      port,
      intervalMs,
      maxMs,
    });
    if (!r.ok) throw new Error(`UDP stream to ${host}:${port} from ${this.ns}: ${r.error}`);
  }

  /** What a running UDP stream sent and received so far. */
  udpStreamPeek(key: string): Promise<UdpStream> {
    return this.#stream('udpStreamPeek', key);
  }

  /** Stops a UDP stream; what it sent and received. */
  udpStreamStop(key: string): Promise<UdpStream> {
    return this.#stream('udpStreamStop', key);
  }

  async #stream(op: string, key: string): Promise<UdpStream> {
    const r = await this.request<{ ok: boolean; error?: string } & UdpStream>(op, { key });
    if (!r.ok) throw new Error(`${op} ${key}: ${r.error}`);
    return { sent: r.sent, replies: r.replies, errors: r.errors };
  }

  /** Sends one datagram from an unconnected socket and reports the first reply and where it came from. */
  udp(host: string, port: number, options: { timeoutMs?: number; send?: string; localPort?: number } = {}) {
    return this.request<UdpResult>('udp', { host, port, ...options });
  }

  /** An HTTP GET from inside the namespace. */
  get(url: string): Promise<{ ok: boolean; status?: number; body?: string; error?: string }> {
    return this.request('get', { url });
  }

  /**
   * Serves `name` on TCP (`host`, default `::`) and UDP (both families) until unserve(key). With
   * `proxyProtocol`, a TCP connection is answered `name|<its first bytes in base64>` once they came.
   */
  async serve(
    key: string,
    name: string,
    ports: { tcpPort?: number; udpPort?: number; host?: string; proxyProtocol?: boolean },
  ) {
    const r = await this.request<{ ok: boolean; error?: string }>('serve', { key, name, ...ports });
    if (!r.ok) throw new Error(`serve ${name} in ${this.ns}: ${r.error}`);
  }

  async unserve(key: string): Promise<void> {
    await this.request('unserve', { key });
  }

  /** Starts TCP requests every `intervalMs`; resolves once one succeeded (rejects if none did). */
  async pollStart(key: string, host: string, port: number, intervalMs = 20): Promise<void> {
    const r = await this.request<{ ok: boolean; error?: string }>('pollStart', {
      key,
      host,
      port,
      intervalMs,
    });
    if (!r.ok) throw new Error(`poll ${host}:${port} from ${this.ns}: ${r.error}`);
  }

  /** Stops a poll; every request's start time (epoch ms) and outcome. */
  async pollStop(key: string): Promise<PollSample[]> {
    const r = await this.request<{ ok: boolean; samples?: PollSample[]; error?: string }>('pollStop', {
      key,
    });
    if (!r.ok) throw new Error(`pollStop ${key}: ${r.error}`);
    return r.samples ?? [];
  }
}

export type ProxyCluster = {
  readonly sandbox: Sandbox;
  readonly node: string;
  readonly outside: string;
  /** Node eth0: 192.168.50.2/24 (+ `extraNodeIPs`), fd00:50::2/64; default routes via `outside`. */
  readonly nodeIP: string;
  readonly nodeIP6: string;
  /** The outside namespace's address on the node's link (and the node's default gateway). */
  readonly outsideIP: string;
  /** kbr0: 10.244.0.1/24, fd00:244::1/64 (the pods' gateway). */
  readonly bridgeIP: string;
  readonly bridgeIP6: string;
  readonly pods: readonly {
    readonly ns: string;
    readonly ip: string;
    readonly ip6: string;
    readonly agent: Agent;
  }[];
  readonly nodeAgent: Agent;
  readonly outsideAgent: Agent;
};

/**
 * node (eth0 veth'd to `outside`, bridge kbr0 with `pods` pods), IPv4 and IPv6, and an agent in every
 * namespace. `routedToNode` are routed from outside via the node (externalIPs, LB IPs the node does not
 * own); `extraNodeIPs` are added to the node's eth0 (/32, e.g. an externalIP assigned to the node);
 * `forwarding` turns on IPv4 and IPv6 forwarding in the node namespace, as on a Kubernetes node.
 */
export async function createProxyCluster(
  sandbox: Sandbox,
  options: { pods?: number; extraNodeIPs?: string[]; routedToNode?: string[]; forwarding?: boolean } = {},
): Promise<ProxyCluster> {
  const node = await sandbox.createNamespace('node');
  // A real node forwards (pod networking needs it), and kube-proxy's filter rules for pod traffic to a
  // ClusterIP without a nat rule (REJECT, DROP) sit on FORWARD: without it the kernel drops the packet
  // before any rule sees it. Only this namespace's sysctls; its links lead only to our namespaces.
  if (options.forwarding)
    for (const key of ['net.ipv4.ip_forward', 'net.ipv6.conf.all.forwarding'])
      await sandbox.exec(node, 'sysctl', ['-qw', `${key}=1`]);
  const outside = await sandbox.createNamespace('outside');
  await sandbox.veth({ ns: node, name: 'eth0' }, { ns: outside, name: 'eth0' });
  await sandbox.addAddress(node, 'eth0', '192.168.50.2/24');
  await sandbox.addAddress(node, 'eth0', 'fd00:50::2/64');
  for (const ip of options.extraNodeIPs ?? []) await sandbox.addAddress(node, 'eth0', `${ip}/32`);
  await sandbox.addAddress(outside, 'eth0', '192.168.50.1/24');
  await sandbox.addAddress(outside, 'eth0', 'fd00:50::1/64');
  await sandbox.defaultRoute(node, '192.168.50.1', 'eth0');
  await sandbox.defaultRoute(node, 'fd00:50::1', 'eth0');
  for (const ip of options.routedToNode ?? [])
    await sandbox.exec(outside, 'ip', ['route', 'add', `${ip}/32`, 'via', '192.168.50.2', 'dev', 'eth0']);
  await sandbox.bridge(node, 'kbr0');
  await sandbox.addAddress(node, 'kbr0', '10.244.0.1/24');
  await sandbox.addAddress(node, 'kbr0', 'fd00:244::1/64');
  const pods: { ns: string; ip: string; ip6: string }[] = [];
  for (let i = 0; i < (options.pods ?? 1); i++) {
    const ns = await sandbox.createNamespace(`pod${i}`);
    await sandbox.veth({ ns, name: 'eth0' }, { ns: node, name: `vpod${i}` });
    await sandbox.attach(node, `vpod${i}`, 'kbr0');
    const pod = { ns, ip: `10.244.0.${10 + i}`, ip6: `fd00:244::${10 + i}` };
    await sandbox.addAddress(ns, 'eth0', `${pod.ip}/24`);
    await sandbox.addAddress(ns, 'eth0', `${pod.ip6}/64`);
    await sandbox.defaultRoute(ns, '10.244.0.1', 'eth0');
    await sandbox.defaultRoute(ns, 'fd00:244::1', 'eth0');
    pods.push(pod);
  }
  const [nodeAgent, outsideAgent, ...podAgents] = await Promise.all(
    [node, outside, ...pods.map((p) => p.ns)].map((ns) => Agent.start(sandbox, ns)),
  );
  return {
    sandbox,
    node,
    outside,
    nodeIP: '192.168.50.2',
    nodeIP6: 'fd00:50::2',
    outsideIP: '192.168.50.1',
    bridgeIP: '10.244.0.1',
    bridgeIP6: 'fd00:244::1',
    pods: pods.map((p, i) => ({ ...p, agent: podAgents[i]! })),
    nodeAgent: nodeAgent!,
    outsideAgent: outsideAgent!,
  };
}

/** A manifest file in a temp dir (deleted in t.after), replaced atomically as editors do. */
export async function createManifest(
  t: TestContext,
): Promise<{ file: string; write(objects: unknown[]): Promise<void> }> {
  const dir = await mkdtemp(join(tmpdir(), 'kup-e2e-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const file = join(dir, 'services.yaml');
  let n = 0;
  return {
    file,
    async write(objects) {
      const tmp = join(dir, `.services.yaml.${n++}`);
      await writeFile(tmp, toYaml(objects));
      await rename(tmp, file);
    },
  };
}

const MAX_LOG_LINES = 400;

/**
 * The arguments every end-to-end test runs the proxy with, after its source (`--manifest FILE` or
 * `--kubeconfig FILE`): node-1, metrics and healthz on the node's loopback (`metricsPort`,
 * `metricsPort + 7`), a 2 s sync period and no minimum interval.
 */
export function e2eProxyArgs(source: readonly string[], metricsPort = 10249): string[] {
  return [
    ...source,
    '--hostname-override',
    'node-1',
    '--metrics-bind-address',
    `127.0.0.1:${metricsPort}`,
    '--healthz-bind-address',
    `127.0.0.1:${metricsPort + 7}`,
    '--iptables-min-sync-period',
    '0',
    '--iptables-sync-period',
    '2s',
  ];
}

/** The proxy CLI running in the node namespace. */
export class ProxyProcess {
  readonly child: ChildProcess;
  readonly metricsPort: number;
  readonly #agent: Agent;
  /** The last log lines (stdout and stderr), for failure messages. */
  readonly logs: string[] = [];
  readonly exited: Promise<number | null>;
  #stopping: Promise<number | null> | undefined;

  /**
   * Runs `kube-userspace-proxy --manifest <manifest> --hostname-override node-1` with metrics and
   * healthz on the node's loopback (`metricsPort`, `metricsPort + 7`), a 2 s sync period and no
   * minimum interval, plus `args`.
   */
  constructor(cluster: ProxyCluster, manifest: string, args: string[] = [], metricsPort = 10249) {
    this.metricsPort = metricsPort;
    this.#agent = cluster.nodeAgent;
    this.child = cluster.sandbox.spawnIn(cluster.node, process.execPath, [
      PROXY_BIN,
      ...e2eProxyArgs(['--manifest', manifest], metricsPort),
      ...args,
    ]);
    for (const stream of [this.child.stdout, this.child.stderr]) {
      createInterface({ input: stream! }).on('line', (line) => {
        this.logs.push(line);
        if (this.logs.length > MAX_LOG_LINES) this.logs.shift();
      });
    }
    this.exited = new Promise((resolve) => this.child.once('exit', (code) => resolve(code)));
  }

  /** /debug/services; undefined while the server does not answer. */
  async services(): Promise<DebugServicePort[] | undefined> {
    const r = await this.#agent.get(`http://127.0.0.1:${this.metricsPort}/debug/services`);
    return r.ok && r.status === 200 ? (JSON.parse(r.body ?? '[]') as DebugServicePort[]) : undefined;
  }

  /** Waits until /debug/services satisfies `check` (default: lists `names`, each with a proxy port). */
  async waitServices(
    check: (services: DebugServicePort[]) => boolean,
    timeoutMs = 10_000,
    what = 'services',
  ): Promise<DebugServicePort[]> {
    let last: DebugServicePort[] | undefined;
    await eventually(
      async () => {
        if (this.child.exitCode !== null) throw new Error(`proxy exited with ${this.child.exitCode}`);
        last = await this.services();
        return last !== undefined && check(last);
      },
      { timeoutMs, what: `${what}; last /debug/services: ${JSON.stringify(last)}\n${this.logTail()}` },
    );
    return last!;
  }

  /**
   * SIGTERM once (a second one would kill it mid-shutdown), then SIGKILL after `timeoutMs`; resolves
   * with the exit code. Idempotent.
   */
  stop(timeoutMs = 10_000): Promise<number | null> {
    this.#stopping ??= (async () => {
      if (this.child.exitCode !== null || this.child.signalCode !== null) return this.child.exitCode;
      this.child.kill('SIGTERM');
      const timer = setTimeout(() => this.child.kill('SIGKILL'), timeoutMs);
      const code = await this.exited;
      clearTimeout(timer);
      return code;
    })();
    return this.#stopping;
  }

  /** The time (epoch ms) of the first log line with `msg` whose fields include `fields`. */
  logTime(msg: string, fields: Record<string, unknown> = {}): number | undefined {
    for (const line of this.logs) {
      let rec: Record<string, unknown>;
      try {
        rec = JSON.parse(line) as Record<string, unknown>;
      } catch {
        continue;
      }
      if (rec['msg'] === msg && Object.entries(fields).every(([k, v]) => rec[k] === v))
        return Date.parse(String(rec['time']));
    }
    return undefined;
  }

  logTail(n = 30): string {
    return this.logs.slice(-n).join('\n');
  }
}

/** Runs the CLI to completion in `ns` (e.g. --cleanup); resolves with its exit code and output. */
export function runProxyOnce(
  ns: string,
  args: string[],
  timeoutMs = 30_000,
): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn('ip', ['netns', 'exec', ns, process.execPath, PROXY_BIN, ...args]);
    let output = '';
    child.stdout.on('data', (d) => (output += d));
    child.stderr.on('data', (d) => (output += d));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`kube-userspace-proxy ${args.join(' ')} did not finish within ${timeoutMs} ms`));
    }, timeoutMs);
    child.on('exit', (code) => {
      clearTimeout(timer);
      resolve({ code, output });
    });
  });
}

/**
 * Calls `check` every `intervalMs` until it returns true (a thrown error counts as false) or
 * `timeoutMs` passed; then throws with `what` and the last error. Resolves with the time it took.
 */
export async function eventually(
  check: () => boolean | Promise<boolean>,
  options: { timeoutMs?: number; intervalMs?: number; what?: string } = {},
): Promise<number> {
  const started = Date.now();
  const deadline = started + (options.timeoutMs ?? 10_000);
  let lastError: unknown;
  for (;;) {
    try {
      if (await check()) return Date.now() - started;
    } catch (err) {
      lastError = err;
    }
    if (Date.now() >= deadline) {
      const why = lastError === undefined ? '' : ` (last error: ${(lastError as Error).message})`;
      throw new Error(
        `timed out after ${options.timeoutMs ?? 10_000} ms waiting for ${options.what ?? 'condition'}${why}`,
      );
    }
    await new Promise((r) => setTimeout(r, options.intervalMs ?? 50));
  }
}

/** The longest time without a successful answer in a poll (ms), and the failures in it. */
export function longestGap(samples: readonly PollSample[]): { gapMs: number; failures: number } {
  let gapMs = 0;
  let failures = 0;
  let lastOk: number | undefined;
  let failed = 0;
  for (const s of samples) {
    if (!s.ok) {
      failed++;
      continue;
    }
    if (lastOk !== undefined && s.t - lastOk > gapMs) {
      gapMs = s.t - lastOk;
      failures = failed;
    }
    lastOk = s.t;
    failed = 0;
  }
  return { gapMs, failures };
}
