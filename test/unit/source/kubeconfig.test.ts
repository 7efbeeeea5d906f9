// --kubeconfig is read like the manifest before client-node loads it: a FIFO is refused at once (it would
// block the start for good), an alias bomb or a recursive alias is refused with file:line:col.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { loadKubeConfig } from '../../../src/source/kubeconfig-credentials.ts';
import { aliasBomb } from '../../helpers/alias-bomb.ts';

const GOOD = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: t}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`;

test('loadKubeConfig: a good file loads; an alias bomb, a recursive alias and a FIFO are refused at once', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'kup-kubeconfig-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const good = join(dir, 'good');
  await writeFile(good, GOOD);
  assert.equal(loadKubeConfig({ kubeconfig: good }).getCurrentCluster()?.server, 'https://127.0.0.1:6443');

  const bomb = join(dir, 'bomb');
  // 9 levels of 9 aliases: 387 million nodes once expanded, 700 bytes written.
  await writeFile(bomb, `${GOOD}${aliasBomb(9)}`);
  const started = Date.now();
  assert.throws(
    () => loadKubeConfig({ kubeconfig: bomb }),
    new RegExp(`kubeconfig ${bomb}:1[0-9]:\\d+: .*alias`),
  );
  assert.ok(Date.now() - started < 1000, `refused in ${Date.now() - started} ms`);

  const recursive = join(dir, 'recursive');
  await writeFile(recursive, `${GOOD}extra: &r {self: *r}\n`);
  assert.throws(
    () => loadKubeConfig({ kubeconfig: recursive }),
    new RegExp(`kubeconfig ${recursive}:\\d+:\\d+: `),
  );

  const fifo = join(dir, 'fifo');
  execFileSync('mkfifo', [fifo]);
  assert.throws(() => loadKubeConfig({ kubeconfig: fifo }), /not a regular file/);

  // KUBECONFIG (client-node's default path) gets the same reading.
  const saved = process.env.KUBECONFIG;
  t.after(() => {
    if (saved === undefined) delete process.env.KUBECONFIG;
    else process.env.KUBECONFIG = saved;
  });
  process.env.KUBECONFIG = bomb;
  assert.throws(() => loadKubeConfig({}), /alias/);
});
