// --proxy-port-range (kube-proxy's PortRange forms): parsed and printed. Pure.
import { ProxyError } from './errors.ts';

export type PortRange = {
  /** First port; 0 means "let the kernel choose" (the range is empty). */
  readonly base: number;
  readonly size: number;
};

/**
 * Parses `""` (kernel-chosen), `"N"`, `"A-B"` (inclusive) or `"A+N"` (A..A+N).
 * Unlike the legacy proxier, a range that starts at 0 (other than "0"/"0-0") is an error, not random.
 */
export function parsePortRange(text: string): PortRange {
  const parsed = readPortRange(text);
  if (typeof parsed === 'string')
    throw new ProxyError('KUP_ERR_PORT_RANGE_INVALID', `invalid --proxy-port-range "${text}": ${parsed}`);
  return parsed;
}

/** What is wrong with `text` as a port range, or undefined when it is one (see parsePortRange). */
export function portRangeProblem(text: string): string | undefined {
  const parsed = readPortRange(text);
  return typeof parsed === 'string' ? parsed : undefined;
}

function readPortRange(text: string): PortRange | string {
  const s = text.trim();
  if (s === '' || s === '0' || s === '0-0') return { base: 0, size: 0 };
  const m = /^(\d{1,5})(?:([-+])(\d{1,5}))?$/.exec(s);
  if (!m) return 'expected N, A-B or A+N';
  const low = Number(m[1]);
  let high = low;
  if (m[2] === '-') high = Number(m[3]);
  else if (m[2] === '+') high = low + Number(m[3]);
  if (low < 1 || high > 65535) return 'ports must be within 1-65535';
  if (high < low) return 'the end is below the start';
  return { base: low, size: high - low + 1 };
}

export function formatPortRange(range: PortRange): string {
  return range.size === 0 ? '' : `${range.base}-${range.base + range.size - 1}`;
}
