// The proxy's effective configuration and its defaults (kube-proxy's where they exist). Pure data.
import type { TraceMode } from '../state/service-port.ts';

export type Config = {
  /** --manifest: the embedded default source. */
  manifest: string | undefined;
  kubeconfig: string | undefined;
  master: string | undefined;
  hostnameOverride: string;
  /** --bind-address: where proxy listeners bind (0.0.0.0 = all addresses, dual-stack). */
  bindAddress: string;
  proxyPortRange: string;
  udpTimeoutMs: number;
  /** Our addition: UDP sessions per service port before the idlest is evicted. */
  udpMaxSessions: number;
  iptablesSyncPeriodMs: number;
  iptablesMinSyncPeriodMs: number;
  configSyncPeriodMs: number;
  /** host:port, or '' to disable. */
  healthzBindAddress: string;
  metricsBindAddress: string;
  bindAddressHardFail: boolean;
  nodePortAddresses: string[];
  cleanup: boolean;
  oomScoreAdj: number;
  /** --no-iptables: listen only, program nothing. */
  iptables: boolean;
  /** klog-style verbosity: 0 info, 2 debug, 4+ trace. */
  verbosity: number;
  /** Our addition: TCP idle timeout; 0 = none (kube-proxy). */
  tcpIdleTimeoutMs: number;
  /** Our addition: how long a half-closed TCP connection may stay without traffic. */
  tcpHalfCloseTimeoutMs: number;
  /** Our addition: how long shutdown waits for connections to finish. */
  shutdownGracePeriodMs: number;
  trace: TraceMode;
  /** Human-readable logs instead of JSON lines. */
  logFormat: 'json' | 'text';
};

export const DEFAULT_CONFIG: Config = {
  manifest: undefined,
  kubeconfig: undefined,
  master: undefined,
  hostnameOverride: '',
  bindAddress: '0.0.0.0',
  proxyPortRange: '',
  udpTimeoutMs: 250,
  udpMaxSessions: 4096,
  iptablesSyncPeriodMs: 30_000,
  iptablesMinSyncPeriodMs: 1_000,
  configSyncPeriodMs: 15 * 60_000,
  healthzBindAddress: '0.0.0.0:10256',
  metricsBindAddress: '127.0.0.1:10249',
  bindAddressHardFail: false,
  nodePortAddresses: [],
  cleanup: false,
  oomScoreAdj: -999,
  iptables: true,
  verbosity: 0,
  tcpIdleTimeoutMs: 0,
  tcpHalfCloseTimeoutMs: 60_000,
  shutdownGracePeriodMs: 10_000,
  trace: 'protocols',
  logFormat: 'json',
};

/** klog verbosity → pino level. */
export function logLevel(verbosity: number): string {
  if (verbosity >= 4) return 'trace';
  if (verbosity >= 2) return 'debug';
  return 'info';
}
