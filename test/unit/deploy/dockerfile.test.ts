// The Dockerfile, checked without a Docker engine: Node 24 slim Debian bases, COPY sources that exist and
// are not .dockerignored, a production-only node_modules, the tools the proxy runs, and the image's
// layout run for real (dist/ compiled into it, the CLI as ENTRYPOINT).
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { cpSync, existsSync, readdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { builtinModules } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../../..', import.meta.url));
const PKG = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
  version: string;
  dependencies: Record<string, string>;
};

type Instruction = { stage: number; op: string; flags: Record<string, string>; args: string };

/** Instructions of the Dockerfile: continuations joined, comments dropped, `--flag=value`s split off. */
function parseDockerfile(text: string): Instruction[] {
  const out: Instruction[] = [];
  let stage = -1;
  const logical = text
    .replace(/\\\n(\s*#.*\n)*/g, ' ')
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l !== '' && !l.startsWith('#'));
  for (const line of logical) {
    const m = /^(\w+)\s+(.*)$/.exec(line);
    assert.ok(m, `cannot read: ${line}`);
    const op = m[1]!.toUpperCase();
    let rest = m[2]!;
    const flags: Record<string, string> = {};
    for (let f = /^--([\w-]+)=(\S+)\s+/.exec(rest); f; f = /^--([\w-]+)=(\S+)\s+/.exec(rest)) {
      flags[f[1]!] = f[2]!;
      rest = rest.slice(f[0].length);
    }
    if (op === 'FROM') stage++;
    out.push({ stage, op, flags, args: rest.trim() });
  }
  return out;
}

const instructions = parseDockerfile(readFileSync(join(ROOT, 'Dockerfile'), 'utf8'));
const froms = instructions.filter((i) => i.op === 'FROM');
const stageNames = froms.map((f) => /\s+AS\s+(\S+)$/i.exec(f.args)?.[1]);
const last = froms.length - 1;
const inStage = (stage: number, op: string) => instructions.filter((i) => i.stage === stage && i.op === op);
const workdir = (stage: number) => inStage(stage, 'WORKDIR').at(-1)?.args;
const runs = (stage: number) => inStage(stage, 'RUN').map((i) => i.args);

test('every stage is Node 24 on slim Debian', () => {
  assert.ok(froms.length >= 2, 'a build stage and a runtime stage');
  for (const f of froms) assert.match(f.args, /^node:24-(bookworm|trixie)-slim(\s+AS\s+\w+)?$/i);
});

/** .dockerignore patterns as regexes over repo-relative paths (a pattern also covers what is under it). */
function ignored(path: string): boolean {
  const patterns = readFileSync(join(ROOT, '.dockerignore'), 'utf8')
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l !== '' && !l.startsWith('#'));
  assert.ok(!patterns.some((p) => p.startsWith('!')), 'exceptions are not modelled here');
  return patterns.some((p) => {
    const re = new RegExp(`^${p.replace(/[.+^${}()|[\]\\]/g, '\\$&').replace(/\*/g, '[^/]*')}(/|$)`);
    return re.test(path);
  });
}

test('COPY sources from the context exist and are not .dockerignored', () => {
  const copies = instructions.filter((i) => i.op === 'COPY' && i.flags['from'] === undefined);
  assert.ok(copies.length > 0);
  for (const c of copies) {
    const sources = c.args.split(/\s+/).slice(0, -1);
    for (const s of sources) {
      assert.ok(existsSync(join(ROOT, s)), `COPY ${s}: not in the repository`);
      assert.ok(!ignored(s.replace(/\/$/, '')), `COPY ${s}: excluded by .dockerignore`);
    }
  }
  assert.ok(ignored('node_modules') && ignored('dist') && ignored('.git'), 'the context stays small');
});

test('the runtime copies package.json, a production node_modules, dist/ and the native addon from the build stage', () => {
  const build = stageNames.indexOf('build');
  assert.ok(build >= 0 && build < last);
  const buildDir = workdir(build)!;
  const buildRuns = runs(build).join(' && ');
  // npm ci with dev dependencies, the build, then npm ci --omit=dev over it: in that order.
  const full = buildRuns.search(/npm ci(?! --omit)/);
  const compile = buildRuns.indexOf('npm run build');
  const prod = buildRuns.search(/npm ci --omit=dev/);
  assert.ok(full >= 0 && full < compile && compile < prod, buildRuns);
  const tsconfig = JSON.parse(readFileSync(join(ROOT, 'tsconfig.build.json'), 'utf8')) as {
    compilerOptions: { outDir: string };
  };
  const fromBuild = inStage(last, 'COPY')
    .filter((c) => c.flags['from'] === 'build')
    .map((c) => c.args.split(/\s+/)[0]);
  assert.deepEqual(fromBuild.sort(), [
    `${buildDir}/build/native`,
    `${buildDir}/${tsconfig.compilerOptions.outDir}`,
    `${buildDir}/node_modules`,
    `${buildDir}/package.json`,
  ]);
  // native/tcp_fin.c needs a C compiler, and its sources must be there when npm ci's prepare builds it.
  assert.match(buildRuns, /apt-get install [^&]*\bgcc\b/);
  const sources = inStage(build, 'COPY').map((c) => c.args.split(/\s+/)[0]);
  assert.ok(sources.includes('native') && sources.includes('scripts/build-native.ts'), sources.join(' '));
});

