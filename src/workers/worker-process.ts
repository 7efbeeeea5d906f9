// A worker process (--workers): relays what the main process tells it to. It listens on every proxy
// port of the main process with SO_REUSEPORT (the kernel spreads new connections and UDP clients over
// the processes), keeps its own connections, balancers and trace table, and writes no rules, state file
// or health. Started by WorkerPool with fork(); everything it knows comes over the IPC channel.
import './ignore-sigusr1.ts';
import { logLevel } from '../config/config.ts';
import { createLogger, type Logger } from '../lib/log.ts';
import { MallocTrimmer, processMallocTrim } from '../lib/malloc-trim.ts';
import { PortAllocator } from '../proxier/port-allocator.ts';
import { readFdLimits } from '../proxier/process-limits.ts';
import { Proxier } from '../proxier/proxier.ts';
import { proxierOptions } from '../proxier/proxier-options.ts';
import { setConnectionIdBase } from '../relay/connection-id.ts';
import type { ServicePortStats } from '../relay/service-context.ts';
import { type ServicePortKey, servicePortKey } from '../state/service-port.ts';
import { type ConnectionFilter, ConnectionTable } from '../trace/connection-table.ts';
import { createTracer, type Subscription, type Tracer } from '../trace/tracer.ts';
import type { FromWorker, InitMessage, ToWorker } from './messages.ts';
import { ReplicaSource } from './replica-source.ts';
import { TableReviver } from './revive.ts';

/** How often a worker retries the service ports it could not open (the main process's sync period). */
const RETRY_MS = 5_000;

class Worker {
  readonly #log: Logger;
  readonly #replica = new ReplicaSource();
  readonly #reviver = new TableReviver();
  // The first table (every service port at once) is this process's peak: malloc's free pages go back.
  readonly #trimmer = new MallocTrimmer(processMallocTrim().calls);
  readonly proxier: Proxier;
  readonly #connections: ConnectionTable;
  readonly #tracer: Tracer;
  /** The trace streams the main process's followers asked for, by its subscription number. */
  readonly #follows = new Map<number, Subscription>();
  #running = false;
  #again = false;
  #draining = false;
  readonly #retry: NodeJS.Timeout;

