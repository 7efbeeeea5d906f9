import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ProxyError } from '../../../src/lib/errors.ts';
import { silentLogger } from '../../../src/lib/log.ts';
import { JUMPS, type Jump } from '../../../src/netfilter/chains.ts';
import type { Iptables } from '../../../src/netfilter/iptables.ts';
import { IptablesPortals } from '../../../src/netfilter/iptables-portals.ts';
import { type FamilyConfig, Netfilter } from '../../../src/netfilter/netfilter.ts';
import { type RuleContext, renderRestoreInput } from '../../../src/netfilter/rules.ts';
import type { PortalSpec } from '../../../src/proxier/portal-programmer.ts';
import type { IPFamily, ServicePortKey } from '../../../src/state/service-port.ts';
import { portal } from '../../helpers/portals.ts';

/** An Iptables that records restores and fails the ones `failNext` says to. */
class FakeIptables implements Iptables {
  restores: { family: IPFamily; text: string }[] = [];
  missing: Jump[] = [];
  failNext: ((text: string) => boolean) | undefined;
  cleanups: IPFamily[] = [];
  jumpChecks = 0;
  /** What `save(family, 'nat')` returns; a family without text fails as iptables-save would. */
  saved: Partial<Record<IPFamily, string>> = {};

  async restore(family: IPFamily, text: string): Promise<void> {
    if (this.failNext?.(text)) {
      this.failNext = undefined;
      throw new ProxyError('KUP_ERR_IPTABLES_RESTORE', 'line 2 failed');
    }
    this.restores.push({ family, text });
  }
  async save(family: IPFamily, table: string): Promise<string> {
    const text = table === 'nat' ? this.saved[family] : '';
    if (text === undefined) throw new ProxyError('KUP_ERR_IPTABLES_SAVE', 'iptables-save exited with 1');
    return text;
  }
  async missingJumps(): Promise<Jump[]> {
    this.jumpChecks++;
    return this.missing;
  }
  async cleanup(family: IPFamily): Promise<void> {
    this.cleanups.push(family);
  }
  async flushConntrackUDP(): Promise<void> {}
  /**
   * Kinds of the restores since the last call: full (declares chains) or delta. A full restore of an
   * unknown state comes in two (container side, then the rest): counted once.
   */
  kinds(): string[] {
    const out: string[] = [];
    let half: IPFamily | undefined;
    for (const r of this.restores) {
      const container = /^:KUBE-PORTALS-CONTAINER /m.test(r.text);
      const host = /^:KUBE-PORTALS-HOST /m.test(r.text);
      if (host && !container && half === r.family) {
        half = undefined;
        continue;
      }
      half = container && !host ? r.family : undefined;
      out.push(`${r.family}:${container || host ? 'full' : 'delta'}`);
    }
    this.restores = [];
    return out;
  }
}

const v4: FamilyConfig = {
  family: 'IPv4',
  bindAddress: '0.0.0.0',
  hostIP: '192.168.1.5',
  nodePortAddresses: [],
};
const v6: FamilyConfig = { family: 'IPv6', bindAddress: '::', hostIP: 'fd00::5', nodePortAddresses: [] };
const a = portal('default', 'a', 'http', { clusterIPs: ['10.0.0.1', 'fd00::1'], proxyPort: 40001 });
const b = portal('default', 'b', 'http', { clusterIPs: ['10.0.0.2'], proxyPort: 40002 });

function setup(families: FamilyConfig[] = [v4]) {
  const iptables = new FakeIptables();
  const nf = new Netfilter({ iptables, log: silentLogger(), families });
  return { iptables, nf };
}

