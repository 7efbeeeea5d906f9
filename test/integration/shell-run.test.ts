// The shell runner: programs started from a kept /bin/sh give the same results as a direct spawn
// (stdout, stderr, exit code, stdin, 127 for a missing program), one at a time, and it recovers from
// a command past its timeout and from a shell that died.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { createRun } from '../../src/netfilter/iptables.ts';
import { createShellRun, shellQuote } from '../../src/netfilter/shell-run.ts';

function setup(t: { after(fn: () => unknown): void }, options: { timeoutMs?: number; shell?: string } = {}) {
  const fallbackCalls: string[] = [];
  const direct = createRun();
  const run = createShellRun({
    ...options,
    fallback: (cmd, args, stdin) => {
      fallbackCalls.push(cmd);
      return direct(cmd, args, stdin);
    },
  });
  t.after(() => run.close());
  return { run, fallbackCalls };
}

test('shellQuote keeps every character literal', () => {
  assert.equal(shellQuote("it's"), `'it'\\''s'`);
  assert.equal(shellQuote('$HOME `x` "y" \\n'), `'$HOME \`x\` "y" \\n'`);
});

test('same results as a direct spawn: output, errors, exit codes, stdin, a missing program', async (t) => {
  const { run, fallbackCalls } = setup(t);
  assert.deepEqual(await run('echo', ['hello', 'world']), { code: 0, stdout: 'hello world\n', stderr: '' });
  assert.deepEqual(await run('printf', ['%s', 'no newline']), { code: 0, stdout: 'no newline', stderr: '' });
  const weird = `a'b "c" $d \`e\` \\f`;
  assert.equal((await run('printf', ['%s', weird])).stdout, weird, 'arguments reach the program as given');
  const failed = await run('sh', ['-c', 'echo out; echo err >&2; exit 3']);
  assert.deepEqual(failed, { code: 3, stdout: 'out\n', stderr: 'err\n' });
  assert.deepEqual(await run('cat', [], '*nat\n-A X -j Y\nCOMMIT\n'), {
    code: 0,
    stdout: '*nat\n-A X -j Y\nCOMMIT\n',
    stderr: '',
  });
  assert.equal((await run('cat', [], 'no trailing newline')).stdout, 'no trailing newline\n');
  assert.equal((await run('cat', [])).stdout, '', 'no stdin: /dev/null');
  const missing = await run('kup-no-such-program', ['x']);
  assert.equal(missing.code, 127);
  assert.match(missing.stderr, /not found/);
  // 2 MiB in and out, in many pipe chunks.
  const big = `${'x'.repeat(1023)}\n`.repeat(2048);
  const echoed = await run('cat', [], big);
  assert.equal(echoed.stdout.length, big.length);
  assert.equal(echoed.stdout, big);
  assert.deepEqual(fallbackCalls, []);
});

test('commands run one at a time, in order', async (t) => {
  const { run } = setup(t);
  const results = await Promise.all(
    Array.from({ length: 20 }, (_, i) => run('sh', ['-c', `sleep 0.0$((${i} % 3)); echo ${i}`])),
  );
  assert.deepEqual(
    results.map((r) => r.stdout.trim()),
    Array.from({ length: 20 }, (_, i) => String(i)),
  );
});

test('a command past its timeout is killed with the shell; the next one gets a new shell', async (t) => {
  const { run } = setup(t, { timeoutMs: 300 });
  const started = Date.now();
  await assert.rejects(run('sleep', ['5']), /timed out after 300 ms/);
  assert.ok(Date.now() - started < 2000);
  assert.deepEqual(await run('echo', ['again']), { code: 0, stdout: 'again\n', stderr: '' });
});

test('a shell that died is replaced; without a shell, the fallback runs the commands', async (t) => {
  const { run } = setup(t);
  assert.equal((await run('echo', ['one'])).stdout, 'one\n');
  // The shell itself exits (as if killed): the command fails, the next one works.
  await assert.rejects(run('sh', ['-c', 'kill -9 $PPID; sleep 1']));
  assert.equal((await run('echo', ['two'])).stdout, 'two\n');

  const none = setup(t, { shell: '/nonexistent/sh' });
  assert.deepEqual(await none.run('echo', ['three']), { code: 0, stdout: 'three\n', stderr: '' });
  assert.deepEqual(none.fallbackCalls, ['echo']);
});