test('the runtime has iptables, conntrack and iproute2, the iptables wrapper, and runs as root', () => {
  const install = runs(last).find((r) => r.includes('apt-get install'));
  assert.ok(install);
  assert.match(install, /--no-install-recommends/);
  for (const p of ['iptables', 'conntrack', 'iproute2']) assert.match(install, new RegExp(`\\s${p}(\\s|$)`));
  assert.match(install, /rm -rf \/var\/lib\/apt\/lists/);
  const wrapper = inStage(last, 'COPY').find((c) => c.args.startsWith('deploy/image/iptables-wrapper '));
  assert.ok(wrapper);
  assert.equal(wrapper.flags['chmod'], '0755');
  const target = wrapper.args.split(/\s+/)[1]!;
  assert.ok(runs(last).includes(`${target} --install`));
  assert.equal(spawnSync('sh', ['-n', join(ROOT, 'deploy/image/iptables-wrapper')]).status, 0, 'sh -n');
  for (const u of inStage(last, 'USER')) assert.match(u.args, /^(root|0)$/);
});

test('the ENTRYPOINT is the CLI, laid out as an installed package (so it runs dist/), SIGUSR1 disabled', () => {
  const entry = inStage(last, 'ENTRYPOINT');
  assert.equal(entry.length, 1);
  const argv = JSON.parse(entry[0]!.args) as string[];
  const dir = workdir(last)!;
  // --disable-sigusr1: no signal can open the inspector, not even before the CLI's first line runs.
  assert.deepEqual(argv, ['node', '--disable-sigusr1', `${dir}/bin/kube-userspace-proxy.js`]);
  // bin/kube-userspace-proxy.js runs dist/ under node_modules (src/ otherwise).
  assert.match(dir, /\/node_modules\/kube-userspace-proxy$/);
  assert.ok(inStage(last, 'COPY').some((c) => /^bin\s+(\.\/bin|bin)$/.test(c.args)));
});

/** Package names the compiled code imports: each must be a production dependency. */
function bareImports(dir: string): Set<string> {
  const names = new Set<string>();
  for (const entry of readdirSync(dir, { recursive: true, withFileTypes: true })) {
    if (!entry.isFile() || !entry.name.endsWith('.js')) continue;
    const text = readFileSync(join(entry.parentPath, entry.name), 'utf8');
    for (const m of text.matchAll(/(?:from\s+|import\s*\(\s*|import\s+)['"]([^'".][^'"]*)['"]/g)) {
      const spec = m[1]!;
      if (spec.startsWith('node:') || builtinModules.includes(spec)) continue;
      names.add(spec.startsWith('@') ? spec.split('/').slice(0, 2).join('/') : spec.split('/')[0]!);
    }
  }
  return names;
}

function run(args: string[], cwd: string) {
  return new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
    const child = spawn(process.execPath, args, { cwd, stdio: ['ignore', 'pipe', 'pipe'] });
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

test("the image's layout runs the compiled dist/: --version, a bad flag", async (t) => {
  const tmp = await mkdtemp(join(tmpdir(), 'kup-image-'));
  t.after(() => rm(tmp, { recursive: true, force: true }));
  const app = join(tmp, 'usr/local/lib/node_modules/kube-userspace-proxy');
  // tsc exits non-zero on a type error elsewhere (npm run lint reports those); the emitted JS is what counts.
  const tsc = spawnSync(
    process.execPath,
    [
      join(ROOT, 'node_modules/typescript/bin/tsc'),
      '-p',
      join(ROOT, 'tsconfig.build.json'),
      '--outDir',
      join(app, 'dist'),
    ],
    { encoding: 'utf8', timeout: 120_000 },
  );
  assert.ok(existsSync(join(app, 'dist/main.js')), `tsc emitted no dist/main.js: ${tsc.stdout}${tsc.stderr}`);
  cpSync(join(ROOT, 'bin'), join(app, 'bin'), { recursive: true });
  writeFileSync(join(app, 'package.json'), readFileSync(join(ROOT, 'package.json')));
  symlinkSync(join(ROOT, 'node_modules'), join(app, 'node_modules'));
  assert.ok(!existsSync(join(app, 'src')));

  for (const name of bareImports(join(app, 'dist')))
    assert.ok(name in PKG.dependencies, `dist/ imports ${name}, which npm ci --omit=dev does not install`);

  const version = await run([join(app, 'bin/kube-userspace-proxy.js'), '--version'], tmp);
  assert.equal(version.stderr, '');
  assert.equal(version.stdout, `kube-userspace-proxy ${PKG.version}\n`);
  assert.equal(version.code, 0);

  // The CLI's parsing, errors and exit codes work from dist/ too.
  const bad = await run([join(app, 'bin/kube-userspace-proxy.js'), '--proxy-mode=ipvs'], tmp);
  assert.equal(bad.code, 2);
  assert.match(bad.stderr, /only implements the userspace mode/);
});
