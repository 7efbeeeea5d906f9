// The only module that executes iptables, ip6tables and conntrack. Everything goes through an injected
// `Run`, so tests can fail a restore, drop a binary, or run it all inside a network namespace.
import { spawn } from 'node:child_process';
import { ProxyError } from '../lib/errors.ts';
import type { IPFamily } from '../state/service-port.ts';
import { isOurChain, JUMPS, type Jump, type Table } from './chains.ts';
import type { ConntrackDeletion } from './conntrack-cleanup.ts';

export type RunResult = { code: number; stdout: string; stderr: string };

/**
 * Runs a program to completion. Resolves with its exit status; a program that cannot be found resolves
 * with code 127 (as a shell would). Rejects only when the program cannot be started for another reason
 * or exceeds the timeout.
 */
export type Run = (cmd: string, args: string[], stdin?: string) => Promise<RunResult>;

/** A `Run` built on child_process.spawn that kills the child (SIGKILL) after `timeoutMs`. */
export function createRun(options: { timeoutMs?: number } = {}): Run {
  const timeoutMs = options.timeoutMs ?? 60_000;
  return (cmd, args, stdin) =>
    new Promise((resolve, reject) => {
      const child = spawn(cmd, args, { stdio: ['pipe', 'pipe', 'pipe'] });
      let stdout = '';
      let stderr = '';
      let settled = false;
      const finish = (fn: () => void) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        fn();
      };
      const timer = setTimeout(() => {
        child.kill('SIGKILL');
        finish(() => reject(new Error(`${cmd} timed out after ${timeoutMs} ms`)));
      }, timeoutMs);
      child.stdout.setEncoding('utf8').on('data', (d: string) => {
        stdout += d;
      });
      child.stderr.setEncoding('utf8').on('data', (d: string) => {
        stderr += d;
      });
      // EPIPE when the program exits without reading all of stdin: its exit code tells the story.
      child.stdin.on('error', () => {});
      child.on('error', (err: NodeJS.ErrnoException) => {
        if (err.code === 'ENOENT') finish(() => resolve({ code: 127, stdout, stderr: `${cmd}: not found` }));
        else finish(() => reject(err));
      });
      child.on('close', (code, signal) =>
        finish(() => resolve({ code: code ?? (signal ? 128 : 1), stdout, stderr })),
      );
      child.stdin.end(stdin ?? '');
    });
}

/** The default `Run`: 60 s per program (a full restore of 10,000 services takes well under that). */
export const run: Run = createRun();

export interface Iptables {
  /** `iptables-restore --noflush --wait` (ip6tables-restore for IPv6); throws KUP_ERR_IPTABLES_RESTORE. */
  restore(family: IPFamily, text: string): Promise<void>;
  /** `iptables-save -t <table>`; throws KUP_ERR_IPTABLES_SAVE. */
  save(family: IPFamily, table: Table): Promise<string>;
  /** The jumps of chains.ts that are not in place (`iptables -S` of the built-in chains); KUP_ERR_IPTABLES_SAVE. */
  missingJumps(family: IPFamily): Promise<Jump[]>;
  /** Removes every jump to our chains and the chains themselves; a no-op on a clean host. */
  cleanup(family: IPFamily): Promise<void>;
  /**
   * Deletes UDP conntrack entries: those of a ConntrackDeletion (original destination address and/or
   * port, in its family), or, given an address, every one whose original destination is it. Nothing
   * to delete is success; throws KUP_ERR_CONNTRACK.
   */
  flushConntrackUDP(filter: string | ConntrackDeletion): Promise<void>;
}

/** Lines shown either side of the line iptables-restore reports as failing. */
const CONTEXT_LINES = 2;
/** Keeps one hostile line from flooding the log. */
const MAX_SHOWN_LINE = 300;

