// The load generators' output, read into numbers (pure: text in, values out), and which tools the
// namespace benchmark needs. iperf3 -J, wrk --latency and dnsperf print what is parsed here.

/** Programs the namespace benchmark runs; bench/setup.sh installs them. */
export const TOOLS = ['iperf3', 'wrk', 'dnsperf', 'haproxy', 'nginx', 'dnsmasq', 'ip', 'iptables'] as const;
export const NGINX_STREAM_MODULE = '/usr/lib/nginx/modules/ngx_stream_module.so';

export type IperfResult = { gbps: number; retransmits: number; error?: string };

/** iperf3 -J: the receiver's rate (what arrived), in Gbit/s, and the sender's retransmits. */
export function parseIperf3(json: string): IperfResult {
  let doc: {
    error?: string;
    end?: { sum_received?: { bits_per_second?: number }; sum_sent?: { retransmits?: number } };
  };
  try {
    doc = JSON.parse(json);
  } catch {
    return { gbps: Number.NaN, retransmits: 0, error: `iperf3 printed no JSON: ${json.slice(0, 200)}` };
  }
  const bps = doc.end?.sum_received?.bits_per_second;
  if (doc.error || bps === undefined)
    return { gbps: Number.NaN, retransmits: 0, error: doc.error ?? 'iperf3: no sum_received' };
  return { gbps: bps / 1e9, retransmits: doc.end?.sum_sent?.retransmits ?? 0 };
}

export type WrkResult = {
  rps: number;
  /** Latency percentiles in ms (wrk --latency: 50, 75, 90, 99). */
  p50: number;
  p99: number;
  requests: number;
  /** connect + read + write + timeout socket errors, and non-2xx/3xx responses. */
  errors: number;
  error?: string;
};

const UNIT_MS: Record<string, number> = { us: 0.001, ms: 1, s: 1000, m: 60_000 };

function toMs(value: string, unit: string): number {
  return Number(value) * (UNIT_MS[unit] ?? Number.NaN);
}

/** wrk --latency text output. */
export function parseWrk(text: string): WrkResult {
  const pct = (p: string) => {
    const m = new RegExp(`^\\s*${p}%\\s+([\\d.]+)(us|ms|s|m)\\s*$`, 'm').exec(text);
    return m ? toMs(m[1]!, m[2]!) : Number.NaN;
  };
  const rps = Number(/^Requests\/sec:\s+([\d.]+)/m.exec(text)?.[1] ?? Number.NaN);
  const requests = Number(/^\s*(\d+) requests in /m.exec(text)?.[1] ?? 0);
  const sock = /Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/.exec(text);
  const non2xx = Number(/Non-2xx or 3xx responses: (\d+)/.exec(text)?.[1] ?? 0);
  const errors = (sock ? sock.slice(1).reduce((n, x) => n + Number(x), 0) : 0) + non2xx;
  const result: WrkResult = { rps, p50: pct('50'), p99: pct('99'), requests, errors };
  if (Number.isNaN(rps)) result.error = `wrk: no Requests/sec in: ${text.slice(0, 300)}`;
  return result;
}

export type DnsperfResult = { qps: number; lostPercent: number; avgLatencyMs: number; error?: string };

/** dnsperf's summary. */
export function parseDnsperf(text: string): DnsperfResult {
  const qps = Number(/Queries per second:\s+([\d.]+)/.exec(text)?.[1] ?? Number.NaN);
  const lost = Number(/Queries lost:\s+\d+ \(([\d.]+)%\)/.exec(text)?.[1] ?? Number.NaN);
  const avg = Number(/Average Latency \(s\):\s+([\d.]+)/.exec(text)?.[1] ?? Number.NaN) * 1000;
  const result: DnsperfResult = { qps, lostPercent: lost, avgLatencyMs: avg };
  if (Number.isNaN(qps)) result.error = `dnsperf: no Queries per second in: ${text.slice(0, 300)}`;
  return result;
}

/** The first version-looking token of a tool's --version output ("3.12", "4.1.0-3+b2", "2.6.12-1+deb12u4"). */
export function versionOf(text: string): string {
  return /\d+\.\d+(?:\.\d+)?(?:[-+~][\w.+~-]*)?/.exec(text)?.[0] ?? '?';
}

/** utime + stime (clock ticks) from /proc/<pid>/stat text; the command may contain spaces and parens. */
export function cpuTicks(stat: string): number {
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // Fields after "(comm)": state is index 0, utime is field 14 of the whole line → index 11 here.
  return Number(fields[11] ?? 0) + Number(fields[12] ?? 0);
}

/** VmRSS in KiB from /proc/<pid>/status text. */
export function rssKiB(status: string): number {
  return Number(/^VmRSS:\s+(\d+) kB/m.exec(status)?.[1] ?? Number.NaN);
}

export function median(xs: readonly number[]): number {
  const s = xs.filter((x) => !Number.isNaN(x)).sort((a, b) => a - b);
  if (s.length === 0) return Number.NaN;
  const mid = s.length >> 1;
  return s.length % 2 === 1 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2;
}

/** Busy and total jiffies of all CPUs from /proc/stat text (the "cpu " line). */
export function cpuJiffies(stat: string): { busy: number; total: number } {
  const f = (/^cpu\s+(.*)$/m.exec(stat)?.[1] ?? '').trim().split(/\s+/).map(Number);
  // user nice system idle iowait irq softirq steal (guest time is already in user).
  const total = f.slice(0, 8).reduce((a, b) => a + b, 0);
  const idle = (f[3] ?? 0) + (f[4] ?? 0);
  return { busy: total - idle, total };
}
