// `npm run bench`: the benchmarks that need no extra tools. The comparison against HAProxy and nginx in
// network namespaces comes with the performance work (bench/README.md).
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const benches = ['loopback.bench.ts', 'state.bench.ts', 'sniff.bench.ts'];
for (const b of benches) {
  process.stdout.write(`\n## ${b}\n\n`);
  const r = spawnSync(process.execPath, [fileURLToPath(new URL(b, import.meta.url))], { stdio: 'inherit' });
  if (r.status !== 0) process.exitCode = 1;
}
