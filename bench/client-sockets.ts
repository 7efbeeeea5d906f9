// What the client pod's kernel says about its TCP connections: how many it opened (Tcp ActiveOpens), how
// many it closed first, i.e. left in TIME_WAIT (TcpExt TW), and what `ss` still lists per destination.
// Parsing and arithmetic are pure; `readCounters` reads /proc/<pid>/net of a process inside the
// namespace (the counters are per network namespace), `snapshot` also runs `ss` there.
import { readFileSync } from 'node:fs';
import type { RunResult } from '../src/netfilter/iptables.ts';

/** The namespace's counters (cumulative since it was made). */
export type NetCounters = {
  /** Tcp ActiveOpens: connect()s that sent a SYN. */
  activeOpens: number;
  /**
   * TcpExt TW + TWKilled: TIME_WAITs entered. Since Linux 4.1 the kernel counts one when it schedules a
   * TIME_WAIT (`__inet_twsk_schedule`; a FIN-WAIT-2 that turns into TIME-WAIT is not counted twice), not
   * when it ends, so this counts every connection closed first by this side, also those whose
   * TIME_WAIT has ended or was reused since.
   */
  timeWaitsEntered: number;
  /** TcpExt TWRecycled: TIME_WAITs taken over by a new connect() to the same address:port (tcp_tw_reuse). */
  timeWaitsReused: number;
  /** TcpExt TCPTimeWaitOverflow: closes that would have left a TIME_WAIT, but the table was full. */
  timeWaitOverflows: number;
};

/** The sockets on their way out after a close by the client, per destination "ip:port", and the counters. */
export type ClientSnapshot = { closing: Map<string, number>; counters: NetCounters };

/**
 * Both /proc/net/snmp and /proc/net/netstat are pairs of lines, "Tcp: Name1 Name2 …" then "Tcp: 1 2 …";
 * returns every value as "Tcp.Name1".
 */
export function parseProcNet(text: string): Map<string, number> {
  const out = new Map<string, number>();
  const lines = text.split('\n');
  for (let i = 0; i + 1 < lines.length; i++) {
    const names = lines[i]!.trim().split(/\s+/);
    const values = lines[i + 1]!.trim().split(/\s+/);
    if (names[0] !== values[0] || !names[0]?.endsWith(':') || Number.isNaN(Number(values[1]))) continue;
    const prefix = names[0].slice(0, -1);
    for (let k = 1; k < names.length; k++) out.set(`${prefix}.${names[k]}`, Number(values[k]));
    i++;
  }
  return out;
}

/** The counters from the text of /proc/net/snmp and /proc/net/netstat (missing ones read 0). */
export function netCounters(snmp: string, netstat: string): NetCounters {
  const v = new Map([...parseProcNet(snmp), ...parseProcNet(netstat)]);
  const n = (key: string) => v.get(key) ?? 0;
  return {
    activeOpens: n('Tcp.ActiveOpens'),
    timeWaitsEntered: n('TcpExt.TW') + n('TcpExt.TWKilled'),
    timeWaitsReused: n('TcpExt.TWRecycled'),
    timeWaitOverflows: n('TcpExt.TCPTimeWaitOverflow'),
  };
}

/** `ss -Htan state …` output (with or without a State column): sockets per peer "ip:port". */
export function parseSsPeers(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    const addrs = line
      .trim()
      .split(/\s+/)
      .filter((t) => /:\d+$/.test(t));
    const peer = addrs[addrs.length - 1];
    if (addrs.length >= 2 && peer) out.set(peer, (out.get(peer) ?? 0) + 1);
  }
  return out;
}

export type TimeWaitShare = {
  /** Connections the client opened in between. */
  connections: number;
  /** Of those, how many the client closed first: TIME_WAITs entered, and closes that found the table full. */
  timeWaits: number;
  /** timeWaits / connections, in %. */
  share: number;
  /** Of the TIME_WAITs, those a new connect() took over (tcp_tw_reuse) before they ended. */
  reused: number;
  /**
   * Sockets towards `dst` on their way out (TIME-WAIT, FIN-WAIT, CLOSING), after minus before: what
   * `ss` alone sees. Short of `timeWaits` by the reused ones and, in runs near 60 s, the ended ones.
   */
  leftTowardsDst: number;
};

/**
 * The share of connections the client closed first, between two snapshots around a run against one
 * destination, from the namespace's counters: only this run may open or close connections there.
 */
export function timeWaitShare(before: ClientSnapshot, after: ClientSnapshot, dst: string): TimeWaitShare {
  const d = (k: keyof NetCounters) => after.counters[k] - before.counters[k];
  const connections = d('activeOpens');
  const timeWaits = d('timeWaitsEntered') + d('timeWaitOverflows');
  return {
    connections,
    timeWaits,
    share: connections > 0 ? (timeWaits / connections) * 100 : Number.NaN,
    reused: d('timeWaitsReused'),
    leftTowardsDst: (after.closing.get(dst) ?? 0) - (before.closing.get(dst) ?? 0),
  };
}

/** The counters of the network namespace `pid` lives in. */
export function readCounters(pid: number): NetCounters {
  return netCounters(
    readFileSync(`/proc/${pid}/net/snmp`, 'utf8'),
    readFileSync(`/proc/${pid}/net/netstat`, 'utf8'),
  );
}

/**
 * Sockets the client closed first that are not gone yet (TIME-WAIT, and the few still in FIN-WAIT or
 * CLOSING on their way to it), per destination, then the counters: `runIn` runs `ss` inside the
 * client's namespace, `pid` is a process living there.
 */
export async function snapshot(
  runIn: (cmd: string, args: string[]) => Promise<RunResult>,
  pid: number,
): Promise<ClientSnapshot> {
  const states = ['time-wait', 'fin-wait-1', 'fin-wait-2', 'closing'].flatMap((s) => ['state', s]);
  const r = await runIn('ss', ['-Htan', ...states]);
  if (r.code !== 0) throw new Error(`ss exited with ${r.code}: ${r.stderr.slice(0, 200)}`);
  return { closing: parseSsPeers(r.stdout), counters: readCounters(pid) };
}
