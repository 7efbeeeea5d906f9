// pino, created once; components take `log.child({ component })`. JSON lines on stdout by default.
// Every `err` is written by one serializer: code, message and the cause chain. Every line is bounded
// (an oversized string or list is cut, with a note of its size) and safe on a terminal (JSON escapes for
// the control characters JSON leaves raw; the text format escapes what it prints unquoted).
import { type Logger, pino } from 'pino';
import { ProxyError } from './errors.ts';
import { jsonSafe, needsEscaping, printable } from './printable.ts';

export type { Logger };

export type LogOptions = {
  level?: string;
  /** json (default): one JSON object a line; text: readable lines for a terminal. */
  format?: 'json' | 'text';
  /** Write to this destination instead of stdout (tests). */
  destination?: NodeJS.WritableStream;
};

export function createLogger(options: LogOptions = {}): Logger {
  const opts = {
    level: options.level ?? 'info',
    base: { pid: process.pid },
    timestamp: pino.stdTimeFunctions.isoTime,
    formatters: { level: (label: string) => ({ level: label }) },
    serializers: { err: serializeError },
    hooks: { streamWrite: (line: string) => jsonSafe(capLine(line)) },
  };
  if (options.format === 'text') return pino(opts, textDestination(options.destination ?? process.stdout));
  if (options.destination) return pino(opts, options.destination);
  return pino(opts);
}

/** An error as the logs show it. */
export type SerializedError = {
  type: string;
  code?: string;
  message: string;
  /** Where a socket error happened (Node's system errors). */
  syscall?: string;
  address?: string;
  port?: number;
  /** An HTTP failure's status (the API server's errors). */
  statusCode?: number;
  /** Only for errors without a code or status: an unexpected failure, whose origin is wanted. */
  stack?: string;
  cause?: SerializedError;
};

/** Causes followed at most (a cycle or a pathological chain ends there). */
const MAX_CAUSES = 5;

/**
 * The `err` serializer: a ProxyError and a Node error alike give `type`, `code`, `message`, the socket
 * fields or HTTP status when present, and their `cause` chain; the stack only when there is none of
 * code and status. Anything thrown
 * that is not an Error gives its string as the message.
 */
export function serializeError(err: unknown, depth = 0): SerializedError {
  if (!(err instanceof Error)) {
    // Something thrown that is not an Error: its own fields when it has them, else its text.
    if (typeof err === 'object' && err !== null)
      return {
        type: 'object',
        message: String((err as { message?: unknown }).message ?? JSON.stringify(err)),
      };
    return { type: typeof err, message: String(err) };
  }
  const e = err as NodeJS.ErrnoException & { address?: string; port?: number; statusCode?: number };
  const out: SerializedError = { type: e instanceof ProxyError ? 'ProxyError' : e.name, message: e.message };
  if (typeof e.code === 'string') out.code = e.code;
  if (typeof e.syscall === 'string') out.syscall = e.syscall;
  if (typeof e.address === 'string') out.address = e.address;
  if (typeof e.port === 'number') out.port = e.port;
  if (typeof e.statusCode === 'number') out.statusCode = e.statusCode;
  if (out.code === undefined && out.statusCode === undefined && e.stack !== undefined) out.stack = e.stack;
  if (e.cause !== undefined && depth < MAX_CAUSES) out.cause = serializeError(e.cause, depth + 1);
  return out;
}

/** Lines longer than this (chars) are cut: the access log's largest (16 sniffed requests) is about 25 KB. */
export const MAX_LINE = 64 * 1024;
/** In a line that is cut, strings longer than this keep this much. */
const MAX_STRING = 4096;
/** ... and lists this many items; nesting this deep. */
const MAX_ITEMS = 100;
const MAX_DEPTH = 8;
/** What a line that is still too long after cutting keeps. */
const CORE_FIELDS = ['level', 'time', 'pid', 'component', 'msg'];

/** A size as a note says it: `812 B`, `353 KB`, `1.2 MB`. */
export function sizeNote(bytes: number): string {
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${Math.round(bytes / 1024)} KB`;
  return `${(bytes / (1024 * 1024)).toFixed(1)} MB`;
}

function cutValue(v: unknown, depth: number): unknown {
  if (typeof v === 'string') {
    if (v.length <= MAX_STRING) return v;
    return `${v.slice(0, MAX_STRING)}…(cut, ${sizeNote(Buffer.byteLength(v))})`;
  }
  if (typeof v !== 'object' || v === null) return v;
  if (depth >= MAX_DEPTH) return `…(cut, ${sizeNote(Buffer.byteLength(JSON.stringify(v)))} nested)`;
  if (Array.isArray(v)) {
    const kept = v.slice(0, MAX_ITEMS).map((x) => cutValue(x, depth + 1));
    if (v.length > MAX_ITEMS) kept.push(`…(cut, ${v.length - MAX_ITEMS} more)`);
    return kept;
  }
  const out: Record<string, unknown> = {};
  for (const [k, x] of Object.entries(v)) out[k] = cutValue(x, depth + 1);
  return out;
}

/**
 * A log line (JSON and its newline) of at most MAX_LINE chars: a longer one has its long strings and
 * lists cut, each with a note of its size (`…(cut, 353 KB)`); if that is not enough, only the level,
 * time, message and component are kept, with `cut` giving the line's size. Shorter lines are returned as
 * they are (one length check).
 */
export function capLine(line: string): string {
  if (line.length <= MAX_LINE) return line;
  const size = sizeNote(Buffer.byteLength(line));
  let rec: unknown;
  try {
    rec = JSON.parse(line);
  } catch {
    return `${line.slice(0, MAX_LINE)}…(cut, ${size})\n`;
  }
  const cut = JSON.stringify(cutValue(rec, 0));
  if (cut.length <= MAX_LINE) return `${cut}\n`;
  const core: Record<string, unknown> = {};
  for (const k of CORE_FIELDS) {
    const v = (rec as Record<string, unknown>)[k];
    if (v !== undefined) core[k] = cutValue(v, MAX_DEPTH - 1);
  }
  core.cut = `the line was ${size}; only its level, time, component and message are kept`;
  return `${JSON.stringify(core)}\n`;
}

const LEVEL_WIDTH = 5;
const OMIT = new Set(['level', 'time', 'msg', 'pid', 'hostname']);

/** A value as the text format prints it: bare when it is plain text, else as JSON (terminal-safe). */
function textValue(v: unknown): string {
  if (typeof v === 'string' && !/\s/.test(v) && !needsEscaping(v)) return v;
  return jsonSafe(JSON.stringify(v) ?? String(v));
}

/** Turns pino's JSON lines into `time LEVEL msg key=value ...` (no extra dependency). */
function textDestination(out: NodeJS.WritableStream): { write(line: string): void } {
  return {
    write(line: string) {
      let rec: Record<string, unknown>;
      try {
        rec = JSON.parse(line) as Record<string, unknown>;
      } catch {
        out.write(`${printable(line.replace(/\n$/, ''))}\n`);
        return;
      }
      const fields = Object.entries(rec)
        .filter(([k]) => !OMIT.has(k))
        .map(([k, v]) => `${printable(k)}=${textValue(v)}`);
      const level = String(rec.level ?? '')
        .toUpperCase()
        .padEnd(LEVEL_WIDTH);
      const head = [rec.time, level, rec.msg].map((v) => printable(String(v ?? ''))).join(' ');
      out.write(`${head}${fields.length ? ` ${fields.join(' ')}` : ''}\n`);
    },
  };
}

/** A logger that drops everything (tests, benchmarks). */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}
