// Network namespaces for e2e tests and benchmarks: a per-run prefix, namespaces, veths, a bridge, and a
// cleanup that deletes all of it (t.after, process exit, signals; idempotent). Never touches the host's
// own namespace: every link is created inside a namespace and every command runs via `ip netns exec`.
import assert from 'node:assert/strict';
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import type { TestContext } from 'node:test';
import { createRun, type Run, type RunResult } from '../../src/netfilter/iptables.ts';

const PREFIX_RE = /^kup-(\d+)-[0-9a-f]+-/;
const hostRun = createRun({ timeoutMs: 30_000 });

/**
 * Returns true when the test may use namespaces. Not root: skips the test, unless `CI` is set, where
 * a non-root run is a broken setup and fails.
 */
export function requireRootOrSkip(t: TestContext): boolean {
  if (process.getuid?.() === 0) return true;
  if (process.env['CI']) assert.fail('e2e tests need root in CI (network namespaces, iptables)');
  t.skip('needs root (network namespaces); runs in CI');
  return false;
}

export type Sandbox = {
  /** `kup-<pid>-<random>`: every namespace of this sandbox is named `<prefix>-<name>`. */
  readonly prefix: string;
  /** Creates `<prefix>-<name>` with loopback up; returns the full namespace name. */
  createNamespace(name: string): Promise<string>;
  /** A veth pair between two namespaces (or inside one), both ends up. */
  veth(a: { ns: string; name: string }, b: { ns: string; name: string }): Promise<void>;
  /** A bridge (no STP, so ports forward at once), up. */
  bridge(ns: string, name: string): Promise<void>;
  /** A link that leads nowhere (an "eth0" for the node's own address), up. */
  dummy(ns: string, name: string): Promise<void>;
  /** Enslaves `link` to `bridge`. */
  attach(ns: string, link: string, bridge: string): Promise<void>;
  addAddress(ns: string, link: string, cidr: string): Promise<void>;
  /** A default route inside `ns` (never in the host namespace). */
  defaultRoute(ns: string, via: string, dev: string): Promise<void>;
  /** Runs a command in `ns`; rejects (with stderr) when it exits non-zero. */
  exec(ns: string, cmd: string, args: string[], stdin?: string): Promise<RunResult>;
  /** A `Run` that executes inside `ns` (for createIptables); a missing binary gives code 127. */
  run(ns: string): Run;
  /** Starts a long-running process in `ns`; it is killed at cleanup. */
  spawnIn(ns: string, cmd: string, args: string[]): ChildProcess;
  /** Kills spawned processes and deletes every namespace created here. Idempotent. */
  cleanup(): void;
};

const live = new Set<SandboxImpl>();
let hooksInstalled = false;

function installProcessHooks(): void {
  if (hooksInstalled) return;
  hooksInstalled = true;
  process.on('exit', () => {
    for (const s of live) s.cleanup();
  });
  for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
    const onSignal = () => {
      for (const s of live) s.cleanup();
      // Die of the same signal, as without this handler.
      process.removeListener(signal, onSignal);
      process.kill(process.pid, signal);
    };
    process.on(signal, onSignal);
  }
}

class SandboxImpl implements Sandbox {
  readonly prefix: string;
  readonly #namespaces = new Set<string>();
  readonly #children = new Set<ChildProcess>();

  constructor() {
    this.prefix = `kup-${process.pid}-${randomBytes(3).toString('hex')}`;
  }

  async createNamespace(name: string): Promise<string> {
    const ns = `${this.prefix}-${name}`;
    // Registered before it exists, so a failure half-way still deletes it.
    this.#namespaces.add(ns);
    await ipHost(['netns', 'add', ns]);
    await this.exec(ns, 'ip', ['link', 'set', 'lo', 'up']);
    return ns;
  }

  async veth(a: { ns: string; name: string }, b: { ns: string; name: string }): Promise<void> {
    this.#own(a.ns);
    this.#own(b.ns);
    await this.exec(a.ns, 'ip', [
      'link',
      'add',
      a.name,
      'type',
      'veth',
      'peer',
      'name',
      b.name,
      'netns',
      b.ns,
    ]);
    await this.exec(a.ns, 'ip', ['link', 'set', a.name, 'up']);
    await this.exec(b.ns, 'ip', ['link', 'set', b.name, 'up']);
  }

  async bridge(ns: string, name: string): Promise<void> {
    await this.exec(ns, 'ip', [
      'link',
      'add',
      name,
      'type',
      'bridge',
      'stp_state',
      '0',
      'forward_delay',
      '0',
    ]);
    await this.exec(ns, 'ip', ['link', 'set', name, 'up']);
  }

  async dummy(ns: string, name: string): Promise<void> {
    // A veth whose peer stays unaddressed in the same namespace: not every kernel has the dummy module.
    const peer = `${name.slice(0, 10)}-peer`;
    await this.exec(ns, 'ip', ['link', 'add', name, 'type', 'veth', 'peer', 'name', peer]);
    await this.exec(ns, 'ip', ['link', 'set', name, 'up']);
    await this.exec(ns, 'ip', ['link', 'set', peer, 'up']);
  }

  async attach(ns: string, link: string, bridge: string): Promise<void> {
    await this.exec(ns, 'ip', ['link', 'set', link, 'master', bridge]);
  }

  async addAddress(ns: string, link: string, cidr: string): Promise<void> {
    const v6 = cidr.includes(':');
    // nodad: an IPv6 address is usable at once instead of after duplicate address detection.
    await this.exec(ns, 'ip', [
      ...(v6 ? ['-6'] : []),
      'addr',
      'add',
      cidr,
      'dev',
      link,
      ...(v6 ? ['nodad'] : []),
    ]);
  }

