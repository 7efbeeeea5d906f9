// The `connections` and `trace` subcommands: clients of the metrics server's /debug/connections and
// /debug/trace that print a table or readable trace lines (or the JSON). No proxy state of their own.
// Paths, server names and user names come from clients: nothing they sent reaches the terminal raw
// (control characters are printed escaped; the JSON output has the same values, only escaped).
import { parseArgs } from 'node:util';
import { Agent, request } from 'undici';
import { checkHostPort } from '../config/validate.ts';
import { isProxyError, ProxyError } from '../lib/errors.ts';
import { parseHostPort } from '../lib/host-port.ts';
import { jsonSafe, printable } from '../lib/printable.ts';
import type { ConnectionListing, ConnectionRecord } from './connection-table.ts';
import type { AppInfo } from './sniff/types.ts';
import type { TraceEvent } from './tracer.ts';

type Out = { write(text: string): unknown };

/** kube-proxy's metrics port (ProxyStatusPort): the port of a bare IP, as the proxy's flag takes it. */
const METRICS_PORT = 10249;
const DEFAULT_METRICS_ADDRESS = `127.0.0.1:${METRICS_PORT}`;

const CONNECTIONS_HELP = `Usage: kube-userspace-proxy connections [flags]

Lists active and recently closed connections from a running proxy's /debug/connections.

  --metrics-address IP:PORT  the proxy's metrics server (default ${DEFAULT_METRICS_ADDRESS}); also
                             --metrics-bind-address, with the proxy's value as it is (0.0.0.0:P, [::]:P)
  --service NS/NAME[:PORT]   only this service (or service port, or NS for a namespace)
  --client IP                only this client
  --state active|closed      only active or only closed connections
  --limit N                  at most N of each (the newest)
  --json                     print the JSON as served
`;

const TRACE_HELP = `Usage: kube-userspace-proxy trace [flags]

Prints a running proxy's trace events (/debug/trace): connections opened and closed, HTTP responses,
DNS answers, Redis commands.

  --metrics-address IP:PORT  the proxy's metrics server (default ${DEFAULT_METRICS_ADDRESS}); also
                             --metrics-bind-address, with the proxy's value as it is (0.0.0.0:P, [::]:P)
  --follow, -f               keep printing new events until interrupted
  --service NS/NAME[:PORT]   only this service (or service port, or NS for a namespace)
  --client IP                only this client
  --id N                     only this connection
  --limit N                  at most N buffered events first
  --requests                 also print requests and DNS queries as they arrive
  --json                     print the NDJSON as served
`;

const common = {
  'metrics-address': { type: 'string' },
  // The proxy's own flag, so its value can be pasted from the command line or the ConfigMap.
  'metrics-bind-address': { type: 'string' },
  service: { type: 'string' },
  client: { type: 'string' },
  limit: { type: 'string' },
  json: { type: 'boolean', default: false },
  help: { type: 'boolean', short: 'h', default: false },
} as const;

/** The flags of `connections` (node:util parseArgs options; also what shell completion offers). */
export const CONNECTIONS_FLAGS = { ...common, state: { type: 'string' } } as const;

/** The flags of `trace`. */
export const TRACE_FLAGS = {
  ...common,
  follow: { type: 'boolean', short: 'f', default: false },
  id: { type: 'string' },
  requests: { type: 'boolean', default: false },
} as const;

/**
 * The metrics server's URL from --metrics-address or --metrics-bind-address (one of them), in every
 * form the proxy's --metrics-bind-address takes: `IP:port`, `[IPv6]:port`, `:port`, a bare IP (port
 * 10249). A bind-all address means this host's loopback. Throws KUP_ERR_INVALID_FLAG.
 */
