// The kernel's ephemeral ports (net.ipv4.ip_local_port_range less net.ipv4.ip_local_reserved_ports):
// where a kernel-chosen proxy port would come from. Parsing is pure; the read is injected.
import { readFileSync } from 'node:fs';
import type { PortRange } from '../lib/port-range.ts';

export type EphemeralPorts = {
  readonly range: PortRange;
  /** Ports the kernel never chooses (ip_local_reserved_ports), as ranges. */
  readonly reserved: readonly PortRange[];
};

const PORT_RANGE_FILE = '/proc/sys/net/ipv4/ip_local_port_range';
const RESERVED_FILE = '/proc/sys/net/ipv4/ip_local_reserved_ports';

/** `ip_local_port_range` text ("32768\t60999\n") as a range; undefined when malformed. */
export function parseLocalPortRange(text: string): PortRange | undefined {
  const m = /^\s*(\d{1,5})\s+(\d{1,5})\s*$/.exec(text);
  if (!m) return undefined;
  const low = Number(m[1]);
  const high = Number(m[2]);
  if (low < 1 || high > 65535 || high < low) return undefined;
  return { base: low, size: high - low + 1 };
}

/** `ip_local_reserved_ports` text ("30000-32767,40000\n", or empty) as ranges; malformed items are skipped. */
export function parseReservedPorts(text: string): PortRange[] {
  const out: PortRange[] = [];
  for (const item of text.trim().split(',')) {
    const m = /^(\d{1,5})(?:-(\d{1,5}))?$/.exec(item.trim());
    if (!m) continue;
    const low = Number(m[1]);
    const high = m[2] === undefined ? low : Number(m[2]);
    if (low <= high && high <= 65535) out.push({ base: low, size: high - low + 1 });
  }
  return out;
}

/**
 * This network namespace's ephemeral ports; undefined where they cannot be read (no /proc: not
 * Linux). Read once at start: the sysctls of a node rarely change, and the same ones give the same ports.
 */
export function readEphemeralPorts(
  read: (path: string) => string = (path) => readFileSync(path, 'utf8'),
): EphemeralPorts | undefined {
  let range: PortRange | undefined;
  try {
    range = parseLocalPortRange(read(PORT_RANGE_FILE));
  } catch {
    return undefined;
  }
  if (range === undefined) return undefined;
  let reserved: PortRange[] = [];
  try {
    reserved = parseReservedPorts(read(RESERVED_FILE));
  } catch {
    // Older kernels have no such file: nothing is reserved.
  }
  return { range, reserved };
}