test('first sync is full with the missing jumps; then deltas with only the changed service', async () => {
  const { iptables, nf } = setup();
  iptables.missing = [...JUMPS];
  assert.ok(nf.needsFullSync('IPv4'));
  await nf.sync([a], { full: false });
  const [first] = iptables.restores;
  assert.match(first?.text ?? '', /-I PREROUTING 1 .* -j KUBE-PORTALS-CONTAINER/);
  assert.deepEqual(iptables.kinds(), ['IPv4:full']);
  assert.ok(!nf.needsFullSync('IPv4'));

  iptables.missing = [];
  await nf.sync([a, b], { full: false });
  const delta = iptables.restores[0]?.text ?? '';
  assert.deepEqual(iptables.kinds(), ['IPv4:delta']);
  assert.ok(delta.includes('default/b:http') && !delta.includes('default/a:http'), delta);
  // b's ClusterIP 10.0.0.2 is in shard 2: the delta appends to that shard chain only (and b's ACCEPT).
  assert.deepEqual(
    delta
      .split('\n')
      .filter((l) => l.startsWith('-'))
      .map((l) => l.split(' ').slice(0, 2).join(' ')),
    ['-A KUBE-PORTALS-CONTAINER-02', '-A KUBE-PORTALS-HOST-02', '-A KUBE-NODEPORT-NON-LOCAL'],
  );

  await nf.sync([a, b], { full: false });
  assert.deepEqual(iptables.kinds(), [], 'no change, no restore');
  await nf.sync([a, b], { full: true });
  assert.deepEqual(iptables.kinds(), ['IPv4:full']);
});

test('a failed delta falls back to a full restore in the same sync', async () => {
  const { iptables, nf } = setup();
  await nf.sync([a], { full: false });
  iptables.kinds();
  iptables.failNext = (text) => !/^:KUBE-PORTALS-CONTAINER /m.test(text);
  await nf.sync([b], { full: false });
  assert.deepEqual(iptables.kinds(), ['IPv4:full']);
  assert.ok(!nf.needsFullSync('IPv4'));
});

test('a failed full restore rejects and makes the next sync full', async () => {
  const { iptables, nf } = setup();
  await nf.sync([a], { full: false });
  iptables.kinds();
  iptables.failNext = () => true;
  await assert.rejects(nf.sync([a], { full: true }), { code: 'KUP_ERR_IPTABLES_RESTORE' });
  assert.ok(nf.needsFullSync('IPv4'));
  await nf.sync([a, b], { full: false });
  assert.deepEqual(iptables.kinds(), ['IPv4:full']);
});

test('a delta checks the jumps only when asked (checkJumps); a missing one then brings a full restore', async () => {
  const { iptables, nf } = setup();
  await nf.sync([a], { full: false });
  iptables.kinds();
  iptables.missing = [JUMPS[0]!];
  await nf.sync([a, b], { full: false });
  assert.deepEqual(iptables.kinds(), ['IPv4:delta']);
  await nf.sync([a], { full: false, checkJumps: true });
  // The jump check runs beside the delta (netfilter.ts): the delta goes out, then the full restore.
  const text = iptables.restores[1]?.text ?? '';
  assert.deepEqual(iptables.kinds(), ['IPv4:delta', 'IPv4:full']);
  assert.match(text, /-I OUTPUT 1 .* -j KUBE-PORTALS-HOST/);
});

test('a change of the node addresses inside --nodeport-addresses forces a full restore', async () => {
  const { iptables, nf } = setup([{ ...v4, nodePortAddresses: ['192.168.1.0/24'] }]);
  const np = portal('default', 'np', 'p', { clusterIPs: ['10.0.0.3'], nodePort: 30001, proxyPort: 40003 });
  await nf.sync([np], { full: false, localAddresses: ['192.168.1.5', '10.9.9.9'] });
  await nf.sync([np], { full: false, localAddresses: ['10.9.9.8', '192.168.1.5'] });
  await nf.sync([np], { full: false, localAddresses: ['192.168.1.6'] });
  assert.deepEqual(iptables.kinds(), ['IPv4:full', 'IPv4:full']);
});