export function createIptables(run: Run): Iptables {
  const bin = (family: IPFamily, tool: 'restore' | 'save') =>
    `${family === 'IPv6' ? 'ip6tables' : 'iptables'}-${tool}`;

  async function exec(cmd: string, args: string[], stdin?: string): Promise<RunResult> {
    let result: RunResult;
    try {
      result = await run(cmd, args, stdin);
    } catch (err) {
      const code = cmd.endsWith('-restore') ? 'KUP_ERR_IPTABLES_RESTORE' : 'KUP_ERR_IPTABLES_SAVE';
      throw new ProxyError(code, `${cmd} failed: ${(err as Error).message}`, { cause: err });
    }
    if (result.code === 127)
      throw new ProxyError(
        'KUP_ERR_IPTABLES_MISSING',
        `${cmd} not found: install iptables or run with --no-iptables`,
      );
    return result;
  }

  async function restore(family: IPFamily, text: string): Promise<void> {
    const cmd = bin(family, 'restore');
    const result = await exec(cmd, ['--noflush', '--wait'], text);
    if (result.code !== 0) throw restoreError(cmd, result, text);
  }

  async function save(family: IPFamily, table: Table): Promise<string> {
    const cmd = bin(family, 'save');
    const result = await exec(cmd, ['-t', table]);
    if (result.code !== 0)
      throw new ProxyError(
        'KUP_ERR_IPTABLES_SAVE',
        `${cmd} -t ${table} exited with ${result.code}: ${result.stderr.trim()}`,
      );
    return result.stdout;
  }

  // `iptables -S <built-in chain>` (~6 ms) instead of iptables-save of the tables (~250 ms each at
  // 10,000 services on nf_tables): cheap enough to run before every delta. Its lines are save lines.
  async function missingJumps(family: IPFamily): Promise<Jump[]> {
    const cmd = family === 'IPv6' ? 'ip6tables' : 'iptables';
    const listed = new Map<string, string[][]>();
    const builtins = [...new Map(JUMPS.map((j) => [`${j.table} ${j.from}`, j])).entries()];
    // One `iptables -S` per built-in chain (nat PREROUTING and OUTPUT; filter INPUT, FORWARD and
    // OUTPUT), side by side (each is a process start: ~7 ms).
    await Promise.all(
      builtins.map(async ([id, j]) => {
        const result = await exec(cmd, ['-w', '-t', j.table, '-S', j.from]);
        if (result.code !== 0)
          throw new ProxyError(
            'KUP_ERR_IPTABLES_SAVE',
            `${cmd} -t ${j.table} -S ${j.from} exited with ${result.code}: ${result.stderr.trim()}`,
          );
        listed.set(id, parseSave(result.stdout).rules.get(j.from) ?? []);
      }),
    );
    // A jump cannot outlive its target chain, so a missing chain shows up as a missing jump.
    return JUMPS.filter(
      (j) => !(listed.get(`${j.table} ${j.from}`) ?? []).some((a) => jumpTarget(a) === j.to),
    );
  }

  async function cleanup(family: IPFamily): Promise<void> {
    let text = '';
    for (const table of ['nat', 'filter'] as const) {
      const saved = parseSave(await save(family, table));
      const lines: string[] = [];
      // Every jump into our chains, whatever its arguments (older versions, duplicates, hand-made).
      for (const [chain, rules] of saved.rules) {
        if (isOurChain(chain, table)) continue;
        for (const args of rules) {
          const target = jumpTarget(args);
          if (target !== undefined && isOurChain(target, table))
            lines.push(`-D ${chain} ${args.map(quote).join(' ')}`);
        }
      }
      // `:CHAIN` flushes it (so no rule of ours still references another of our chains), then -X.
      // Every chain of ours in the table, also shard chains an older or newer version left.
      const ours = [...saved.chains].filter((chain) => isOurChain(chain, table));
      for (const chain of ours) lines.push(`:${chain} - [0:0]`);
      for (const chain of ours) lines.push(`-X ${chain}`);
      if (lines.length > 0) text += `*${table}\n${lines.join('\n')}\nCOMMIT\n`;
    }
    if (text !== '') await restore(family, text);
  }

  async function flushConntrackUDP(filter: string | ConntrackDeletion): Promise<void> {
    const f: ConntrackDeletion =
      typeof filter === 'string'
        ? { family: filter.includes(':') ? 'IPv6' : 'IPv4', protocol: 'udp', origDst: filter }
        : filter;
    const args = ['-D'];
    if (f.origDst !== undefined) args.push('--orig-dst', f.origDst);
    // Port options after -p: conntrack parses them with the protocol's own options.
    args.push('-p', 'udp');
    if (f.origDstPort !== undefined) args.push('--orig-port-dst', String(f.origDstPort));
    if (f.family === 'IPv6') args.push('-f', 'ipv6');
    let result: RunResult;
    try {
      result = await run('conntrack', args);
    } catch (err) {
      throw new ProxyError('KUP_ERR_CONNTRACK', `conntrack failed: ${(err as Error).message}`, {
        cause: err,
      });
    }
    if (result.code === 127)
      throw new ProxyError('KUP_ERR_CONNTRACK', 'conntrack not found: install conntrack (conntrack-tools)');
    // conntrack exits 1 when nothing matched; that is success for us.
    if (result.code !== 0 && !/0 flow entries have been deleted/.test(result.stdout + result.stderr))
      throw new ProxyError(
        'KUP_ERR_CONNTRACK',
        `conntrack ${args.join(' ')} exited with ${result.code}: ${result.stderr.trim()}`,
      );
  }

  return { restore, save, missingJumps, cleanup, flushConntrackUDP };
}

