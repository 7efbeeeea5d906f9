// pino, created once; components take `log.child({ component })`. JSON lines on stdout by default.
import { type Logger, pino } from 'pino';

export type { Logger };

export type LogOptions = {
  level?: string;
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
  return options.destination ? pino(opts, options.destination) : pino(opts);
}

/** A logger that drops everything (tests, benchmarks). */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}