test('the local detector is read at every sync; a change of it (NodeCIDR learnt late) forces a full restore', async () => {
  const iptables = new FakeIptables();
  let detector: { ifLocal: string; ifNotLocal: string } | undefined;
  const nf = new Netfilter({
    iptables,
    log: silentLogger(),
    families: [v4],
    localDetector: (family) => (family === 'IPv4' ? detector : undefined),
  });
  const lb = portal('default', 'lb', 'http', {
    clusterIPs: ['10.0.0.4'],
    loadBalancerIPs: ['198.51.100.4'],
    proxyPort: 40004,
    localProxyPort: 40005,
    externalPolicyLocal: true,
    endpoints: { local: true },
  });
  await nf.sync([lb], { full: false });
  assert.doesNotMatch(iptables.restores.map((r) => r.text).join(''), /-s 10\.244/);
  await nf.sync([lb], { full: false });
  assert.deepEqual(iptables.kinds(), ['IPv4:full']);
  detector = { ifLocal: '-s 10.244.0.0/16', ifNotLocal: '! -s 10.244.0.0/16' };
  await nf.sync([lb], { full: false });
  const text = iptables.restores.map((r) => r.text).join('');
  assert.deepEqual(iptables.kinds(), ['IPv4:full']);
  assert.match(text, /-d 198\.51\.100\.4\/32 -s 10\.244\.0\.0\/16 -j REDIRECT --to-ports 40004\n/);
  // A FamilyConfig detector is used when the deps give none.
  const fixed = setup([{ ...v4, localDetector: { ifLocal: '-i cbr0', ifNotLocal: '! -i cbr0' } }]);
  await fixed.nf.sync([lb], { full: false });
  assert.match(
    fixed.iptables.restores.map((r) => r.text).join(''),
    / -i cbr0 -j REDIRECT --to-ports 40004\n/,
  );
});

test('both families sync; one failing does not stop the other; cleanup covers both', async () => {
  const { iptables, nf } = setup([v4, v6]);
  iptables.failNext = (text) => text.includes('10.0.0.1/32');
  await assert.rejects(nf.sync([a, b], { full: true }), { code: 'KUP_ERR_IPTABLES_RESTORE' });
  assert.deepEqual(iptables.kinds(), ['IPv6:full']);
  assert.ok(nf.needsFullSync('IPv4'));
  assert.ok(!nf.needsFullSync('IPv6'));
  const v6text = restoresFor(iptables, async () => nf.sync([a, b], { full: true }), 'IPv6');
  assert.ok(!(await v6text).includes('default/b:http'), 'a v4-only service has no IPv6 rules');
  await nf.cleanup();
  assert.deepEqual(iptables.cleanups, ['IPv4', 'IPv6']);
  assert.ok(nf.needsFullSync('IPv4') && nf.needsFullSync('IPv6'));
});

async function restoresFor(
  iptables: FakeIptables,
  fn: () => Promise<void>,
  family: IPFamily,
): Promise<string> {
  iptables.restores = [];
  await fn();
  return iptables.restores
    .filter((r) => r.family === family)
    .map((r) => r.text)
    .join('');
}

test('syncs never overlap', async () => {
  const { iptables, nf } = setup();
  let inFlight = 0;
  let most = 0;
  const restore = iptables.restore.bind(iptables);
  iptables.restore = async (family, text) => {
    most = Math.max(most, ++inFlight);
    await new Promise((r) => setImmediate(r));
    inFlight--;
    return restore(family, text);
  };
  await Promise.all([nf.sync([a], { full: true }), nf.sync([a, b], { full: true }), nf.cleanup()]);
  assert.equal(most, 1);
});

/** An IptablesPortals over a FakeIptables whose `iptables-save -t nat` prints `saved`. */
function programmer(saved: Partial<Record<IPFamily, string>>, families: IPFamily[] = ['IPv4', 'IPv6']) {
  const iptables = new FakeIptables();
  iptables.saved = saved;
  return new IptablesPortals({
    netfilter: new Netfilter({ iptables, log: silentLogger(), families: [v4, v6] }),
    iptables,
    families,
    log: silentLogger(),
    hostInfo: () => ({ route4: '', route6: '', interfaces: {} }),
  });
}

