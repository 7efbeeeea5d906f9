// Least privilege, proven: the proxy CLI in a namespace with a bounding set of NET_ADMIN only (as root
// without the other capabilities) serves through iptables (nft); without NET_ADMIN it exits at once with
// KUP_ERR_PERMISSION; --no-iptables needs no capability at all; the legacy iptables backend also needs
// NET_RAW, as deploy/kube-userspace-proxy.yaml says.
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { mkdtemp, readFile, rm, symlink } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { test } from 'node:test';
import { CAP_NET_ADMIN, CAP_NET_RAW, parseEffectiveCapabilities } from '../../src/proxier/process-limits.ts';
import type { DebugServicePort } from '../../src/server/debug.ts';
import {
  createManifest,
  createProxyCluster,
  e2eProxyArgs,
  eventually,
  PROXY_BIN,
  runProxyOnce,
} from '../helpers/cluster-proxy.ts';
import { service, slice } from '../helpers/manifests.ts';
import { createSandbox, requireRootOrSkip } from '../helpers/netns.ts';

const CLUSTER_IP = '10.96.5.10';
/** The shard chains of CLUSTER_IP's lowest 5 bits (10: `0A`) hold its portal rules. */
const CLUSTER_IP_SHARD = '0A';

test('least privilege: NET_ADMIN is enough (NET_RAW too on iptables-legacy); without it the proxy says so', {
  timeout: 90_000,
}, async (t) => {
  if (!requireRootOrSkip(t)) return;
  const sb = await createSandbox(t);
  const cluster = await createProxyCluster(sb, { pods: 1 });
  const { node, nodeAgent } = cluster;
  const pod = cluster.pods[0]!.agent;
  await pod.serve('web', 'pod0', { tcpPort: 8080 });
  const manifest = await createManifest(t);
  await manifest.write([
    service('web', CLUSTER_IP, [{ name: 'http', port: 80, targetPort: 8080 }]),
    slice('web', 'web-1', [{ ip: cluster.pods[0]!.ip }], [{ name: 'http', port: 8080 }]),
  ]);
  // iptables-legacy under the usual names, first in PATH: what a host on the legacy backend runs.
  const legacyDir = await mkdtemp(join(tmpdir(), 'kup-legacy-'));
  t.after(() => rm(legacyDir, { recursive: true, force: true }));
  for (const family of ['iptables', 'ip6tables'])
    for (const tool of ['', '-save', '-restore'])
      await symlink(`/usr/sbin/${family}-legacy${tool}`, join(legacyDir, `${family}${tool}`));

  type Run = { child: ChildProcess; logs: string[]; exited: Promise<number | null> };
  const running: Run[] = [];
  t.after(() => {
    for (const r of running) r.child.kill('SIGKILL');
  });
  /** The CLI as root with only `caps` in its bounding set (so in every set it or its children can get). */
  const start = (caps: string[], extra: string[] = [], legacy = false): Run => {
    const bounding = ['-all', ...caps.map((c) => `+${c}`)].join(',');
    const child = sb.spawnIn(node, 'env', [
      `PATH=${legacy ? `${legacyDir}:` : ''}${process.env['PATH'] ?? '/usr/sbin:/usr/bin:/sbin:/bin'}`,
      'setpriv',
      `--bounding-set=${bounding}`,
      '--inh-caps=-all',
      '--ambient-caps=-all',
      '--',
      process.execPath,
      PROXY_BIN,
      ...e2eProxyArgs(['--manifest', manifest.file]),
      '--state-file',
      '',
      ...extra,
    ]);
    const logs: string[] = [];
    for (const s of [child.stdout, child.stderr])
      createInterface({ input: s! }).on('line', (l) => logs.push(l));
    const run = {
      child,
      logs,
      exited: new Promise<number | null>((r) => child.once('exit', (code) => r(code))),
    };
    running.push(run);
    return run;
  };
  const stop = async (run: Run) => {
    run.child.kill('SIGTERM');
    return run.exited;
  };
  /** Kills whatever a failed subtest left running, so the next one starts on free ports. */
  const reap = async () => {
    for (const r of running) {
      if (r.child.exitCode === null && r.child.signalCode === null) {
        r.child.kill('SIGKILL');
        await r.exited;
      }
    }
  };
  const services = async () => {
    const r = await nodeAgent.get('http://127.0.0.1:10249/debug/services');
    return r.ok && r.status === 200 ? (JSON.parse(r.body ?? '[]') as DebugServicePort[]) : undefined;
  };
  const capEff = async (pid: number) =>
    parseEffectiveCapabilities(await readFile(`/proc/${pid}/status`, 'utf8'))!;
  const healthz = async () => (await nodeAgent.get('http://127.0.0.1:10256/healthz')).status;

  await t.test('NET_ADMIN only (nft backend): rules written, traffic flows', async () => {
    const run = start(['net_admin']);
    await eventually(async () => (await services())?.length === 1, {
      what: `the proxy; ${run.logs.join('\n')}`,
    });
    await eventually(async () => (await pod.tcp(CLUSTER_IP, 80, 300)).data === 'pod0', { what: 'traffic' });
    const caps = await capEff(run.child.pid!);
    assert.equal(caps, 1n << BigInt(CAP_NET_ADMIN), `CapEff ${caps.toString(16)}`);
    // The rules are in before the sync that wrote them reports to health: allow that moment.
    await eventually(async () => (await healthz()) === 200, { what: 'healthz 200' });
    const warned = run.logs.some((l) => l.includes('Cannot set oom_score_adj'));
    t.diagnostic(
      `NET_ADMIN only: CapEff ${caps.toString(16).padStart(16, '0')}, serving, healthz 200` +
        `${warned ? '; --oom-score-adj not applied (needs SYS_RESOURCE), warned' : ''}`,
    );
    assert.equal(await stop(run), 0);
    assert.equal((await runProxyOnce(node, ['--cleanup'])).code, 0);
  });

  await reap();
  await t.test('without NET_ADMIN: exits at start with KUP_ERR_PERMISSION', async () => {
    const run = start([]);
    const code = await run.exited;
    const fatal = run.logs.find((l) => l.includes('KUP_ERR_PERMISSION')) ?? '';
    t.diagnostic(
      `no capability: exit code ${code}; ${JSON.parse(fatal || '{}').err?.message ?? run.logs.join('\n')}`,
    );
    assert.equal(code, 1);
    assert.match(fatal, /missing capability NET_ADMIN/);
  });

  await reap();
  await t.test('--no-iptables needs no capability', async () => {
    const run = start([], ['--no-iptables']);
    const s = await eventually(async () => (await services())?.length === 1, { what: 'the proxy' }).then(
      services,
    );
    const r = await nodeAgent.tcp('127.0.0.1', s![0]!.proxyPort);
    assert.equal(r.data, 'pod0');
    assert.equal(await capEff(run.child.pid!), 0n);
    assert.equal(await stop(run), 0);
  });

  await reap();
  await t.test('iptables-legacy: NET_ADMIN alone fails clearly, NET_ADMIN + NET_RAW works', async () => {
    const without = start(['net_admin'], [], true);
    await eventually(() => without.logs.some((l) => l.includes('"msg":"Sync failed"')), {
      what: `a failed sync; ${without.logs.join('\n')}`,
    });
    const failed = without.logs.find((l) => l.includes('"msg":"Sync failed"'))!;
    assert.match(failed, /Permission denied/);
    assert.equal(await healthz(), 503);
    assert.equal(await stop(without), 0);

    const withRaw = start(['net_admin', 'net_raw'], [], true);
    await eventually(async () => (await pod.tcp(CLUSTER_IP, 80, 300)).data === 'pod0', {
      what: `traffic through legacy rules; ${withRaw.logs.join('\n')}`,
    });
    // The legacy backend took the non-contiguous dispatch masks, and the traffic above went through them.
    const legacySave = (await sb.exec(node, join(legacyDir, 'iptables-save'), ['-c', '-t', 'nat'])).stdout;
    const counted = (line: RegExp) => Number(line.exec(legacySave)?.[1] ?? 0);
    const dispatch = counted(
      new RegExp(
        `\\n\\[(\\d+):\\d+\\] -A KUBE-PORTALS-CONTAINER -d 0\\.0\\.0\\.10/0\\.0\\.0\\.31 -j KUBE-PORTALS-CONTAINER-${CLUSTER_IP_SHARD}\\n`,
      ),
    );
    const portal = counted(
      new RegExp(`\\n\\[(\\d+):\\d+\\] -A KUBE-PORTALS-CONTAINER-${CLUSTER_IP_SHARD} -d ${CLUSTER_IP}/32 `),
    );
    assert.ok(
      dispatch > 0 && portal > 0,
      `legacy counters: dispatch ${dispatch}, portal ${portal}\n${legacySave}`,
    );
    const caps = await capEff(withRaw.child.pid!);
    assert.equal(caps, (1n << BigInt(CAP_NET_ADMIN)) | (1n << BigInt(CAP_NET_RAW)));
    t.diagnostic(
      `iptables-legacy: NET_ADMIN alone → "Sync failed" (${/Permission denied[^"]*/.exec(failed)?.[0]}), healthz 503; ` +
        'with NET_RAW too → rules written, traffic flows',
    );
    assert.equal(await stop(withRaw), 0);
  });
});
