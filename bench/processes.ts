// The processes of the benchmark: a daemon started in a namespace (output kept, stop with a grace), the
// agent that acts inside a namespace, and what /proc says about CPU and memory, of ours and of others.
import type { ChildProcess } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import type { Sandbox } from '../test/helpers/netns.ts';
import { cpuJiffies, cpuTicks, rssKiB } from './tools.ts';

const AGENT = fileURLToPath(new URL('agent.ts', import.meta.url));

/** A process the benchmark started in a namespace, with its last output lines. */
export class Daemon {
  readonly name: string;
  readonly child: ChildProcess;
  readonly lines: string[] = [];
  /** pino lines at level warn (40) or above, for the report. */
  warnings = 0;
  /** Inspector ports of its worker processes, by pid, once opened (Rig.collectGarbage). */
  readonly inspectors = new Map<number, number>();
  /**
   * The inspector ports its processes announced ("Debugger listening on ws://127.0.0.1:PORT/…"), kept
   * apart from `lines`: a worker logging its 10,000 opened ports pushed the line out of the last 200
   * before it was looked for.
   */
  readonly #inspectorPorts: number[] = [];
  /** Set once stop() was called: an exit after that is not a crash. */
  stopping = false;
  readonly exited: Promise<number | null>;

  constructor(name: string, child: ChildProcess) {
    this.name = name;
    this.child = child;
    for (const stream of [child.stdout, child.stderr]) {
      if (!stream) continue;
      createInterface({ input: stream }).on('line', (line) => {
        const inspector = /Debugger listening on ws:\/\/[^:]+:(\d+)\//.exec(line);
        if (inspector) this.#inspectorPorts.push(Number(inspector[1]));
        if (/"level":\s*([4-9]\d)/.test(line)) {
          this.warnings++;
          if (this.warnings <= 20) this.lines.push(line);
        } else this.lines.push(line);
        if (this.lines.length > 200) this.lines.shift();
      });
    }
    this.exited = new Promise((resolve) => child.once('exit', (code) => resolve(code)));
  }

  get pid(): number {
    return this.child.pid ?? 0;
  }

  get running(): boolean {
    return this.child.exitCode === null && this.child.signalCode === null;
  }

  /** The process and its direct children (nginx workers). */
  pids(): number[] {
    const pid = this.pid;
    let children: number[] = [];
    try {
      children = readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8')
        .trim()
        .split(/\s+/)
        .filter(Boolean)
        .map(Number);
    } catch {}
    return [pid, ...children];
  }

  /** SIGTERM, then SIGKILL after `graceMs`. */
  async stop(graceMs = 12_000): Promise<void> {
    this.stopping = true;
    if (!this.running) return;
    this.child.kill('SIGTERM');
    const timer = setTimeout(() => this.child.kill('SIGKILL'), graceMs);
    await this.exited;
    clearTimeout(timer);
  }

  /** The inspector ports its processes announced, in order. */
  inspectorPorts(): number[] {
    return [...this.#inspectorPorts];
  }

  tail(n = 20): string {
    return this.lines.slice(-n).join('\n');
  }
}

/** Summed RSS (KiB) of processes. */
export function rssOf(pids: readonly number[]): number {
  let kib = 0;
  for (const pid of pids) {
    try {
      kib += rssKiB(readFileSync(`/proc/${pid}/status`, 'utf8'));
    } catch {}
  }
  return kib;
}

/** Summed CPU time (clock ticks) of processes and their threads. */
export function cpuOf(pids: readonly number[]): number {
  let ticks = 0;
  for (const pid of pids) {
    try {
      ticks += cpuTicks(readFileSync(`/proc/${pid}/stat`, 'utf8'));
    } catch {}
  }
  return ticks;
}

/**
 * Requests and answers as JSON lines over a child's stdin and stdout (bench/agent.ts,
 * bench/apiserver-agent.ts): `{id, op, args}` in, `{id, ...}` out, and one `{ready: true, ...}` line
 * when the child is ready. Lines that are not JSON are ignored.
 */
export class JsonLineChannel {
  readonly #daemon: Daemon;
  readonly #name: string;
  readonly #pending = new Map<number, (v: Record<string, unknown>) => void>();
  #next = 1;
  /** The ready line; rejects when it does not come within `readyMs` or the child exits first. */
  readonly ready: Promise<Record<string, unknown>>;

  constructor(daemon: Daemon, name: string, readyMs = 10_000) {
    this.#daemon = daemon;
    this.#name = name;
    // A write after it died fails with EPIPE: the exit (or the request's deadline) reports that instead.
    daemon.child.stdin?.on('error', () => {});
    this.ready = new Promise((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`${name} not ready within ${readyMs / 1000} s`)),
        readyMs,
      );
      daemon.exited.then((code) => {
        clearTimeout(timer);
        reject(new Error(`${name} exited (${code}): ${daemon.tail()}`));
      });
      createInterface({ input: daemon.child.stdout! }).on('line', (line) => {
        let msg: Record<string, unknown> & { id?: number; ready?: boolean };
        try {
          msg = JSON.parse(line);
        } catch {
          return;
        }
        if (msg.ready) {
          clearTimeout(timer);
          resolve(msg);
          return;
        }
        const done = this.#pending.get(msg.id ?? 0);
        this.#pending.delete(msg.id ?? 0);
        done?.(msg);
      });
    });
  }

  /** One request; rejects when no answer comes within `deadlineMs`. */
  request<T = Record<string, unknown>>(op: string, args: object = {}, deadlineMs = 60_000): Promise<T> {
    const id = this.#next++;
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#pending.delete(id);
        reject(new Error(`${this.#name}: no answer to ${op} within ${deadlineMs} ms`));
      }, deadlineMs);
      this.#pending.set(id, (v) => {
        clearTimeout(timer);
        resolve(v as T);
      });
      this.#daemon.child.stdin!.write(`${JSON.stringify({ id, op, args })}\n`);
    });
  }

  /** Answers every request still waiting with `answer` (the child is gone). */
  answerPending(answer: Record<string, unknown>): void {
    for (const done of this.#pending.values()) done(answer);
    this.#pending.clear();
  }
}