const JUMP_COMMENT = '"handle ClusterIPs; NOTE: this must be before the NodePort rules"';

test('previousProxyPorts reads the container-side rules from the shard chains', async () => {
  // As iptables-save prints what this version writes: dispatch rules in the portal chains, portal rules
  // in the shard chains (10.0.0.10 → 0A, 10.0.0.20 → 14; fd00:96::3a → 1A).
  const nat4 = `# Generated by iptables-save v1.8.9 (nf_tables)
*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-PORTALS-CONTAINER - [0:0]
:KUBE-PORTALS-CONTAINER-0A - [0:0]
:KUBE-PORTALS-CONTAINER-14 - [0:0]
:KUBE-PORTALS-HOST - [0:0]
:KUBE-PORTALS-HOST-14 - [0:0]
-A PREROUTING -m comment --comment ${JUMP_COMMENT} -j KUBE-PORTALS-CONTAINER
-A OUTPUT -m comment --comment ${JUMP_COMMENT} -j KUBE-PORTALS-HOST
-A KUBE-PORTALS-CONTAINER -d 0.0.0.10/0.0.0.31 -j KUBE-PORTALS-CONTAINER-0A
-A KUBE-PORTALS-CONTAINER -d 0.0.0.20/0.0.0.31 -j KUBE-PORTALS-CONTAINER-14
-A KUBE-PORTALS-CONTAINER-0A -d 10.0.0.10/32 -p udp -m comment --comment "default/dns:dns" -m udp --dport 53 -j REDIRECT --to-ports 40001
-A KUBE-PORTALS-CONTAINER-14 -d 10.0.0.20/32 -p tcp -m comment --comment "default/web:http" -m tcp --dport 80 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-HOST -d 0.0.0.20/0.0.0.31 -j KUBE-PORTALS-HOST-14
-A KUBE-PORTALS-HOST-14 -d 10.0.0.20/32 -p tcp -m comment --comment "default/hostonly:x" -m tcp --dport 80 -j DNAT --to-destination 192.168.1.5:40999
COMMIT
`;
  const nat6 = `*nat
:PREROUTING ACCEPT [0:0]
:KUBE-PORTALS-CONTAINER - [0:0]
:KUBE-PORTALS-CONTAINER-1A - [0:0]
-A PREROUTING -m comment --comment ${JUMP_COMMENT} -j KUBE-PORTALS-CONTAINER
-A KUBE-PORTALS-CONTAINER -d ::1a/::1f -j KUBE-PORTALS-CONTAINER-1A
-A KUBE-PORTALS-CONTAINER-1A -d fd00:96::3a/128 -p tcp -m comment --comment "default/six:http" -m tcp --dport 80 -j DNAT --to-destination [fd00::9]:40003
COMMIT
`;
  assert.deepEqual(
    await programmer({ IPv4: nat4, IPv6: nat6 }).previousProxyPorts(),
    new Map([
      ['default/dns:dns/UDP', 40001],
      ['default/web:http/TCP', 40002],
      ['default/six:http/TCP', 40003],
    ]),
  );
  // A family whose iptables-save fails is skipped; the other still counts.
  assert.deepEqual(
    await programmer({ IPv6: nat6 }).previousProxyPorts(),
    new Map([['default/six:http/TCP', 40003]]),
  );
  assert.deepEqual(
    await programmer({ IPv4: nat4, IPv6: nat6 }, ['IPv6']).previousProxyPorts(),
    new Map([['default/six:http/TCP', 40003]]),
  );
});

