// The main process's side of --workers: forks the worker processes, hands each the table of service
// ports (whole when it starts, deltas after each sync), restarts one that dies without touching the
// others, asks them for their counters, and drains them on shutdown.
import { type ChildProcess, fork } from 'node:child_process';
import type { Config } from '../config/config.ts';
import type { Logger } from '../lib/log.ts';
import type { ServicePortStats } from '../relay/service-context.ts';
import type { ServicePortKey } from '../state/service-port.ts';
import type { ConnectionFilter, ConnectionListing, ListOptions } from '../trace/connection-table.ts';
import type { EjectionMessage, FromWorker, TableMessage, ToWorker } from './messages.ts';

/** Starts one worker process (injected so tests can count or fail starts). */
export type WorkerFork = () => ChildProcess;

/** The worker entry next to this file: .ts when run from source, .js when built. */
const ENTRY = new URL(
  import.meta.url.endsWith('.ts') ? './worker-process.ts' : './worker-process.js',
  import.meta.url,
);

/**
 * Node's flags for a worker: the main process's, plus --disable-sigusr1 (see ignore-sigusr1.ts); with
 * KUP_INSPECTOR_SIGNAL=1, an inspector port of the kernel's choosing instead (the main one has 9229).
 */
export function workerExecArgv(execArgv: readonly string[], env: NodeJS.ProcessEnv): string[] {
  const own = execArgv.filter((a) => a !== '--disable-sigusr1' && !a.startsWith('--inspect-port'));
  return [...own, env.KUP_INSPECTOR_SIGNAL === '1' ? '--inspect-port=0' : '--disable-sigusr1'];
}

export const forkWorker: WorkerFork = () =>
  fork(ENTRY, [], {
    serialization: 'advanced',
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    execArgv: workerExecArgv(process.execArgv, process.env),
  });

export type WorkerPoolOptions = {
  /** Worker processes besides the main one. */
  count: number;
  config: Config;
  log: Logger;
  /** The whole table now, for a worker that (re)starts. */
  table: () => TableMessage;
  /** Where the main process's listeners bind now; the workers bind there too. */
  listenHost: () => string;
  fork?: WorkerFork;
  /** First restart delay; doubles while a worker keeps dying, up to maxRestartDelayMs. */
  restartDelayMs?: number;
  maxRestartDelayMs?: number;
  /** How long an answer to a stats request may take before the worker is left out. */
  statsTimeoutMs?: number;
  /** A worker ejected an endpoint: the main process applies it (the pool tells the other workers). */
  onEjection?: (ejection: EjectionMessage) => void;
};

type Slot = {
  readonly id: number;
  child: ChildProcess | undefined;
  /** Consecutive deaths within a minute of their start: the restart delay grows with them. */
  deaths: number;
  startedMs: number;
  timer: NodeJS.Timeout | undefined;
};

export class WorkerPool {
  readonly #options: WorkerPoolOptions;
  readonly #slots: Slot[];
  readonly #fork: WorkerFork;
  #closing = false;
  #requestId = 0;
  readonly #waiting = new Map<number, (stats: FromWorker) => void>();
  /** Trace followers of the main process, by subscription number: their filter and where lines go. */
  readonly #follows = new Map<number, { filter: ConnectionFilter; onLines: (data: Uint8Array) => void }>();
  #followId = 0;

