// `npm run bench [-- --quick | --only NAME]`: the namespace benchmark against direct, HAProxy and nginx
// (bench/harness.ts) when this is root with the tools of bench/setup.sh; otherwise, said plainly, the
// loopback benchmark that needs no tools. Then the in-process micro-benchmarks.
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const EXIT_UNAVAILABLE = 3;
const path = (b: string) => fileURLToPath(new URL(b, import.meta.url));

function run(bench: string, args: string[] = []): number {
  const r = spawnSync(process.execPath, [path(bench), ...args], { stdio: 'inherit' });
  return r.status ?? 1;
}

process.stdout.write(
  '\n## harness.ts: this proxy beside HAProxy, nginx and direct, in network namespaces\n\n',
);
const code = run('harness.ts', process.argv.slice(2));
const micro = ['state.bench.ts', 'sniff.bench.ts'];
if (code === EXIT_UNAVAILABLE) {
  process.stdout.write(
    '\nThe namespace benchmark cannot run here (see above). Falling back to the loopback benchmark:\n' +
      'this proxy (--no-iptables) against a direct connection only, no HAProxy or nginx.\n' +
      'For the full comparison: sudo bash bench/setup.sh && sudo npm run bench\n',
  );
  micro.unshift('loopback.bench.ts');
} else if (code !== 0) {
  process.exitCode = 1;
}
for (const b of micro) {
  process.stdout.write(`\n## ${b}\n\n`);
  if (run(b) !== 0) process.exitCode = 1;
}