test('previousProxyPorts still reads the rules an older version wrote into the portal chain itself', async () => {
  const nat = `*nat
:PREROUTING ACCEPT [0:0]
:KUBE-PORTALS-CONTAINER - [0:0]
:KUBE-PORTALS-HOST - [0:0]
:KUBE-NODEPORT-CONTAINER - [0:0]
-A PREROUTING -m comment --comment ${JUMP_COMMENT} -j KUBE-PORTALS-CONTAINER
-A KUBE-PORTALS-CONTAINER -d 10.0.0.10/32 -p udp -m comment --comment "default/dns:dns" -m udp --dport 53 -j REDIRECT --to-ports 40001
-A KUBE-PORTALS-CONTAINER -d 10.0.0.20/32 -p tcp -m comment --comment "default/web:http" -m tcp --dport 80 -j DNAT --to-destination 192.168.1.9:40002
-A KUBE-PORTALS-HOST -d 10.0.0.20/32 -p tcp -m comment --comment "default/hostonly:x" -m tcp --dport 80 -j DNAT --to-destination 192.168.1.5:40999
-A KUBE-NODEPORT-CONTAINER -p tcp -m comment --comment "default/nodeportonly:x" -m tcp --dport 30080 -j REDIRECT --to-ports 40998
COMMIT
`;
  assert.deepEqual(
    await programmer({ IPv4: nat }, ['IPv4']).previousProxyPorts(),
    new Map([
      ['default/dns:dns/UDP', 40001],
      ['default/web:http/TCP', 40002],
      ['default/nodeportonly:x/TCP', 40998],
    ]),
  );
});

test('previousProxyPorts: the local-list listener under `/local`, also when only NodePort rules name it', async () => {
  // What this version writes for an ETP Local service (pods short-circuited to the cluster listener
  // 40002, the rest to the local one 40003), and an ETP Local NodePort-only local listener (40005).
  const nat = `*nat
:KUBE-PORTALS-CONTAINER-01 - [0:0]
:KUBE-NODEPORT-CONTAINER - [0:0]
-A KUBE-PORTALS-CONTAINER-01 -s 10.244.0.0/16 -d 198.51.100.1/32 -p tcp -m comment --comment "default/lb:http" -m tcp --dport 80 -j REDIRECT --to-ports 40002
-A KUBE-PORTALS-CONTAINER-01 -d 198.51.100.1/32 -p tcp -m comment --comment "default/lb:http/local" -m tcp --dport 80 -j REDIRECT --to-ports 40003
-A KUBE-NODEPORT-CONTAINER -s 10.244.0.0/16 -p udp -m comment --comment "default/np:" -m udp --dport 30053 -j REDIRECT --to-ports 40004
-A KUBE-NODEPORT-CONTAINER -p udp -m comment --comment "default/np:/local" -m udp --dport 30053 -j REDIRECT --to-ports 40005
COMMIT
`;
  assert.deepEqual(
    await programmer({ IPv4: nat }, ['IPv4']).previousProxyPorts(),
    new Map([
      ['default/lb:http/TCP', 40002],
      ['default/lb:http/TCP/local', 40003],
      ['default/np:/UDP', 40004],
      ['default/np:/UDP/local', 40005],
    ]),
  );
});

// A model of iptables-restore --noflush on our chains (full restores declare and empty chains).
function applyRestore(model: Map<string, string[]>, text: string): void {
  let table = '';
  for (const line of text.split('\n')) {
    if (line.startsWith('*')) table = line.slice(1);
    else if (line.startsWith(':')) model.set(`${table} ${line.slice(1).split(' ')[0]}`, []);
    else if (line.startsWith('-A ') || line.startsWith('-D ') || line.startsWith('-I ')) {
      const [op, chain, ...rest] = line.split(' ');
      const key = `${table} ${chain}`;
      const rules = model.get(key) ?? [];
      model.set(key, rules);
      if (op === '-D') {
        const i = rules.indexOf(rest.join(' '));
        assert.ok(i >= 0, `-D of a missing rule: ${line}`);
        rules.splice(i, 1);
      } else rules.push(rest.join(' '));
    }
  }
}

function sorted(model: Map<string, string[]>): Map<string, string[]> {
  return new Map([...model].filter(([, r]) => r.length > 0).map(([k, r]) => [k, [...r].sort()]));
}