  constructor(options: WorkerPoolOptions) {
    this.#options = options;
    this.#fork = options.fork ?? forkWorker;
    this.#slots = Array.from({ length: options.count }, (_, i) => ({
      id: i + 1,
      child: undefined,
      deaths: 0,
      startedMs: 0,
      timer: undefined,
    }));
  }

  /** The workers' process ids (0 for one that is restarting). */
  get pids(): number[] {
    return this.#slots.map((s) => s.child?.pid ?? 0);
  }

  start(): void {
    for (const slot of this.#slots) this.#spawn(slot);
  }

  #spawn(slot: Slot): void {
    if (this.#closing) return;
    const { log, config } = this.#options;
    const child = this.#fork();
    slot.child = child;
    slot.startedMs = Date.now();
    child.on('message', (msg: FromWorker) => this.#onMessage(slot, child, msg));
    child.on('error', (err) => log.error({ err, worker: slot.id }, 'Worker process error'));
    child.once('exit', (code, signal) => this.#onExit(slot, child, code, signal));
    this.#send(child, {
      t: 'init',
      id: slot.id,
      processes: this.#slots.length + 1,
      config,
      listenHost: this.#options.listenHost(),
    });
    this.#send(child, this.#options.table());
    // A worker that restarts follows for those already following.
    for (const [sub, { filter }] of this.#follows) this.#send(child, { t: 'trace-follow', sub, filter });
    log.info({ worker: slot.id, pid: child.pid }, 'Worker started');
  }

  #onMessage(slot: Slot, child: ChildProcess, msg: FromWorker): void {
    if (slot.child !== child) return;
    if (msg.t === 'stats' || msg.t === 'connections' || msg.t === 'trace-recent') {
      this.#waiting.get(msg.id)?.(msg);
      return;
    }
    if (msg.t === 'ejection') {
      this.#options.onEjection?.(msg);
      for (const other of this.#slots)
        if (other !== slot && other.child !== undefined) this.#send(other.child, msg);
      return;
    }
    if (msg.t === 'trace-lines') {
      this.#follows.get(msg.sub)?.onLines(msg.data);
      return;
    }
    if (msg.t === 'synced' && msg.failed > 0)
      this.#options.log.debug(
        { worker: slot.id, failed: msg.failed },
        'Worker could not open every service port',
      );
  }

  #onExit(slot: Slot, child: ChildProcess, code: number | null, signal: NodeJS.Signals | null): void {
    if (slot.child !== child) return;
    slot.child = undefined;
    if (this.#closing) return;
    const { log } = this.#options;
    // A worker that lived a minute is healthy again: its next death restarts it at the first delay.
    slot.deaths = Date.now() - slot.startedMs > 60_000 ? 1 : slot.deaths + 1;
    const base = this.#options.restartDelayMs ?? 100;
    const delay = Math.min(this.#options.maxRestartDelayMs ?? 30_000, base * 2 ** (slot.deaths - 1));
    log.warn(
      { worker: slot.id, pid: child.pid, code, signal, restartInMs: delay },
      'Worker exited; restarting it',
    );
    slot.timer = setTimeout(() => {
      slot.timer = undefined;
      this.#spawn(slot);
    }, delay);
    slot.timer.unref();
  }

  /** A change the main process applied, or an ejection it decided: to every worker. */
  send(table: TableMessage | EjectionMessage): void {
    for (const slot of this.#slots) if (slot.child !== undefined) this.#send(slot.child, table);
  }

  #send(child: ChildProcess, msg: ToWorker): void {
    if (!child.connected) return;
    try {
      child.send(msg);
    } catch (err) {
      this.#options.log.warn({ err, pid: child.pid }, 'Could not message a worker');
    }
  }

  /**
   * Every running worker's counters, by service port; a worker that does not answer within the timeout
   * is left out (its counters are missing from this answer only).
   */
  async stats(): Promise<Map<ServicePortKey, ServicePortStats>[]> {
    const replies = await this.#ask((id) => ({ t: 'stats', id }));
    return replies.flatMap((r) => (r.t === 'stats' ? [new Map(r.stats)] : []));
  }

  /** Every running worker's connection table, as `options` asks (a worker that does not answer is left out). */
  async connections(options: ListOptions): Promise<ConnectionListing[]> {
    const replies = await this.#ask((id) => ({ t: 'connections', id, options }));
    return replies.flatMap((r) => (r.t === 'connections' ? [r.listing] : []));
  }

  /** Every running worker's buffered trace events matching `filter` (NDJSON each; those that answered). */
  async recentTraceLines(filter: ConnectionFilter, limit: number | undefined): Promise<string[]> {
    const replies = await this.#ask((id) => ({ t: 'trace-recent', id, filter, limit }));
    return replies.flatMap((r) => (r.t === 'trace-recent' ? [r.lines] : []));
  }

  /** Every worker's live trace events matching `filter`, to `onLines` (NDJSON batches) until close(). */
  followTrace(filter: ConnectionFilter, onLines: (data: Uint8Array) => void): { close(): void } {
    const sub = ++this.#followId;
    this.#follows.set(sub, { filter, onLines });
    for (const slot of this.#slots)
      if (slot.child !== undefined) this.#send(slot.child, { t: 'trace-follow', sub, filter });
    return {
      close: () => {
        if (!this.#follows.delete(sub)) return;
        for (const slot of this.#slots)
          if (slot.child !== undefined) this.#send(slot.child, { t: 'trace-unfollow', sub });
      },
    };
  }

  /** One request to every connected worker; the replies that came within the timeout. */
  async #ask(request: (id: number) => ToWorker): Promise<FromWorker[]> {
    const timeoutMs = this.#options.statsTimeoutMs ?? 1000;
    const asks = this.#slots
      .filter((s) => s.child?.connected === true)
      .map(
        (slot) =>
          new Promise<FromWorker | undefined>((resolve) => {
            const id = ++this.#requestId;
            const timer = setTimeout(() => {
              this.#waiting.delete(id);
              resolve(undefined);
            }, timeoutMs);
            this.#waiting.set(id, (msg) => {
              clearTimeout(timer);
              this.#waiting.delete(id);
              resolve(msg);
            });
            this.#send(slot.child!, request(id));
          }),
      );
    return (await Promise.all(asks)).filter((m) => m !== undefined);
  }

  /**
   * Tells every worker to stop accepting and drain within `graceMs`; resolves when all have exited
   * (those still running `graceMs` + 2 s later are killed).
   */
  async drain(graceMs: number): Promise<void> {
    this.#closing = true;
    const running: ChildProcess[] = [];
    for (const slot of this.#slots) {
      if (slot.timer !== undefined) clearTimeout(slot.timer);
      const child = slot.child;
      if (child === undefined || child.exitCode !== null || child.signalCode !== null) continue;
      running.push(child);
      this.#send(child, { t: 'drain', graceMs });
    }
    await Promise.all(
      running.map(
        (child) =>
          new Promise<void>((resolve) => {
            if (child.exitCode !== null || child.signalCode !== null) return resolve();
            const timer = setTimeout(() => child.kill('SIGKILL'), graceMs + 2_000);
            timer.unref();
            child.once('exit', () => {
              clearTimeout(timer);
              resolve();
            });
          }),
      ),
    );
  }

  /** Kills every worker now (a shutdown whose drain is over, or a failed start). */
  kill(): void {
    this.#closing = true;
    for (const slot of this.#slots) {
      if (slot.timer !== undefined) clearTimeout(slot.timer);
      slot.child?.kill('SIGKILL');
    }
  }
}
