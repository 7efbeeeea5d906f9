// What a newcomer meets on the command line, with the real bin: `connections` and `trace` take the
// proxy's own --metrics-bind-address value; a proxy that may not lower its oom_score_adj (not root, or a
// container without CAP_SYS_RESOURCE) does not warn about it; `completion` prints a script that
// completes the subcommands and flags.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { chmod, mkdtemp, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { hasSysResource } from '../../src/lib/oom-score-adj.ts';
import { service, slice, toYaml } from '../helpers/manifests.ts';
import { freePort, startProxyProcess } from '../helpers/proxy-process.ts';

const BIN = fileURLToPath(new URL('../../bin/kube-userspace-proxy.js', import.meta.url));
const isRoot = process.getuid?.() === 0;

type Result = { code: number | null; stdout: string; stderr: string };

/** Runs `command args` to its end (at most 20 s). */
function run(command: string, args: string[], env: NodeJS.ProcessEnv = process.env): Promise<Result> {
  return new Promise((resolve) => {
    const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'], env });
    let stdout = '';
    let stderr = '';
    const timer = setTimeout(() => child.kill('SIGKILL'), 20_000);
    child.stdout.on('data', (c) => {
      stdout += c;
    });
    child.stderr.on('data', (c) => {
      stderr += c;
    });
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

const cli = (args: string[], env?: NodeJS.ProcessEnv) => run(process.execPath, [BIN, ...args], env);

test("connections and trace take the proxy's --metrics-bind-address, bind-all meaning loopback", async (t) => {
  const proxy = await startProxyProcess();
  t.after(() => proxy.stop());
  const port = proxy.ports.metrics;
  for (const args of [
    ['connections', `--metrics-bind-address=0.0.0.0:${port}`],
    ['connections', '--metrics-bind-address', `127.0.0.1:${port}`, '--json'],
    ['connections', `--metrics-bind-address=:${port}`],
    ['trace', `--metrics-bind-address=0.0.0.0:${port}`, '--limit', '5'],
  ]) {
    const r = await cli(args);
    assert.equal(r.code, 0, `${args.join(' ')}: ${r.stderr}`);
    if (args[0] === 'connections' && !args.includes('--json')) assert.match(r.stdout, /^SERVICE\s+CLIENT/);
  }
  const empty = await cli(['connections', '--metrics-bind-address=']);
  assert.equal(empty.code, 2);
  assert.match(empty.stderr, /--metrics-bind-address is empty/);
  const bad = await cli(['trace', '--metrics-bind-address=localhost:10249']);
  assert.equal(bad.code, 2);
  assert.match(bad.stderr, /invalid --metrics-bind-address "localhost:10249"/);
});

test('--metrics-bind-address=[::]:PORT reads [::1]:PORT', async (t) => {
  const seen: string[] = [];
  const server = http.createServer((req, res) => {
    seen.push(req.url ?? '');
    res.setHeader('content-type', 'application/json');
    res.end(JSON.stringify({ active: [], recent: [], totals: { active: 0, recent: 0 }, dropped: 0 }));
  });
  const listening = await new Promise<boolean>((resolve) => {
    server.once('error', () => resolve(false));
    server.listen(0, '::1', () => resolve(true));
  });
  if (!listening) return; // no IPv6 loopback here
  t.after(() => new Promise((r) => server.close(r)));
  const r = await cli([
    'connections',
    `--metrics-bind-address=[::]:${(server.address() as AddressInfo).port}`,
  ]);
  assert.equal(r.code, 0, r.stderr);
  assert.deepEqual(seen, ['/debug/connections']);
});

/**
 * Runs the proxy as the demo does (a manifest, --no-iptables) under `wrap` (a command that drops
 * privileges, or none) until it serves, and returns its log lines and the oom_score_adj it ran with.
 */
async function demoProxy(wrap: string[]): Promise<{ lines: Record<string, unknown>[]; oomScoreAdj: string }> {
  const dir = await mkdtemp(join(tmpdir(), 'kup-oom-'));
  try {
    // Readable by an unprivileged user.
    await chmod(dir, 0o755);
    const manifest = join(dir, 'm.yaml');
    await writeFile(
      manifest,
      toYaml([
        service('web', '10.96.0.1', [{ name: 'http', port: 80, targetPort: 8080 }]),
        slice('web', 'w', [{ ip: '127.0.0.11' }], [{ name: 'http', port: 8080 }]),
      ]),
    );
    await chmod(manifest, 0o644);
    const metrics = await freePort();
    const args = [
      BIN,
      '--manifest',
      manifest,
      '--no-iptables',
      '--state-file=',
      '--healthz-bind-address=',
      `--metrics-bind-address=127.0.0.1:${metrics}`,
      '--v=2',
    ];
    const [command, ...rest] = [...wrap, process.execPath, ...args];
    const child = spawn(command!, rest, { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let stderr = '';
    child.stdout.on('data', (c) => {
      out += c;
    });
    child.stderr.on('data', (c) => {
      stderr += c;
    });
    const exited = new Promise((r) => child.once('exit', r));
    let oomScoreAdj = '';
    try {
      const deadline = Date.now() + 20_000;
      while (!out.includes('"msg":"Proxy started"')) {
        if (child.exitCode !== null || Date.now() > deadline)
          throw new Error(`the proxy did not start: ${stderr}${out}`);
        await new Promise((r) => setTimeout(r, 20));
      }
      // The node process itself (setpriv execs it in place).
      oomScoreAdj = (await readFile(`/proc/${child.pid}/oom_score_adj`, 'utf8')).trim();
    } finally {
      child.kill('SIGTERM');
      await exited;
    }
    const lines = out
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    return { lines, oomScoreAdj };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

const oomLines = (lines: Record<string, unknown>[]) =>
  lines.filter((l) => /oom_score_adj/.test(String(l.msg))).map((l) => [l.level, l.msg, l.reason]);

test('npm run demo as a user, or root without CAP_SYS_RESOURCE: one debug line about oom_score_adj, no warning', async (t) => {
  if (!isRoot && process.env.CI === undefined) {
    t.skip('needs root to run the proxy as another user');
    return;
  }
  const unprivileged = isRoot ? ['setpriv', '--reuid=65534', '--regid=65534', '--clear-groups'] : [];
  const noCapability = ['setpriv', '--bounding-set=-sys_resource', '--inh-caps=-sys_resource'];
  for (const wrap of [unprivileged, noCapability]) {
    const { lines, oomScoreAdj } = await demoProxy(wrap);
    assert.deepEqual(oomLines(lines), [
      ['debug', 'Not setting oom_score_adj', 'lowering it needs CAP_SYS_RESOURCE'],
    ]);
    assert.notEqual(oomScoreAdj, '-999');
  }
  // Root with CAP_SYS_RESOURCE (where this test runs with it): it is applied.
  if (!isRoot || hasSysResource(readFileSync('/proc/self/status', 'utf8')) !== true) return;
  const { lines, oomScoreAdj } = await demoProxy([]);
  assert.deepEqual(oomLines(lines), [['debug', 'Set oom_score_adj', undefined]]);
  assert.equal(oomScoreAdj, '-999');
});

test('completion prints a bash (or zsh) script that completes the subcommands and their flags', async (t) => {
  const bash = await cli(['completion'], { ...process.env, SHELL: '/bin/bash' });
  assert.equal(bash.code, 0, bash.stderr);
  assert.match(
    bash.stdout,
    /complete -o bashdefault -o default -F _kube-userspace-proxy_yargs_completions kube-userspace-proxy/,
  );
  const zsh = await cli(['completion'], { ...process.env, SHELL: '/usr/bin/zsh' });
  assert.equal(zsh.code, 0, zsh.stderr);
  assert.match(zsh.stdout, /^#compdef kube-userspace-proxy/);

  // What the script gets at each TAB: the program asked with the words typed so far.
  const ask = async (...words: string[]) => {
    const r = await cli(['--get-yargs-completions', 'kube-userspace-proxy', ...words], {
      ...process.env,
      SHELL: '/bin/bash',
    });
    assert.equal(r.code, 0, r.stderr);
    return r.stdout.split('\n').filter((l) => l !== '');
  };
  const commands = await ask('');
  for (const c of ['connections', 'trace', 'completion']) assert.ok(commands.includes(c), c);
  const flags = await ask('--');
  for (const f of ['--manifest', '--proxy-port-range', '--metrics-bind-address', '--no-iptables'])
    assert.ok(flags.includes(f), f);
  assert.ok(!flags.includes('--masquerade-all'), 'ignored kube-proxy flags are not offered');
  const traceFlags = await ask('trace', '--');
  for (const f of ['--follow', '--service', '--metrics-bind-address', '--metrics-address'])
    assert.ok(traceFlags.includes(f), f);
  assert.ok(!traceFlags.includes('--manifest'), "the proxy's flags are not the subcommand's");
  assert.ok((await ask('connections', '--')).includes('--state'));

  // And in bash itself: the script, sourced, fills COMPREPLY through the program on PATH.
  const dir = await mkdtemp(join(tmpdir(), 'kup-completion-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  await symlink(BIN, join(dir, 'kube-userspace-proxy'));
  const script = join(dir, 'completion.bash');
  await writeFile(script, bash.stdout);
  const complete = async (...words: string[]) => {
    const r = await run(
      'bash',
      [
        '-c',
        // biome-ignore lint/suspicious/noTemplateCurlyInString: bash, not a template
        'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); _kube-userspace-proxy_yargs_completions; printf "%s\\n" "${COMPREPLY[@]}"',
        'bash',
        script,
        'kube-userspace-proxy',
        ...words,
      ],
      { ...process.env, SHELL: '/bin/bash', PATH: `${dir}:${dirname(process.execPath)}:${process.env.PATH}` },
    );
    assert.equal(r.code, 0, r.stderr);
    return r.stdout.split('\n').filter((l) => l !== '');
  };
  assert.deepEqual(await complete('tr'), ['trace']);
  assert.deepEqual(await complete('trace', '--fo'), ['--follow']);
  assert.deepEqual(await complete('--proxy-port'), ['--proxy-port-range']);
});
