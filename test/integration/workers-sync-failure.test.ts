// --workers 2 with real iptables in a namespace: a sync whose iptables-restore fails has already taken
// its changes (the main process opened and closed listeners for them). The workers must still learn of
// them once a sync succeeds, or they never open the new Service's listener and keep the removed one's,
// whose port may go to another Service.
import assert from 'node:assert/strict';
import { chmod, mkdir, mkdtemp, rename, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { service, toYaml } from '../helpers/manifests.ts';
import { createCluster, createSandbox, requireRootOrSkip } from '../helpers/netns.ts';
import { waitFor } from '../helpers/servers.ts';

const BIN = fileURLToPath(new URL('../../bin/kube-userspace-proxy.js', import.meta.url));

test('workers: a sync that failed after taking its changes still reaches the workers once one succeeds', async (t) => {
  if (!requireRootOrSkip(t)) return;
  const sb = await createSandbox(t);
  const cluster = await createCluster(sb, { pods: 0 });
  const dir = await mkdtemp(join(tmpdir(), 'kup-workers-fail-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  // iptables-restore fails while `fail` exists (as when another agent holds the table or a rule is bad);
  // otherwise it is the real one, inside the test's namespace.
  const bin = join(dir, 'bin');
  await mkdir(bin);
  const restore = join(bin, 'iptables-restore');
  await writeFile(
    restore,
    `#!/bin/sh\nif [ -e ${dir}/fail ]; then cat >/dev/null; echo "iptables-restore: line 2 failed" >&2; exit 1; fi\nexec /usr/sbin/iptables-restore "$@"\n`,
  );
  await chmod(restore, 0o755);
  const manifest = join(dir, 'm.yaml');
  let n = 0;
  const write = async (objects: unknown[]) => {
    const tmp = join(dir, `.m.${n++}`);
    await writeFile(tmp, toYaml(objects));
    await rename(tmp, manifest);
  };
  const a = service('a', '10.96.0.10', [{ name: 'p', port: 80, targetPort: 8080 }]);
  const b = service('b', '10.96.0.11', [{ name: 'p', port: 80, targetPort: 8080 }]);
  await write([a]);
  const child = sb.spawnIn(cluster.node, 'env', [
    `PATH=${bin}:${process.env.PATH}`,
    process.execPath,
    BIN,
    '--manifest',
    manifest,
    '--workers=2',
    '--state-file=',
    '--hostname-override=node-1',
    '--healthz-bind-address=',
    '--metrics-bind-address=',
    '--iptables-min-sync-period=0s',
  ]);
  const lines: Record<string, unknown>[] = [];
  createInterface({ input: child.stdout! }).on('line', (l) => {
    try {
      lines.push(JSON.parse(l) as Record<string, unknown>);
    } catch {
      // Not a log line.
    }
  });
  t.after(() => {
    child.kill('SIGKILL');
    for (const l of lines)
      if (l.msg === 'Worker started')
        try {
          process.kill(l.pid as number, 'SIGKILL');
        } catch {
          // Gone already.
        }
  });
  const count = (msg: string, name: string, worker: boolean) =>
    lines.filter(
      (l) =>
        l.msg === msg &&
        String(l.service).startsWith(`default/${name}:`) &&
        (l.worker !== undefined) === worker,
    ).length;
  const until = (what: string, fn: () => boolean) =>
    waitFor(
      () => {
        if (child.exitCode !== null) throw new Error(`the proxy exited: ${JSON.stringify(lines.slice(-5))}`);
        return fn();
      },
      20_000,
      what,
    );
  await until(
    'a open in the main process and the worker',
    () => count('Opened service port', 'a', false) === 1 && count('Opened service port', 'a', true) === 1,
  );

  await writeFile(join(dir, 'fail'), '');
  await write([b]);
  await until('a failed sync', () => lines.some((l) => l.msg === 'Sync failed'));
  // The main process acted on the changes it took before the restore failed.
  assert.equal(count('Opened service port', 'b', false), 1);
  assert.equal(count('Closed service port', 'a', false), 1);
  await rm(join(dir, 'fail'));
  // The retry succeeds: the worker closes a and opens b, as the main process did.
  await until(
    'b open in the worker, a closed there',
    () => count('Opened service port', 'b', true) === 1 && count('Closed service port', 'a', true) === 1,
  );
});