test('update(): deltas of the changed service ports only, the same rules as full restores', async () => {
  let seed = 7;
  const rand = (n: number) => {
    seed = (seed * 1103515245 + 12345) % 2 ** 31;
    return seed % n;
  };
  const { iptables, nf } = setup([v4, v6]);
  let current = new Map(
    Array.from({ length: 40 }, (_, i) => {
      const p = portal('ns', `s${i}`, 'p', {
        clusterIPs: [`10.0.${i}.1`, `fd00::${i + 1}`],
        proxyPort: 40000 + i,
      });
      return [p.servicePort.key, p] as const;
    }),
  );
  await nf.sync([...current.values()], { full: true });
  const models = { IPv4: new Map<string, string[]>(), IPv6: new Map<string, string[]>() };
  const applyAll = () => {
    for (const r of iptables.restores) applyRestore(models[r.family as 'IPv4' | 'IPv6'], r.text);
    iptables.restores = [];
  };
  applyAll();
  for (let round = 0; round < 30; round++) {
    const changed = new Map<ServicePortKey, PortalSpec | undefined>();
    const keys = [...current.keys()];
    for (let k = 0; k < 3; k++) {
      const key = keys[rand(keys.length)]!;
      const p = current.get(key);
      const choice = rand(3);
      if (p === undefined) continue;
      if (choice === 0) changed.set(key, undefined);
      else changed.set(key, { ...p, proxyPort: 30000 + rand(10000) });
    }
    const added = portal('ns', `new${round}`, 'p', {
      clusterIPs: [`10.9.${round}.${rand(255)}`],
      proxyPort: 41000 + round,
    });
    changed.set(added.servicePort.key, added);
    const next = new Map(current);
    for (const [key, p] of changed) {
      if (p === undefined) next.delete(key);
      else next.set(key, p);
    }
    let asked = 0;
    await nf.update(changed, () => {
      asked++;
      return [...next.values()];
    });
    assert.equal(asked, 0, `round ${round}: no full restore needed`);
    for (const r of iptables.restores) assert.doesNotMatch(r.text, /^:KUBE-/m, `round ${round}: a delta`);
    applyAll();
    // What the model holds now equals a fresh full restore of `next`.
    const fresh = setup([v4, v6]);
    await fresh.nf.sync([...next.values()], { full: true });
    const expected = { IPv4: new Map<string, string[]>(), IPv6: new Map<string, string[]>() };
    for (const r of fresh.iptables.restores) applyRestore(expected[r.family as 'IPv4' | 'IPv6'], r.text);
    assert.deepEqual(sorted(models.IPv4), sorted(expected.IPv4), `round ${round} IPv4`);
    assert.deepEqual(sorted(models.IPv6), sorted(expected.IPv6), `round ${round} IPv6`);
    current = next;
  }
});

test('update(): an unknown state or a failed delta restores everything from all()', async () => {
  const { iptables, nf } = setup();
  // Nothing applied yet: full.
  await nf.update(new Map([[a.servicePort.key, a]]), () => [a]);
  assert.deepEqual(iptables.kinds(), ['IPv4:full']);
  await nf.update(new Map([[b.servicePort.key, b]]), () => [a, b]);
  assert.deepEqual(iptables.kinds(), ['IPv4:delta']);
  // The kernel lost a rule: the delta's -D fails, the same update restores all.
  iptables.failNext = (text) => !/^:KUBE-/m.test(text);
  await nf.update(new Map([[b.servicePort.key, undefined]]), () => [a]);
  assert.deepEqual(iptables.kinds(), ['IPv4:full']);
  assert.doesNotMatch(iptables.restores.at(-1)?.text ?? '', /default\/b:http/);
  // Nothing that changes a rule: no restore at all.
  await nf.update(new Map([[a.servicePort.key, a]]), () => [a]);
  assert.deepEqual(iptables.kinds(), []);
});

