// pino, created once; components take `log.child({ component })`. JSON lines on stdout by default.
import { type Logger, pino } from 'pino';

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
  };
  if (options.destination) return pino(opts, options.destination);
  if (options.format === 'text') return pino(opts, textDestination(process.stdout));
  return pino(opts);
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
