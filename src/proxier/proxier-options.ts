// The proxier's options as the configuration sets them: built here for the main process and for every
// worker process (--workers), so that they relay alike.
import { availableParallelism } from 'node:os';
import { type Config, MAX_AUTO_WORKERS, MAX_WORKERS } from '../config/config-type.ts';
import { DEFAULT_OUTLIER_OPTIONS } from '../loadbalancer/outlier.ts';
import { DEFAULT_TCP_OPTIONS } from '../relay/tcp.ts';
import { DEFAULT_UDP_OPTIONS } from '../relay/udp.ts';
import { type FdLimits, tcpConnectionCap, udpSessionCap } from './process-limits.ts';
import type { ProxierOptions } from './proxier.ts';

/** --workers resolved: 0 is the cores this process may use, at most MAX_AUTO_WORKERS; never more than MAX_WORKERS. */
export function workerCount(configured: number, cores: number = availableParallelism()): number {
  const n = configured === 0 ? Math.min(cores, MAX_AUTO_WORKERS) : configured;
  return Math.max(1, Math.min(MAX_WORKERS, n));
}

/**
 * The options of a proxier relaying for `config`. `processes` share the listening ports with
 * SO_REUSEPORT when more than one.
 */
export function proxierOptions(
  config: Config,
  fdLimits: FdLimits | undefined,
  processes: number,
): ProxierOptions {
  const shared = processes > 1;
  return {
    listenHost: config.bindAddress === '0.0.0.0' ? '::' : config.bindAddress,
    syncPeriodMs: config.iptablesSyncPeriodMs,
    tcp: {
      ...DEFAULT_TCP_OPTIONS,
      idleTimeoutMs: config.tcpIdleTimeoutMs,
      halfCloseTimeoutMs: config.tcpHalfCloseTimeoutMs,
      stallTimeoutMs: config.tcpStallTimeoutMs,
      maxConnections: tcpConnectionCap(config.maxConnectionsPerService, fdLimits),
      reusePort: shared,
    },
    udp: {
      ...DEFAULT_UDP_OPTIONS,
      idleTimeoutMs: config.udpTimeoutMs,
      maxSessions: config.udpMaxSessions,
      reusePort: shared,
    },
    // Derived from this process's descriptor limit, which every process has for itself.
    udpMaxTotalSessions: udpSessionCap(config.udpMaxSessionsTotal, fdLimits),
    claimNodePorts: config.iptables,
    proxyProtocol: config.proxyProtocol,
    // One client's connections land on any of the processes: its endpoint must not depend on which.
    affinityByHash: shared,
    outlier:
      config.outlierConsecutiveFailures > 0
        ? {
            ...DEFAULT_OUTLIER_OPTIONS,
            consecutiveFailures: config.outlierConsecutiveFailures,
            baseEjectionMs: config.outlierBaseEjectionMs,
          }
        : undefined,
  };
}
