// Text for the console: numbers, durations, and one line per connection or trace event, as the
// `connections` and `trace` subcommands print them. Client text (paths, server names, DNS names) has its
// control and reordering characters shown escaped, as src/lib/printable.ts does for a terminal.

// C0, DEL, C1, the bidi controls, the line and paragraph separators, and the backslash.
const UNSAFE = /[\\\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;

/** `s` with what could hide or reorder text shown escaped (`\xNN`, `\u{NNNN}`, `\\`). */
export function printable(s) {
  return String(s).replace(UNSAFE, (c) => {
    if (c === '\\') return '\\\\';
    const code = c.charCodeAt(0);
    return code <= 0xff
      ? `\\x${code.toString(16).padStart(2, '0')}`
      : `\\u{${code.toString(16).padStart(4, '0')}}`;
  });
}

export function bytes(n) {
  if (n < 1024) return `${Math.round(n)}`;
  const units = ['K', 'M', 'G', 'T'];
  let v = n / 1024;
  let u = 0;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return `${v < 10 ? v.toFixed(1) : Math.round(v)}${units[u]}`;
}

/** A rate per second, short: 0, 0.25, 3.4, 120, 12K. */
export function perSecond(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return '–';
  if (n === 0) return '0';
  if (n < 10) return n.toFixed(n < 1 ? 2 : 1);
  return n < 1000 ? `${Math.round(n)}` : bytes(n);
}

export function duration(ms) {
  if (ms < 1000) return `${Math.round(ms)}ms`;
  const s = ms / 1000;
  if (s < 60) return `${s < 10 ? s.toFixed(1) : Math.round(s)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${Math.round(s % 60)}s`;
  const h = Math.floor(s / 3600);
  return h < 48 ? `${h}h${Math.floor((s % 3600) / 60)}m` : `${Math.floor(h / 24)}d`;
}

export function clock(ms) {
  const d = new Date(ms);
  const pad = (n, w = 2) => String(n).padStart(w, '0');
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

/** `reason=n reason=n`, or '' for none. */
export function reasons(counts) {
  return Object.entries(counts ?? {})
    .filter(([, n]) => n > 0)
    .map(([r, n]) => `${r}=${n}`)
    .join(' ');
}

/** What the sniffer learnt, as one line: `GET /cart host=shop.example 200`, `sni=… alpn=h2`, `A example.org NOERROR`. */
export function appLine(app) {
  if (app === null || app === undefined) return '';
  switch (app.protocol) {
    case 'http1': {
      const x = app.exchanges[0];
      const upgrade = app.upgrade === undefined ? '' : ` upgrade=${app.upgrade}`;
      if (x === undefined) return `requests=${app.requests}${upgrade}`;
      const status = x.status === undefined ? '' : ` ${x.status}`;
      const more = app.requests > 1 ? ` (+${app.requests - 1})` : '';
      return `${x.method} ${x.path} host=${x.host ?? '-'}${status}${more}${upgrade}`;
    }
    case 'tls':
      return `sni=${app.sni ?? '-'} alpn=${app.alpn.join(',') || '-'}${app.selectedVersion ? ` ${app.selectedVersion}` : ''}`;
    case 'dns': {
      const x = app.exchanges[0];
      const first = x === undefined ? '' : `${x.qtype ?? '?'} ${x.qname ?? '?'} ${x.rcode ?? ''} `;
      return `${first}queries=${app.queries}`;
    }
    case 'redis':
      return `${app.commands.join(',')}${app.commandCount > app.commands.length ? ',…' : ''}`;
    case 'postgres':
      return `user=${app.user ?? '-'} db=${app.database ?? '-'}${app.sslRequested ? ' ssl' : ''}`;
    case 'mysql':
      return `${app.serverVersion ?? ''} user=${app.user ?? '-'} db=${app.database ?? '-'}`;
    case 'h2c':
      return '';
    default:
      return app.reason === 'unrecognized' ? '' : `(${app.reason})`;
  }
}

/** A connection's protocol line: what the sniffer saw, then its failed connect attempts. */
export function connectionLine(r) {
  const parts = [appLine(r.app), ...r.attempts.map((a) => `failed=${a.endpoint}:${a.error}`)];
  return printable(parts.filter((s) => s !== '').join(' '));
}

/** A trace event as one line after `service client → endpoint`, as the trace subcommand prints it. */
export function eventLine(e) {
  switch (e.type) {
    case 'opened':
      return `opened ${e.protocol}`;
    case 'closed': {
      const attempts = e.attempts.map((a) => ` failed=${a.endpoint}:${a.error}`).join('');
      const app = e.app === null ? '' : ` ${e.app.protocol} ${appLine(e.app)}`;
      return `closed ${e.closeReason ?? '-'} in=${bytes(e.bytesFromClient)} out=${bytes(e.bytesToClient)} ${duration(e.durationMs)}${attempts}${app}`.trimEnd();
    }
    case 'http-request':
      return `${e.method} ${e.path} host=${e.host ?? '-'}`;
    case 'http-response':
      return `${e.method} ${e.path} host=${e.host ?? '-'} ${e.status} ${e.ttfbMs}ms`;
    case 'dns-query':
      return `dns ${e.qtype ?? '?'} ${e.qname ?? '?'}`;
    case 'dns-response':
      return `dns ${e.qtype ?? '?'} ${e.qname ?? '?'} ${e.rcode} answers=${e.answers}${e.latencyMs === undefined ? '' : ` ${e.latencyMs}ms`}`;
    case 'redis-command':
      return `redis ${e.command}`;
    default:
      return e.type;
  }
}