/** An iptables-save table: declared chains and each chain's rules as argument lists (after `-A chain`). */
export type SavedTable = { chains: Set<string>; rules: Map<string, string[][]> };

/** Parses one table of `iptables-save` output. Pure. */
export function parseSave(text: string): SavedTable {
  const chains = new Set<string>();
  const rules = new Map<string, string[][]>();
  for (const line of text.split('\n')) {
    if (line.startsWith(':')) {
      const name = line.slice(1).split(' ')[0];
      if (name) chains.add(name);
    } else if (line.startsWith('-A ')) {
      const [, chain, ...args] = splitLine(line);
      if (chain === undefined) continue;
      const list = rules.get(chain);
      if (list) list.push(args);
      else rules.set(chain, [args]);
    }
  }
  return { chains, rules };
}

/**
 * Splits a restore/save line into arguments the way iptables-restore does: whitespace separates,
 * double quotes group, a backslash inside quotes escapes the next character.
 */
export function splitLine(line: string): string[] {
  const out: string[] = [];
  let cur = '';
  let has = false;
  let quoted = false;
  for (let i = 0; i < line.length; i++) {
    const c = line[i]!;
    if (quoted) {
      if (c === '\\' && i + 1 < line.length) cur += line[++i];
      else if (c === '"') quoted = false;
      else cur += c;
    } else if (c === '"') {
      quoted = true;
      has = true;
    } else if (c === ' ' || c === '\t') {
      if (has || cur !== '') out.push(cur);
      cur = '';
      has = false;
    } else cur += c;
  }
  if (has || cur !== '') out.push(cur);
  return out;
}

function jumpTarget(args: readonly string[]): string | undefined {
  for (let i = args.length - 2; i >= 0; i--) if (args[i] === '-j' || args[i] === '-g') return args[i + 1];
  return undefined;
}

function quote(arg: string): string {
  return /^[A-Za-z0-9._:/!,=+@%[\]-]+$/.test(arg) ? arg : `"${arg.replace(/["\\]/g, '\\$&')}"`;
}

/** Builds the error for a failed restore: the line iptables names and the lines around it. */
function restoreError(cmd: string, result: RunResult, text: string): ProxyError {
  const stderr = result.stderr.trim();
  // legacy and most errors: "line N failed"; nf_tables commit errors: "Error occurred at line: N".
  const m = /line (\d+) failed/.exec(stderr) ?? /line:? (\d+)/.exec(stderr);
  let message = `${cmd} exited with ${result.code}: ${stderr || '(no output)'}`;
  if (m) {
    const n = Number(m[1]);
    const lines = text.split('\n');
    const shown: string[] = [];
    for (let i = Math.max(1, n - CONTEXT_LINES); i <= Math.min(lines.length, n + CONTEXT_LINES); i++) {
      const line = lines[i - 1] ?? '';
      const cut = line.length > MAX_SHOWN_LINE ? `${line.slice(0, MAX_SHOWN_LINE)}...` : line;
      shown.push(`${i === n ? '>' : ' '} ${i}: ${cut}`);
    }
    message += `\nfailing line ${n} of the input:\n${shown.join('\n')}`;
  }
  return new ProxyError('KUP_ERR_IPTABLES_RESTORE', message);
}
