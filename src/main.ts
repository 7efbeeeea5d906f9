// The command-line entry: flags → Config → ProxyServer; signals; exit codes. Nothing else.
import { hostname } from 'node:os';
import { isCompletion, runCompletion } from './config/completion.ts';
import { logLevel } from './config/config.ts';
import { writeConfigFile } from './config/file.ts';
import { parseArgs } from './config/flags.ts';
import { isProxyError } from './lib/errors.ts';
import type { Logger } from './lib/log.ts';
import { createLogger } from './lib/log.ts';
import { applyOomScoreAdj } from './lib/oom-score-adj.ts';
import { VERSION } from './lib/version.ts';
import { createIptables, run } from './netfilter/iptables.ts';
import type { ProxyServer } from './proxy-server.ts';
import { CONNECTIONS_FLAGS, runConnections, runTrace, TRACE_FLAGS } from './trace/cli.ts';

/** --cleanup: removes every chain and jump we ever write, IPv4 and IPv6; safe on a clean host. */
async function cleanup(log: Logger): Promise<number> {
  const iptables = createIptables(run);
  let code = 0;
  for (const family of ['IPv4', 'IPv6'] as const) {
    try {
      await iptables.cleanup(family);
      log.info({ family }, 'Removed the proxy rules');
    } catch (err) {
      // A host without ip6tables (or without IPv6) has nothing of ours to remove.
      if (isProxyError(err, 'KUP_ERR_IPTABLES_MISSING')) {
        log.warn({ family, err }, 'iptables not available, nothing to clean');
        continue;
      }
      log.error({ family, err }, 'Cleanup failed');
      code = 1;
    }
  }
  return code;
}

/** Runs the proxy until a signal; resolves with the exit code. */
export async function main(argv: string[]): Promise<number> {
  if (isCompletion(argv))
    return runCompletion(argv, [
      {
        name: 'connections',
        describe: 'The live connection table of a running proxy',
        flags: CONNECTIONS_FLAGS,
      },
      { name: 'trace', describe: 'Its trace stream: HTTP requests, TLS SNI, DNS names', flags: TRACE_FLAGS },
    ]);
  if (argv[0] === 'connections') return runConnections(argv.slice(1), process.stdout);
  if (argv[0] === 'trace') {
    const stop = new AbortController();
    for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.once(signal, () => stop.abort());
    return runTrace(argv.slice(1), process.stdout, stop.signal);
  }
  let parsed: Awaited<ReturnType<typeof parseArgs>>;
  try {
    parsed = await parseArgs(argv);
  } catch (err) {
    process.stderr.write(`kube-userspace-proxy: ${(err as Error).message}\nRun with --help for the flags.\n`);
    return 2;
  }
  if (parsed.help !== undefined) {
    process.stdout.write(`${parsed.help}\n`);
    return 0;
  }
  if (parsed.version) {
    process.stdout.write(`kube-userspace-proxy ${VERSION}\n`);
    return 0;
  }
  const config = parsed.config;
  if (parsed.writeConfigTo !== undefined) {
    try {
      await writeConfigFile(parsed.writeConfigTo, config);
      return 0;
    } catch (err) {
      process.stderr.write(`kube-userspace-proxy: ${(err as Error).message}\n`);
      return 1;
    }
  }
  const log = createLogger({ level: logLevel(config.verbosity), format: config.logFormat });
  for (const warning of parsed.warnings) log.warn(warning);
  if (config.cleanup) return cleanup(log);
  applyOomScoreAdj(config.oomScoreAdj, log);
  // Loaded here, not at the top: without the proxy's modules the subcommands, --help and shell
  // completion (a process per TAB) start in ~0.4 s instead of ~0.7 s.
  const { ProxyServer: Server } = await import('./proxy-server.ts');
  const server: ProxyServer = new Server(config, { log, hostname: hostname() });
  let stopping = false;
  // The proxy's own timers are unref'd and its file watches not persistent: this holds the process until
  // a signal, whether or not any listener or server is open.
  const keepAlive = setInterval(() => {}, 1 << 30);
  const done = new Promise<number>((resolve) => {
    const stop = (signal: string) => {
      if (stopping) {
        log.info({ signal }, 'Already shutting down; the drain goes on');
        return;
      }
      stopping = true;
      log.info({ signal }, 'Shutting down');
      server.close().then(
        () => {
          clearInterval(keepAlive);
          resolve(0);
        },
        (err) => {
          clearInterval(keepAlive);
          log.error({ err }, 'Shutdown failed');
          resolve(1);
        },
      );
    };
    // SIGHUP (a closed terminal, a supervisor's stop) drains like SIGTERM instead of killing the relays.
    // `on`, not `once`: a second signal must not kill the relays the first one is draining.
    for (const signal of ['SIGTERM', 'SIGINT', 'SIGHUP'] as const) process.on(signal, () => stop(signal));
  });
  // The bin's first line already keeps SIGUSR1 from opening the inspector; this holds for any other caller
  // of main() too, and says so once.
  if (process.env.KUP_INSPECTOR_SIGNAL !== '1') {
    let told = false;
    process.on('SIGUSR1', () => {
      if (!told) log.warn('Ignoring SIGUSR1: the inspector cannot be opened by a signal');
      told = true;
    });
  }
  try {
    await server.start();
    log.info(
      {
        version: VERSION,
        source: config.manifest ? `manifest ${config.manifest}` : 'kubernetes',
        iptables: config.iptables,
      },
      'Proxy started',
    );
  } catch (err) {
    log.fatal({ err }, 'Start failed');
    await server.close().catch(() => {});
    clearInterval(keepAlive);
    return 1;
  }
  return done;
}
