// Builds every native/*.c into build/native/<name>.node with the system's C compiler, against Node-API's
// headers (node_api.h: the same ABI on every Node version; uv.h beside it for the loop, libuv's ABI is
// stable across 1.x). No node-gyp and no download: the headers come from the Node that runs this, the
// `node` package's platform binary, or the system's Node.
//
//   node scripts/build-native.ts             fails when one cannot be built (npm run build, CI)
//   node scripts/build-native.ts --optional  says why and exits 0 (npm ci's prepare): the proxy runs
//                                            without the missing ones, as it would without any
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, renameSync } from 'node:fs';
import path from 'node:path';

const root = path.resolve(import.meta.dirname, '..');
const sources = readdirSync(path.join(root, 'native'))
  .filter((f) => f.endsWith('.c'))
  .sort();
const optional = process.argv.includes('--optional');

function headerDirs(): string[] {
  const exec = path.dirname(process.execPath);
  return [
    process.env.KUP_NODE_HEADERS,
    path.join(exec, '..', 'include', 'node'),
    path.join(
      root,
      'node_modules',
      'node',
      'node_modules',
      `node-${process.platform}-${process.arch}`,
      'include',
      'node',
    ),
    '/usr/local/include/node',
    '/usr/include/node',
  ].filter((d): d is string => d !== undefined && d !== '');
}

function fail(message: string): never {
  if (optional) {
    console.warn(`build-native: ${message}; the proxy runs without those addons (build/native/*.node)`);
    process.exit(0);
  }
  console.error(`build-native: ${message}`);
  process.exit(1);
}

if (process.platform !== 'linux') fail(`the addon is for Linux (this is ${process.platform})`);
const headers = headerDirs().find((d) => existsSync(path.join(d, 'node_api.h')));
if (headers === undefined) fail(`no node_api.h in ${headerDirs().join(', ')} (set KUP_NODE_HEADERS)`);
const cc = process.env.CC ?? 'cc';
// Each addon on its own: one that does not build (--optional) leaves the others.
const failed: string[] = [];
for (const file of sources) {
  const name = file.slice(0, -2);
  const output = path.join(root, 'build', 'native', `${name}.node`);
  mkdirSync(path.dirname(output), { recursive: true });
  const partial = `${output}.${process.pid}.tmp`;
  const args = ['-O2', '-Wall', '-Wextra', '-Werror', '-fPIC', '-shared', `-I${headers}`];
  args.push(`-DNODE_GYP_MODULE_NAME=${name}`, '-o', partial, path.join(root, 'native', file));
  const built = spawnSync(cc, args, { stdio: ['ignore', 'inherit', 'inherit'] });
  if (built.error !== undefined)
    fail(`${cc}: ${built.error.message} (install a C compiler: apt-get install gcc libc6-dev)`);
  if (built.status !== 0) {
    failed.push(`${cc} exited with ${built.status} building native/${file}`);
    continue;
  }
  // Renamed into place: a proxy starting meanwhile loads the old file or the new one, never half of one.
  renameSync(partial, output);
  console.log(`build-native: ${path.relative(root, output)} (headers: ${headers})`);
}
if (failed.length > 0) fail(failed.join('; '));