  async defaultRoute(ns: string, via: string, dev: string): Promise<void> {
    const v6 = via.includes(':');
    await this.exec(ns, 'ip', [
      ...(v6 ? ['-6'] : []),
      'route',
      'add',
      'default',
      'via',
      via,
      'dev',
      dev,
      'onlink',
    ]);
  }

  async exec(ns: string, cmd: string, args: string[], stdin?: string): Promise<RunResult> {
    const result = await this.run(ns)(cmd, args, stdin);
    if (result.code !== 0)
      throw new Error(
        `in ${ns}: ${cmd} ${args.join(' ')} exited with ${result.code}: ${result.stderr.trim()}`,
      );
    return result;
  }

  run(ns: string): Run {
    this.#own(ns);
    return async (cmd, args, stdin) => {
      const result = await hostRun('ip', ['netns', 'exec', ns, cmd, ...args], stdin);
      // `ip netns exec` reports a missing program as 255 + "exec of ... failed": make it a shell's 127.
      if (result.code === 255 && /^exec of .* failed: No such file/m.test(result.stderr))
        return { ...result, code: 127 };
      return result;
    };
  }

  spawnIn(ns: string, cmd: string, args: string[]): ChildProcess {
    this.#own(ns);
    // `ip netns exec` execs the program, so the child's pid is the program's own.
    const child = spawn('ip', ['netns', 'exec', ns, cmd, ...args], { stdio: ['pipe', 'pipe', 'pipe'] });
    this.#children.add(child);
    child.on('exit', () => this.#children.delete(child));
    return child;
  }

  cleanup(): void {
    for (const child of this.#children) child.kill('SIGKILL');
    this.#children.clear();
    // Synchronous, so it also works from process.on('exit').
    for (const ns of this.#namespaces) deleteNamespaceSync(ns);
    this.#namespaces.clear();
    live.delete(this);
  }

  #own(ns: string): void {
    if (!this.#namespaces.has(ns)) throw new Error(`namespace ${ns} was not created by this sandbox`);
  }
}

/**
 * A sandbox whose namespaces are deleted in `t.after` (when given), on process exit and on
 * SIGINT/SIGTERM/SIGHUP. Also deletes namespaces left by earlier runs whose process is gone.
 */
export async function createSandbox(t?: TestContext): Promise<Sandbox> {
  await sweepStale();
  const sandbox = new SandboxImpl();
  live.add(sandbox);
  installProcessHooks();
  t?.after(() => sandbox.cleanup());
  return sandbox;
}

/** Deletes `kup-<pid>-...` namespaces whose process no longer exists (a run killed with SIGKILL). */
async function sweepStale(): Promise<void> {
  const { stdout } = await hostRun('ip', ['netns', 'list']);
  for (const line of stdout.split('\n')) {
    const ns = line.split(' ')[0] ?? '';
    const m = PREFIX_RE.exec(ns);
    if (m && !alive(Number(m[1]))) deleteNamespaceSync(ns);
  }
}

/** Kills what still runs inside `ns` (only processes of our own namespaces), then deletes it. */
function deleteNamespaceSync(ns: string): void {
  const pids = spawnSync('ip', ['netns', 'pids', ns], { encoding: 'utf8' }).stdout ?? '';
  for (const pid of pids.split('\n').filter((p) => /^\d+$/.test(p))) {
    try {
      process.kill(Number(pid), 'SIGKILL');
    } catch {}
  }
  spawnSync('ip', ['netns', 'del', ns], { stdio: 'ignore' });
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

async function ipHost(args: string[]): Promise<void> {
  const r = await hostRun('ip', args);
  if (r.code !== 0) throw new Error(`ip ${args.join(' ')} exited with ${r.code}: ${r.stderr.trim()}`);
}

/** The tiny cluster of the e2e tests: a node namespace with a bridge and pods veth'd to it. */
export type Cluster = {
  readonly node: string;
  /** The node's own address ("eth0", a dummy: no route leads out of the namespaces). */
  readonly nodeIP: string;
  /** The bridge address, the pods' gateway. */
  readonly bridgeIP: string;
  readonly pods: readonly { readonly ns: string; readonly ip: string }[];
};

/**
 * Builds node (eth0 192.168.50.2/24 with a default route, bridge kbr0 10.244.0.1/24) and `pods`
 * namespaces (eth0 10.244.0.10+i/24, default route via the bridge).
 */
export async function createCluster(sandbox: Sandbox, options: { pods?: number } = {}): Promise<Cluster> {
  const node = await sandbox.createNamespace('node');
  await sandbox.dummy(node, 'eth0');
  await sandbox.addAddress(node, 'eth0', '192.168.50.2/24');
  await sandbox.defaultRoute(node, '192.168.50.1', 'eth0');
  await sandbox.bridge(node, 'kbr0');
  await sandbox.addAddress(node, 'kbr0', '10.244.0.1/24');
  const pods: { ns: string; ip: string }[] = [];
  for (let i = 0; i < (options.pods ?? 1); i++) {
    const ns = await sandbox.createNamespace(`pod${i}`);
    const ip = `10.244.0.${10 + i}`;
    await sandbox.veth({ ns, name: 'eth0' }, { ns: node, name: `vpod${i}` });
    await sandbox.attach(node, `vpod${i}`, 'kbr0');
    await sandbox.addAddress(ns, 'eth0', `${ip}/24`);
    await sandbox.defaultRoute(ns, '10.244.0.1', 'eth0');
    pods.push({ ns, ip });
  }
  return { node, nodeIP: '192.168.50.2', bridgeIP: '10.244.0.1', pods };
}