export function metricsUrl(values: { 'metrics-address'?: string; 'metrics-bind-address'?: string }): string {
  const address = values['metrics-address'];
  const bind = values['metrics-bind-address'];
  if (address !== undefined && bind !== undefined && address !== bind)
    throw new ProxyError(
      'KUP_ERR_INVALID_FLAG',
      'give --metrics-address or --metrics-bind-address, not both',
    );
  const name = bind !== undefined ? '--metrics-bind-address' : '--metrics-address';
  const value = bind ?? address ?? DEFAULT_METRICS_ADDRESS;
  if (value.trim() === '')
    throw new ProxyError(
      'KUP_ERR_INVALID_FLAG',
      `${name} is empty: that disables the proxy's metrics server, and these commands read it`,
    );
  const hp = parseHostPort(checkHostPort(value, { code: 'KUP_ERR_INVALID_FLAG', name }, METRICS_PORT))!;
  const host = hp.host === '0.0.0.0' ? '127.0.0.1' : hp.host === '::' ? '::1' : hp.host;
  return `http://${host.includes(':') ? `[${host}]` : host}:${hp.port}`;
}

function query(params: Record<string, string | undefined>): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== '') q.set(k, v);
  const s = q.toString();
  return s === '' ? '' : `?${s}`;
}

function checkCount(flag: string, v: string | undefined): void {
  if (v !== undefined && !/^\d{1,9}$/.test(v))
    throw new ProxyError('KUP_ERR_INVALID_FLAG', `invalid --${flag} "${v}": expected a non-negative integer`);
}

function fail(err: unknown, command: string, errOut: Out, url: string): number {
  const e = err as NodeJS.ErrnoException & { cause?: NodeJS.ErrnoException };
  // node:util parseArgs throws ERR_PARSE_ARGS_* for unknown flags and missing values.
  if (isProxyError(err, 'KUP_ERR_INVALID_FLAG') || String(e.code).startsWith('ERR_PARSE_ARGS')) {
    errOut.write(
      `kube-userspace-proxy ${command}: ${printable(e.message)}\nRun with --help for the flags.\n`,
    );
    return 2;
  }
  const why = e.cause?.code ?? e.code ?? e.message;
  errOut.write(`kube-userspace-proxy ${command}: cannot read ${printable(url)}: ${printable(String(why))}\n`);
  return 1;
}

/**
 * `kube-userspace-proxy connections [--metrics-address A] [--service S] [--client IP] [--state S]
 * [--limit N] [--json]`: prints the connection table. Returns the exit code (0 ok, 1 unreachable or
 * refused, 2 bad flags).
 */
export async function runConnections(
  argv: string[],
  out: Out,
  errOut: Out = process.stderr,
): Promise<number> {
  let url = '';
  const agent = new Agent();
  try {
    const { values } = parseArgs({ args: argv, options: CONNECTIONS_FLAGS });
    if (values.help) {
      out.write(CONNECTIONS_HELP);
      return 0;
    }
    checkCount('limit', values.limit);
    url = `${metricsUrl(values)}/debug/connections${query({
      service: values.service,
      client: values.client,
      state: values.state,
      limit: values.limit,
    })}`;
    const res = await request(url, { dispatcher: agent });
    const text = await res.body.text();
    if (res.statusCode !== 200) {
      errOut.write(
        `kube-userspace-proxy connections: ${printable(url)}: HTTP ${res.statusCode}: ${printable(text.trim())}\n`,
      );
      return 1;
    }
    if (values.json) {
      const json = jsonSafe(text);
      out.write(json.endsWith('\n') ? json : `${json}\n`);
      return 0;
    }
    out.write(formatConnections(JSON.parse(text) as ConnectionListing));
    return 0;
  } catch (err) {
    return fail(err, 'connections', errOut, url);
  } finally {
    await agent.close();
  }
}

/**
 * `kube-userspace-proxy trace [--follow] [--service S] [--client IP] [--id N] [--limit N] [--requests]
 * [--json]`: prints trace events, one a line; with --follow until `signal` aborts (exit code 0).
 */
