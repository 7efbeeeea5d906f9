// How one setting's value is read from its flag and from its config-file field, and written back. Pure:
// each codec runs the checks of validate.ts, so a bad value is one message naming its flag or field.
import {
  checkDuration,
  checkInt,
  checkNonNegative,
  formatDuration,
  invalidValue,
  parseDuration,
  type ValueSource,
} from './validate.ts';

/** A flag's value as yargs hands it over (after `type` or `choices`). */
export type FlagValue = string | number | boolean;

/** The two ways in (flag text, file field) and the way back out (file field, --help) of a value of type T. */
export type Codec<T> = {
  /** The flag's yargs type; none for a choice, which yargs checks and lists itself. */
  readonly type?: 'string' | 'number' | 'boolean';
  readonly choices?: readonly string[];
  /** The flag's spelling of a zero value (`""`, `0`), for the written file's notes. */
  readonly zeroFlag: string;
  /** A flag's value → T; throws invalidValue naming `at`. */
  parse(value: FlagValue, at: ValueSource): T;
  /** True when a file field holds a zero value (`""`, `0`, `0s`) of the right type. */
  isZero(value: unknown): boolean;
  /** A file field's value (any YAML) → T; throws invalidValue naming `at`. */
  read(value: unknown, at: ValueSource): T;
  /** T → the file field's value (read reads it back to T). */
  write(value: T): unknown;
  /** T → --help's default. */
  show(value: T): string;
};

export const INT32_MAX = 2 ** 31 - 1;

// The file's value types, checked before the value itself.
function str(v: unknown, at: ValueSource): string {
  if (typeof v !== 'string') invalidValue(at, v, 'expected a string');
  return v;
}
function num(v: unknown, at: ValueSource): number {
  if (typeof v !== 'number') invalidValue(at, v, 'expected a number');
  return v;
}
function bool(v: unknown, at: ValueSource): boolean {
  if (typeof v !== 'boolean') invalidValue(at, v, 'expected true or false');
  return v;
}
function strings(v: unknown, at: ValueSource): string[] {
  if (!Array.isArray(v) || v.some((s) => typeof s !== 'string'))
    invalidValue(at, v, 'expected a list of strings');
  return v;
}

const quoted = (s: string): string => (s === '' ? '""' : s);

/**
 * A value written as a string in the file and given as text on the command line, checked by `check`
 * (which may normalise it). A field of blanks is a zero value when `check` trims.
 */
export function text<T extends string | string[] = string>(
  check: (value: string, at: ValueSource) => T,
  options: { trims?: boolean; write?: (value: T) => string; choices?: readonly string[] } = {},
): Codec<T> {
  const write = options.write ?? ((v: T) => v as string);
  return {
    ...(options.choices === undefined ? { type: 'string' as const } : { choices: options.choices }),
    zeroFlag: '""',
    parse: (v, at) => check(v as string, at),
    isZero: (v) => typeof v === 'string' && (options.trims ? v.trim() : v) === '',
    read: (v, at) => check(str(v, at), at),
    write,
    show: (v) => quoted(write(v)),
  };
}

/** Free text (a path, a name): trimmed and lower-cased on request, never rejected. */
export function plain(options: { trim?: boolean; lower?: boolean } = {}): Codec<string> {
  return text(
    (v) => {
      const t = options.trim ? v.trim() : v;
      return options.lower ? t.toLowerCase() : t;
    },
    { trims: options.trim },
  );
}

/** One of `values`; yargs checks the flag, the file field gets our message. */
export function choice<T extends string>(values: readonly T[]): Codec<T> {
  return text(
    (v, at) => {
      if (!(values as readonly string[]).includes(v))
        invalidValue(at, v, `expected ${values.map((c) => JSON.stringify(c)).join(' or ')}`);
      return v as T;
    },
    { choices: values },
  );
}

/** A Go duration (`250ms`, `30s`, `15m`), as milliseconds; `positive` rejects 0. */
export function duration(options: { positive?: boolean } = {}): Codec<number> {
  return {
    type: 'string',
    zeroFlag: '0',
    parse: (v, at) => checkDuration(v as string, at, options),
    isZero: (v) => typeof v === 'string' && parseDuration(v) === 0,
    read: (v, at) => checkDuration(str(v, at), at, options),
    write: formatDuration,
    show: formatDuration,
  };
}

/** An integer in [min, max]; in the file at most an int32, as kube-proxy's fields are. */
export function int(min: number, max: number): Codec<number> {
  return {
    type: 'number',
    zeroFlag: '0',
    parse: (v, at) => checkInt(v as number, at, min, max),
    isZero: (v) => v === 0,
    read: (v, at) => checkInt(num(v, at), at, min, Math.min(max, INT32_MAX)),
    write: (v) => v,
    show: String,
  };
}

/** A finite number >= 0 (clientConnection.qps is a float32). */
export function nonNegative(): Codec<number> {
  return {
    type: 'number',
    zeroFlag: '0',
    parse: (v, at) => checkNonNegative(v as number, at),
    isZero: (v) => v === 0,
    read: (v, at) => checkNonNegative(num(v, at), at),
    write: (v) => v,
    show: String,
  };
}

/** true or false; `negated` for a `--no-x` flag that turns the setting off. */
export function boolean(options: { negated?: boolean } = {}): Codec<boolean> {
  const flip = (v: boolean): boolean => (options.negated ? !v : v);
  return {
    type: 'boolean',
    zeroFlag: 'false',
    parse: (v) => flip(v as boolean),
    // false is written as a value: it is the default of every boolean field.
    isZero: () => false,
    read: (v, at) => bool(v, at),
    write: (v) => v,
    show: (v) => String(flip(v)),
  };
}

/** A list: comma-separated on the command line, a YAML list in the file. */
export function list(check: (values: readonly string[], at: ValueSource) => string[]): Codec<string[]> {
  return {
    type: 'string',
    zeroFlag: '""',
    parse: (v, at) => check((v as string).split(','), at),
    isZero: (v) => Array.isArray(v) && v.length === 0,
    read: (v, at) => check(strings(v, at), at),
    write: (v) => v,
    show: (v) => quoted(v.join(',')),
  };
}