  constructor(init: InitMessage) {
    const { config } = init;
    this.#log = createLogger({ level: logLevel(config.verbosity), format: config.logFormat }).child({
      worker: init.id,
    });
    setConnectionIdBase(init.id);
    const connections = new ConnectionTable({ maxRecent: config.traceRecentConnections });
    this.#connections = connections;
    const tracer = createTracer({
      mode: config.trace,
      table: connections,
      accessLog: config.accessLog ? this.#log.child({ component: 'access' }) : undefined,
    });
    this.#tracer = tracer;
    this.proxier = new Proxier(
      {
        ...proxierOptions(config, readFdLimits(), init.processes),
        listenHost: init.listenHost,
        // NodePorts are held by the main process; the rules it writes send traffic here too.
        claimNodePorts: false,
        portalsElsewhere: config.iptables,
      },
      {
        source: this.#replica,
        // Unused: the binder takes the main process's ports (exactPorts).
        allocator: new PortAllocator({ base: 0, size: 0 }),
        log: this.#log.child({ component: 'proxier' }),
        preferredPorts: this.#replica.ports,
        exactPorts: true,
        observerFor: tracer.observerFor,
        onEjection: (context, ejection) =>
          send({
            t: 'ejection',
            key: servicePortKey(context.name, context.protocol),
            endpoint: ejection.endpoint,
            untilMs: ejection.untilMs,
            ejections: ejection.ejections,
          }),
      },
    );
    this.#retry = setInterval(() => {
      if (this.proxier.failures().size > 0) this.#sync(true);
    }, RETRY_MS);
    this.#retry.unref();
  }

  onMessage(msg: ToWorker): void {
    switch (msg.t) {
      case 'table':
        if (this.#draining) return;
        this.#replica.apply(this.#reviver.revive(msg));
        this.#sync(false);
        return;
      case 'stats':
        send({ t: 'stats', id: msg.id, stats: this.#stats() });
        return;
      case 'ejection':
        this.proxier.applyEjection(msg.key, msg.endpoint, msg.untilMs, msg.ejections);
        return;
      case 'connections':
        send({ t: 'connections', id: msg.id, listing: this.#connections.list(msg.options) });
        return;
      case 'trace-recent':
        send({ t: 'trace-recent', id: msg.id, lines: this.#tracer.recentLines(msg.filter, msg.limit) });
        return;
      case 'trace-follow':
        this.#follow(msg.sub, msg.filter);
        return;
      case 'trace-unfollow':
        this.#follows.get(msg.sub)?.close();
        this.#follows.delete(msg.sub);
        return;
      case 'drain':
        void this.drain(msg.graceMs);
        return;
      default:
        return;
    }
  }

  /** Applies what the replica holds; one run at a time, again while something new came meanwhile. */
  #sync(force: boolean): void {
    if (this.#running) {
      this.#again = true;
      return;
    }
    this.#running = true;
    void (async () => {
      try {
        let first = force;
        // Bounded: a replica that stays pending (it should not) costs a log line, not a spinning loop.
        for (let round = 0; !this.#draining && (first || this.#again || this.#replica.pending); round++) {
          if (round === 100) {
            this.#log.error('Worker sync keeps finding changes; giving up until the next table');
            break;
          }
          first = false;
          this.#again = false;
          // The fast path, when the proxier takes it (not before its first sync): else a sync.
          if (!this.#replica.onlyEndpointsPending || this.proxier.applyEndpointChanges() === undefined) {
            const result = await this.proxier.sync();
            if (result !== undefined) this.#trimmer.afterSync(result);
          }
          // Nothing here reads what the snapshot changed: a cold start's sets named every service port.
          this.proxier.releaseChanges();
        }
        send({
          t: 'synced',
          servicePorts: this.proxier.size,
          failed: this.proxier.failures().size,
        });
      } catch (err) {
        this.#log.error({ err }, 'Worker sync failed');
      } finally {
        this.#running = false;
      }
    })();
  }

  /** Streams events for a follower of the main process; what the channel cannot take now is dropped. */
  #follow(sub: number, filter: ConnectionFilter): void {
    if (this.#follows.has(sub)) return;
    const subscription = this.#tracer.subscribeLines(filter, {
      // The channel's own backlog: a main process that does not read its messages gets no more.
      ready: () => process.connected,
      write: (data) => send({ t: 'trace-lines', sub, data }),
    });
    if (subscription !== undefined) this.#follows.set(sub, subscription);
  }

  #stats(): [ServicePortKey, ServicePortStats][] {
    return this.proxier.status().map((s) => [s.servicePort.key, s.context.stats]);
  }

  /** Stops accepting; connections finish within `graceMs`, then the rest are torn down; exits 0. */
  async drain(graceMs: number): Promise<void> {
    if (this.#draining) return;
    this.#draining = true;
    clearInterval(this.#retry);
    await this.proxier.close();
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([
      this.proxier.drained(),
      new Promise<void>((resolve) => {
        timer = setTimeout(resolve, graceMs);
      }),
    ]);
    clearTimeout(timer);
    this.proxier.destroy();
    process.exit(0);
  }
}

function send(msg: FromWorker): void {
  if (process.connected) process.send?.(msg);
}

function main(): void {
  let worker: Worker | undefined;
  // The main process decides when to stop: a signal to the whole process group (Ctrl-C in a terminal)
  // reaches it too, and it drains its workers.
  for (const signal of ['SIGTERM', 'SIGINT', 'SIGHUP'] as const) process.on(signal, () => {});
  process.on('message', (msg: ToWorker) => {
    if (msg.t === 'init') {
      worker ??= new Worker(msg);
      send({ t: 'ready' });
      return;
    }
    worker?.onMessage(msg);
  });
  // The main process is gone (killed): stop taking connections a new one's workers should take, finish
  // those in flight for a while, and go.
  process.on('disconnect', () => {
    if (worker === undefined) process.exit(0);
    else void worker.drain(10_000);
  });
}

main();
