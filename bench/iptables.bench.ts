// Times a full restore and a one-service delta at 1,000 and 10,000 service ports, with the real
// iptables-restore inside a network namespace this script creates and deletes. Prints; asserts nothing.
// Needs root. Run: node bench/iptables.bench.ts
import { performance } from 'node:perf_hooks';
import { silentLogger } from '../src/lib/log.ts';
import { JUMPS } from '../src/netfilter/chains.ts';
import { createIptables } from '../src/netfilter/iptables.ts';
import { Netfilter } from '../src/netfilter/netfilter.ts';
import { type RuleContext, renderDelta, renderRestoreInput, restoreText } from '../src/netfilter/rules.ts';
import type { PortalSpec } from '../src/proxier/portal-programmer.ts';
import { createSandbox } from '../test/helpers/netns.ts';
import { manyPortals, portal } from '../test/helpers/portals.ts';

const SIZES = [1_000, 10_000];
const ROUNDS = 5;

const flat: RuleContext = {
  family: 'IPv4',
  bindAddress: '0.0.0.0',
  hostIP: '192.168.50.2',
  nodePortAddresses: [],
  localAddresses: [],
};
/** As the proxy renders: KUBE-NODEPORT-NON-LOCAL accepts the allocator's whole range (manyPortals' ports). */
const ranged: RuleContext = { ...flat, listenerPorts: { base: 20000, size: 40000 } };
const LAYOUTS = [
  ['one ACCEPT for the listener port range', ranged],
  ['one ACCEPT per listener (before)', flat],
] as const;

async function time(fn: () => Promise<unknown> | unknown): Promise<number> {
  const start = performance.now();
  await fn();
  return performance.now() - start;
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[s.length >> 1] ?? Number.NaN;
}

function fmt(ms: number): string {
  return `${ms.toFixed(ms < 10 ? 2 : 0)} ms`.padStart(10);
}

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) {
    console.log('iptables bench: needs root (network namespaces); skipped');
    return;
  }
  const sandbox = await createSandbox();
  try {
    const ns = await sandbox.createNamespace('bench');
    const iptables = createIptables(sandbox.run(ns));
    const v = (await sandbox.exec(ns, 'iptables', ['--version'])).stdout.trim();
    console.log(`iptables bench (${v}), median of ${ROUNDS}`);
    console.log(
      'service ports | render full | restore full | render delta | restore delta | missingJumps | lines full/delta',
    );
    for (const [layout, ctx] of LAYOUTS)
      for (const n of SIZES) {
        const base = manyPortals(n);
        // One service changes its proxy port, back and forth, so every round is a real one-service delta.
        const changed = base.map((p, i) => (i === n >> 1 ? { ...p, proxyPort: p.proxyPort + 1 } : p));
        const full = restoreText(renderRestoreInput({ ...ctx, portals: base }, JUMPS));
        const delta = restoreText(renderDelta(base, changed, ctx));
        const back = restoreText(renderDelta(changed, base, ctx));
        await iptables.cleanup('IPv4');

        const renderFull: number[] = [];
        const restoreFull: number[] = [];
        const renderD: number[] = [];
        const restoreD: number[] = [];
        const check: number[] = [];
        for (let r = 0; r < ROUNDS; r++) {
          renderFull.push(await time(() => renderRestoreInput({ ...ctx, portals: base })));
          restoreFull.push(
            await time(() =>
              iptables.restore(
                'IPv4',
                r === 0 ? full : restoreText(renderRestoreInput({ ...ctx, portals: base })),
              ),
            ),
          );
          renderD.push(await time(() => renderDelta(base, changed, ctx)));
          restoreD.push(await time(() => iptables.restore('IPv4', delta)));
          await iptables.restore('IPv4', back);
          check.push(await time(() => iptables.missingJumps('IPv4')));
        }
        const lines = (s: string) => s.split('\n').length - 1;
        console.log(
          `${String(n).padStart(13)} |${fmt(median(renderFull))}  |${fmt(median(restoreFull))}   |${fmt(median(renderD))}   |${fmt(median(restoreD))}    |${fmt(median(check))}   | ${lines(full)}/${lines(delta)}`,
        );

        // The same through Netfilter: a full first sync, then a one-service delta sync.
        const nf = new Netfilter({
          iptables,
          log: silentLogger(),
          families: [
            {
              family: ctx.family,
              bindAddress: ctx.bindAddress,
              hostIP: ctx.hostIP,
              nodePortAddresses: [],
              listenerPorts: ctx.listenerPorts,
            },
          ],
        });
        const first = await time(() => nf.sync(base, { full: true }));
        const extra: PortalSpec = portal('bench', 'extra', 'http', {
          clusterIPs: ['10.200.0.1'],
          proxyPort: 20000 + n + 7,
        });
        const add = await time(() => nf.sync([...base, extra], { full: false }));
        const remove = await time(() => nf.sync(base, { full: false }));
        const checked = await time(() => nf.sync([...base, extra], { full: false, checkJumps: true }));
        console.log(
          `${''.padStart(13)}   ${layout}: Netfilter.sync: full ${fmt(first).trim()}, add one ${fmt(add).trim()}, ` +
            `remove one ${fmt(remove).trim()}, add one with the jump check ${fmt(checked).trim()}`,
        );
        await iptables.cleanup('IPv4');
      }
  } finally {
    sandbox.cleanup();
  }
}

await main();