export async function runTrace(
  argv: string[],
  out: Out,
  signal?: AbortSignal,
  errOut: Out = process.stderr,
): Promise<number> {
  let url = '';
  const agent = new Agent();
  try {
    const { values } = parseArgs({ args: argv, options: TRACE_FLAGS });
    if (values.help) {
      out.write(TRACE_HELP);
      return 0;
    }
    checkCount('limit', values.limit);
    checkCount('id', values.id);
    url = `${metricsUrl(values)}/debug/trace${query({
      service: values.service,
      client: values.client,
      id: values.id,
      limit: values.limit,
      follow: values.follow ? 'true' : 'false',
    })}`;
    if (signal?.aborted) return 0;
    // A followed stream may be quiet for a long time: no body timeout.
    const res = await request(url, { dispatcher: agent, signal, bodyTimeout: 0 });
    if (res.statusCode !== 200) {
      const text = await res.body.text();
      errOut.write(
        `kube-userspace-proxy trace: ${printable(url)}: HTTP ${res.statusCode}: ${printable(text.trim())}\n`,
      );
      return 1;
    }
    let rest = '';
    res.body.setEncoding('utf8');
    for await (const chunk of res.body as AsyncIterable<string>) {
      const lines = (rest + chunk).split('\n');
      rest = lines.pop() ?? '';
      for (const l of lines) if (l !== '') printEvent(l, values.json, values.requests, out);
    }
    if (rest !== '') printEvent(rest, values.json, values.requests, out);
    return 0;
  } catch (err) {
    if (signal?.aborted) return 0;
    return fail(err, 'trace', errOut, url);
  } finally {
    await agent.destroy();
  }
}

function printEvent(text: string, json: boolean, requests: boolean, out: Out): void {
  if (json) {
    out.write(`${jsonSafe(text)}\n`);
    return;
  }
  let event: TraceEvent | { type: 'dropped'; count: number };
  try {
    event = JSON.parse(text) as TraceEvent;
  } catch {
    return;
  }
  const s = formatEvent(event, requests);
  if (s !== undefined) out.write(`${printable(s)}\n`);
}

/**
 * One readable line per event, e.g.
 * `prod/shop:web 10.244.0.10:51234 → 10.244.0.21:8080 GET /cart host=shop.example 200 12ms`.
 * Requests and DNS queries are left out unless `requests` (their response line repeats them).
 */
function formatEvent(
  event: TraceEvent | { type: 'dropped'; count: number },
  requests = false,
): string | undefined {
  if (event.type === 'dropped')
    return `(${event.count} events dropped: the reader was too slow, or more than the trace stream carries)`;
  const who = `${event.service} ${event.client} → ${event.endpoint ?? '-'}`;
  switch (event.type) {
    case 'opened':
      return `${who} opened ${event.protocol}`;
    case 'closed': {
      const app = event.app === null ? '' : ` ${appSummary(event.app, false)}`;
      const attempts = event.attempts.map((a) => ` failed=${a.endpoint}:${a.error}`).join('');
      return (
        `${who} closed ${event.closeReason ?? '-'} in=${bytes(event.bytesFromClient)} ` +
        `out=${bytes(event.bytesToClient)} ${duration(event.durationMs)}${attempts}${app}`.trimEnd()
      );
    }
    case 'http-request':
      return requests ? `${who} ${event.method} ${event.path} host=${event.host ?? '-'}` : undefined;
    case 'http-response':
      return `${who} ${event.method} ${event.path} host=${event.host ?? '-'} ${event.status} ${event.ttfbMs}ms`;
    case 'dns-query':
      return requests ? `${who} dns ${event.qtype ?? '?'} ${event.qname ?? '?'}` : undefined;
    case 'dns-response': {
      const latency = event.latencyMs === undefined ? '' : ` ${event.latencyMs}ms`;
      return `${who} dns ${event.qtype ?? '?'} ${event.qname ?? '?'} ${event.rcode} answers=${event.answers}${latency}`;
    }
    case 'redis-command':
      return `${who} redis ${event.command}`;
    default:
      return undefined;
  }
}