test('an unknown state is restored in two: the container side first, then the rest; a known one in one', async () => {
  const { iptables, nf } = setup();
  iptables.missing = [...JUMPS];
  const np = portal('default', 'np', 'p', { clusterIPs: ['10.0.0.3'], nodePort: 30001, proxyPort: 40003 });
  await nf.sync([a, b, np], { full: true });
  const [first, second, ...more] = iptables.restores.map((r) => r.text);
  assert.equal(more.length, 0);
  // First: only the container-side chains (declared, dispatch, rules) and the PREROUTING jump into them.
  assert.match(first!, /^:KUBE-PORTALS-CONTAINER - /m);
  assert.match(first!, /^:KUBE-PORTALS-CONTAINER-01 - /m);
  assert.match(first!, /^-I PREROUTING 1 .*-j KUBE-PORTALS-CONTAINER$/m);
  assert.match(first!, /^-A KUBE-PORTALS-CONTAINER-01 .*--comment default\/a:http/m);
  assert.doesNotMatch(first!, /KUBE-PORTALS-HOST|KUBE-NODEPORT|^\*filter/m);
  // Second: everything else, without touching the container side.
  assert.doesNotMatch(second!, /KUBE-PORTALS-CONTAINER/);
  assert.match(second!, /^:KUBE-PORTALS-HOST - /m);
  assert.match(second!, /^-A KUBE-NODEPORT-CONTAINER .*--dport 30001/m);
  assert.match(second!, /^\*filter$/m);
  // Together: what one restore of the same portals writes.
  const split = new Map<string, string[]>();
  for (const t of [first!, second!]) applyRestore(split, t);
  // A known state (after that first sync) is restored in one piece, holding the same rules.
  iptables.restores = [];
  await nf.sync([a, b, np], { full: true });
  assert.equal(iptables.restores.length, 1);
  const one = new Map<string, string[]>();
  applyRestore(one, iptables.restores[0]!.text);
  assert.deepEqual(sorted(split), sorted(one));
});

test('previousProxyPorts reads back the listeners of external destinations (PROXY protocol) from rendered rules', async () => {
  // A LoadBalancer with an externalIP, an LB IP and a NodePort: each destination has a listener of its
  // own (`/to/<via>`); under externalTrafficPolicy Local the container side names the local-list ones
  // (`/to/<via>/local`; the cluster-list ones serve the node only, and come from the state file).
  const base = {
    nodePort: 30080,
    externalIPs: ['203.0.113.7'],
    loadBalancerIPs: ['198.51.100.10'],
    proxyPort: 40000,
  };
  const cluster = portal('default', 'web', 'http', {
    ...base,
    clusterIPs: ['10.0.0.20'],
    portalPorts: new Map([
      ['203.0.113.7', { proxyPort: 40010, localProxyPort: 0 }],
      ['198.51.100.10', { proxyPort: 40020, localProxyPort: 0 }],
      ['node', { proxyPort: 40030, localProxyPort: 0 }],
    ]),
  });
  const local = portal('default', 'loc', 'http', {
    ...base,
    clusterIPs: ['10.0.0.21'],
    nodePort: 30081,
    externalIPs: ['203.0.113.8'],
    loadBalancerIPs: [],
    externalPolicyLocal: true,
    proxyPort: 41000,
    localProxyPort: 41001,
    endpoints: { any: true, cluster: true, local: true },
    portalPorts: new Map([
      ['203.0.113.8', { proxyPort: 41010, localProxyPort: 41011 }],
      ['node', { proxyPort: 41030, localProxyPort: 41031 }],
    ]),
  });
  const ctx: RuleContext = { ...v4, localAddresses: [] };
  const { nat } = renderRestoreInput({ ...ctx, portals: [cluster, local] });
  assert.deepEqual(
    await programmer({ IPv4: nat }, ['IPv4']).previousProxyPorts(),
    new Map([
      ['default/web:http/TCP', 40000],
      ['default/web:http/TCP/to/203.0.113.7', 40010],
      ['default/web:http/TCP/to/198.51.100.10', 40020],
      ['default/web:http/TCP/to/node', 40030],
      ['default/loc:http/TCP', 41000],
      ['default/loc:http/TCP/to/203.0.113.8/local', 41011],
      ['default/loc:http/TCP/to/node/local', 41031],
    ]),
  );
});