/** The agent (bench/agent.ts) in one namespace. */
export class Probe {
  readonly ns: string;
  readonly #daemon: Daemon;
  readonly #channel: JsonLineChannel;

  private constructor(daemon: Daemon, ns: string) {
    this.#daemon = daemon;
    this.ns = ns;
    this.#channel = new JsonLineChannel(daemon, `agent in ${ns}`);
  }

  static async start(sandbox: Sandbox, ns: string): Promise<Probe> {
    const probe = new Probe(new Daemon(`agent in ${ns}`, sandbox.spawnIn(ns, process.execPath, [AGENT])), ns);
    await probe.#channel.ready;
    return probe;
  }

  get pid(): number {
    return this.#daemon.pid;
  }

  /** One request; rejects when no answer comes within `deadlineMs`. */
  request<T = Record<string, unknown>>(op: string, args: object = {}, deadlineMs = 60_000): Promise<T> {
    return this.#channel.request<T>(op, args, deadlineMs);
  }
}

/** Busy and total clock ticks of all CPUs since boot (/proc/stat). */
export function machineJiffies(): { busy: number; total: number } {
  return cpuJiffies(readFileSync('/proc/stat', 'utf8'));
}

/**
 * How busy the machine is while the benchmark itself is idle: % of all CPUs over `ms`, and the
 * processes that used the most (others' builds or tests make every ratio noisy).
 */
export async function machineBusy(ms = 1000): Promise<{ percent: number; top: string[] }> {
  const procs = () => {
    const m = new Map<number, { comm: string; ticks: number }>();
    for (const name of readdirSync('/proc')) {
      if (!/^\d+$/.test(name)) continue;
      try {
        const stat = readFileSync(`/proc/${name}/stat`, 'utf8');
        const comm = stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')'));
        m.set(Number(name), { comm, ticks: cpuTicks(stat) });
      } catch {}
    }
    return m;
  };
  const s0 = machineJiffies();
  const p0 = procs();
  await new Promise((r) => setTimeout(r, ms));
  const s1 = machineJiffies();
  const p1 = procs();
  const percent = ((s1.busy - s0.busy) / Math.max(s1.total - s0.total, 1)) * 100;
  const top = [...p1.entries()]
    .map(([pid, p]) => ({ pid, comm: p.comm, d: p.ticks - (p0.get(pid)?.ticks ?? p.ticks) }))
    .filter((p) => p.d > 0 && p.pid !== process.pid)
    .sort((a, b) => b.d - a.d)
    .slice(0, 3)
    .map((p) => `${p.comm}[${p.pid}] ${((p.d / (ms / 10)) * 100).toFixed(0)}%`);
  return { percent, top };
}

export type CpuSnapshot = { machine: number; ours: number; kernel: number };

/**
 * Where the machine's CPU went, in ticks: all of it (user + nice + system, all cores), ours (the given
 * processes and their reaped children: the load generators are children of this process), and kernel
 * threads (ksoftirqd and kworkers carry our own packets). Two snapshots around a sample give the CPU
 * that other work took from it (`otherTicks`).
 */
export function cpuSnapshot(ours: ReadonlySet<number>): CpuSnapshot {
  const f = (/^cpu\s+(.*)$/m.exec(readFileSync('/proc/stat', 'utf8'))?.[1] ?? '')
    .trim()
    .split(/\s+/)
    .map(Number);
  const machine = (f[0] ?? 0) + (f[1] ?? 0) + (f[2] ?? 0);
  let mine = 0;
  let kernel = 0;
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    const pid = Number(name);
    try {
      const stat = readFileSync(`/proc/${name}/stat`, 'utf8');
      const x = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      // Fields after "(comm)": 1 ppid, 11 utime, 12 stime, 13 cutime, 14 cstime.
      if (ours.has(pid)) mine += Number(x[11]) + Number(x[12]) + Number(x[13]) + Number(x[14]);
      else if (pid === 2 || x[1] === '2') kernel += Number(x[11]) + Number(x[12]);
    } catch {}
  }
  return { machine, ours: mine, kernel };
}

/** CPU ticks that neither our processes nor kernel threads used between two snapshots (≥ 0). */
export function otherTicks(before: CpuSnapshot, after: CpuSnapshot): number {
  const d = after.machine - before.machine - (after.ours - before.ours) - (after.kernel - before.kernel);
  return Math.max(0, d);
}