/** A short description of what the sniffer learnt; `requests` adds the first HTTP/DNS exchange. */
function appSummary(app: AppInfo, requests = true): string {
  switch (app.protocol) {
    case 'http1': {
      const upgrade = app.upgrade === undefined ? '' : ` upgrade=${app.upgrade}`;
      const x = app.exchanges[0];
      if (!requests || x === undefined) return `http1 requests=${app.requests}${upgrade}`;
      const status = x.status === undefined ? '' : ` ${x.status}`;
      const more = app.requests > 1 ? ` (+${app.requests - 1})` : '';
      return `http1 ${x.method} ${x.path} host=${x.host ?? '-'}${status}${more}${upgrade}`;
    }
    case 'tls':
      return `tls sni=${app.sni ?? '-'} alpn=${app.alpn.join(',') || '-'}${app.selectedVersion ? ` ${app.selectedVersion}` : ''}`;
    case 'dns': {
      const x = app.exchanges[0];
      const first =
        requests && x !== undefined ? ` ${x.qtype ?? '?'} ${x.qname ?? '?'} ${x.rcode ?? ''}` : '';
      return `dns${first.trimEnd()} queries=${app.queries}`;
    }
    case 'redis':
      return `redis ${app.commands.join(',')}${app.commandCount > app.commands.length ? ',…' : ''}`;
    case 'postgres':
      return `postgres user=${app.user ?? '-'} db=${app.database ?? '-'}${app.sslRequested ? ' ssl' : ''}`;
    case 'mysql':
      return `mysql ${app.serverVersion ?? ''} user=${app.user ?? '-'} db=${app.database ?? '-'}`;
    case 'h2c':
      return 'h2c';
    default:
      return app.reason === 'unrecognized' ? 'unknown' : `unknown (${app.reason})`;
  }
}

/** The `connections` table: active then recent, newest first. */
function formatConnections(listing: ConnectionListing): string {
  const header = ['SERVICE', 'CLIENT', 'ENDPOINT', 'PROTO/APP', 'BYTES IN/OUT', 'AGE', 'STATE', 'INFO'];
  const rows = [...listing.active, ...listing.recent].map((r) => row(r).map(printable));
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const render = (cells: string[]) =>
    `${cells
      .map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i]!)))
      .join('  ')
      .trimEnd()}\n`;
  let text = render(header) + rows.map(render).join('');
  const shown = listing.active.length + listing.recent.length;
  const total = listing.totals.active + listing.totals.recent;
  if (shown < total) text += `(${shown} of ${total} shown)\n`;
  if (listing.dropped > 0) text += `(${listing.dropped} closed connections no longer kept)\n`;
  return text;
}

function row(r: ConnectionRecord): string[] {
  const app = r.app === null ? '' : `/${r.app.protocol}`;
  const info = [
    r.app === null || r.app.protocol === 'unknown' ? '' : appSummary(r.app).replace(/^\S+ ?/, ''),
    ...r.attempts.map((a) => `failed=${a.endpoint}:${a.error}`),
  ]
    .filter((s) => s !== '')
    .join(' ');
  return [
    r.service,
    r.client,
    r.endpoint ?? '-',
    `${r.protocol}${app}`,
    `${bytes(r.bytesFromClient)}/${bytes(r.bytesToClient)}`,
    duration(r.durationMs),
    r.state === 'active' ? 'active' : (r.closeReason ?? 'closed'),
    info,
  ];
}

function bytes(n: number): string {
  if (n < 1024) return `${n}`;
  const units = ['K', 'M', 'G', 'T'];
  let v = n / 1024;
  let u = 0;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return `${v < 10 ? v.toFixed(1) : Math.round(v)}${units[u]}`;
}

function duration(ms: number): string {
  if (ms < 1000) return `${Math.round(ms)}ms`;
  const s = ms / 1000;
  if (s < 60) return `${s < 10 ? s.toFixed(1) : Math.round(s)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${Math.round(s % 60)}s`;
  const h = Math.floor(s / 3600);
  return h < 48 ? `${h}h${Math.floor((s % 3600) / 60)}m` : `${Math.floor(h / 24)}d`;
}
