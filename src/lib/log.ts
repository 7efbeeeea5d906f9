// pino, created once; components take `log.child({ component })`. JSON lines on stdout by default.
// Every `err` is written by one serializer: code, message and the cause chain.
import { type Logger, pino } from 'pino';
import { ProxyError } from './errors.ts';

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
  };
  if (options.destination) return pino(opts, options.destination);
  if (options.format === 'text') return pino(opts, textDestination(process.stdout));
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

const LEVEL_WIDTH = 5;
const OMIT = new Set(['level', 'time', 'msg', 'pid', 'hostname']);

/** Turns pino's JSON lines into `time LEVEL msg key=value ...` (no extra dependency). */
function textDestination(out: NodeJS.WritableStream): { write(line: string): void } {
  return {
    write(line: string) {
      let rec: Record<string, unknown>;
      try {
        rec = JSON.parse(line) as Record<string, unknown>;
      } catch {
        out.write(line);
        return;
      }
      const fields = Object.entries(rec)
        .filter(([k]) => !OMIT.has(k))
        .map(
          ([k, v]) =>
            `${k}=${typeof v === 'string' ? (/\s/.test(v) ? JSON.stringify(v) : v) : JSON.stringify(v)}`,
        );
      const level = String(rec.level ?? '')
        .toUpperCase()
        .padEnd(LEVEL_WIDTH);
      out.write(
        `${String(rec.time ?? '')} ${level} ${String(rec.msg ?? '')}${fields.length ? ` ${fields.join(' ')}` : ''}\n`,
      );
    },
  };
}

/** A logger that drops everything (tests, benchmarks). */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}
