// A `Run` that starts programs from a small shell kept for the purpose instead of from this process.
// Every process Node starts is a fork of Node, and fork copies the page tables: at 10,000 service ports
// (~250 MB RSS) each start blocks the event loop 5-10 ms, on every sync that touches iptables. The shell
// forks in well under a millisecond. Commands run one at a time; their output comes back between
// sentinel lines. Anything this cannot do (no shell, a stdin that holds the here-doc delimiter) goes to
// the fallback, which spawns directly.
import { type ChildProcessWithoutNullStreams, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import type { Run, RunResult } from './iptables.ts';

export type ShellRunOptions = {
  /** Per command, as createRun's; the shell is killed (and restarted for the next one) past it. */
  timeoutMs?: number;
  /** Default /bin/sh. */
  shell?: string;
  /** Used when the shell cannot be used. */
  fallback: Run;
};

export type ShellRun = Run & {
  /** Starts the shell now (while this process is small: its own start is a fork too). */
  start(): void;
  /** Stops the shell; later commands start a new one. */
  close(): void;
};

type Job = {
  cmd: string;
  args: string[];
  stdin: string | undefined;
  resolve: (r: RunResult) => void;
  reject: (err: Error) => void;
};

/** Quotes one word for sh: inside single quotes everything is literal except the quote itself. */
export function shellQuote(word: string): string {
  return `'${word.replace(/'/g, `'\\''`)}'`;
}

export function createShellRun(options: ShellRunOptions): ShellRun {
  const timeoutMs = options.timeoutMs ?? 60_000;
  const shellPath = options.shell ?? '/bin/sh';
  const nonce = randomBytes(8).toString('hex');
  const queue: Job[] = [];
  let shell: ChildProcessWithoutNullStreams | undefined;
  let unusable = false;
  let busy = false;
  let seq = 0;
  // The running command's output so far and how it ends.
  let out = '';
  let err = '';
  let current: { job: Job; outEnd: string; errEnd: string; timer: NodeJS.Timeout } | undefined;

  function startShell(): ChildProcessWithoutNullStreams | undefined {
    if (shell !== undefined || unusable) return shell;
    let child: ChildProcessWithoutNullStreams;
    try {
      // Its own process group, so a command past its timeout dies with the shell.
      child = spawn(shellPath, [], { stdio: ['pipe', 'pipe', 'pipe'], detached: true });
    } catch {
      unusable = true;
      return undefined;
    }
    child.unref();
    child.stdout.setEncoding('utf8').on('data', (d: string) => {
      out += d;
      check(d.length);
    });
    child.stderr.setEncoding('utf8').on('data', (d: string) => {
      err += d;
      check(0);
    });
    child.stdin.on('error', () => {});
    child.on('error', (e: NodeJS.ErrnoException) => {
      if (e.code === 'ENOENT' || e.code === 'EACCES') unusable = true;
      died(child, e);
    });
    child.on('exit', () => died(child, new Error(`${shellPath} exited`)));
    // The pipes unref'd too: an idle shell must not keep a stopping proxy alive (a running command's
    // timer does, until it ends).
    for (const stream of [child.stdin, child.stdout, child.stderr])
      (stream as unknown as { unref?: () => void }).unref?.();
    shell = child;
    return child;
  }

  /** The shell is gone: the running command fails (or falls back), later ones start a new shell. */
  function died(child: ChildProcessWithoutNullStreams, e: Error): void {
    if (shell !== child) return;
    shell = undefined;
    const c = current;
    current = undefined;
    if (c !== undefined) {
      clearTimeout(c.timer);
      // It never started: let the fallback run it.
      if (unusable) runFallback(c.job);
      else c.job.reject(e);
    }
    busy = false;
    next();
  }

  let outFound = -1;
  /** Looks for the sentinels (stdout: only in what may hold it after `added` new characters). */
  function check(added: number): void {
    const c = current;
    if (c === undefined) return;
    if (outFound < 0 && added > 0)
      outFound = out.indexOf(c.outEnd, Math.max(0, out.length - added - c.outEnd.length));
    if (outFound < 0) return;
    const codeEnd = out.indexOf('\n', outFound + c.outEnd.length);
    const e = err.indexOf(c.errEnd);
    if (codeEnd < 0 || e < 0) return;
    clearTimeout(c.timer);
    current = undefined;
    const result: RunResult = {
      code: Number(out.slice(outFound + c.outEnd.length, codeEnd)),
      stdout: out.slice(0, outFound),
      stderr: err.slice(0, e),
    };
    out = out.slice(codeEnd + 1);
    err = err.slice(e + c.errEnd.length);
    outFound = -1;
    // sh says 127 for a program it cannot find, as createRun does.
    if (result.code === 127 && result.stderr === '') result.stderr = `${c.job.cmd}: not found`;
    busy = false;
    c.job.resolve(result);
    next();
  }

  function runFallback(job: Job): void {
    options.fallback(job.cmd, job.args, job.stdin).then(job.resolve, job.reject);
  }

  function next(): void {
    if (busy) return;
    const job = queue.shift();
    if (job === undefined) return;
    const id = `KUP_${nonce}_${++seq}`;
    const stdin = job.stdin;
    if (stdin !== undefined && new RegExp(`^${id}$`, 'm').test(stdin)) {
      runFallback(job);
      next();
      return;
    }
    const child = startShell();
    if (child === undefined) {
      runFallback(job);
      next();
      return;
    }
    busy = true;
    out = '';
    err = '';
    outFound = -1;
    const command = [job.cmd, ...job.args].map(shellQuote).join(' ');
    const input =
      stdin === undefined
        ? `${command} </dev/null\n`
        : `${command} <<'${id}'\n${stdin}${stdin.endsWith('\n') || stdin === '' ? '' : '\n'}${id}\n`;
    // A newline before each sentinel: the output need not end with one (it is taken off again).
    const script = `${input}printf '\\n${id} %d\\n' "$?"\nprintf '\\n${id}\\n' >&2\n`;
    const timer = setTimeout(() => {
      const c = current;
      current = undefined;
      busy = false;
      kill(child);
      c?.job.reject(new Error(`${job.cmd} timed out after ${timeoutMs} ms`));
      next();
    }, timeoutMs);
    current = { job, outEnd: `\n${id} `, errEnd: `\n${id}\n`, timer };
    child.stdin.write(script);
  }

  function kill(child: ChildProcessWithoutNullStreams): void {
    if (shell === child) shell = undefined;
    try {
      if (child.pid !== undefined) process.kill(-child.pid, 'SIGKILL');
    } catch {
      child.kill('SIGKILL');
    }
  }

  const run = ((cmd: string, args: string[], stdin?: string) =>
    new Promise<RunResult>((resolve, reject) => {
      queue.push({ cmd, args, stdin, resolve, reject });
      next();
    })) as ShellRun;
  run.start = () => {
    startShell();
  };
  run.close = () => {
    const c = current;
    current = undefined;
    busy = false;
    if (c !== undefined) {
      clearTimeout(c.timer);
      c.job.reject(new Error('the shell runner was closed'));
    }
    const child = shell;
    if (child === undefined) return;
    shell = undefined;
    child.stdin.end();
    kill(child);
  };
  return run;
}
