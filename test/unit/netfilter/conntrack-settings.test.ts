import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { test } from 'node:test';
import { createLogger } from '../../../src/lib/log.ts';
import {
  applyConntrackSettings,
  NF_CONNTRACK_TCP_TIMEOUT_CLOSE_WAIT as CLOSE_WAIT,
  type ConntrackSettings,
  conntrackMax,
  conntrackWrites,
  NF_CONNTRACK_TCP_TIMEOUT_ESTABLISHED as ESTABLISHED,
  NF_CONNTRACK_HASHSIZE as HASHSIZE,
  NF_CONNTRACK_MAX as MAX,
  type Sysctl,
} from '../../../src/netfilter/conntrack-settings.ts';

// kube-proxy's defaults: 32768 per core, at least 131072, 24h, 1h.
const defaults: ConntrackSettings = {
  maxPerCore: 32768,
  min: 131072,
  tcpEstablishedTimeoutMs: 86_400_000,
  tcpCloseWaitTimeoutMs: 3_600_000,
};
const kernel = { max: 65536, hashsize: 16384, tcpEstablishedTimeout: 432000, tcpCloseWaitTimeout: 60 };

test('conntrackMax: per core, at least min; 0 leaves it', () => {
  assert.equal(conntrackMax(defaults, 2), 131072);
  assert.equal(conntrackMax(defaults, 8), 262144);
  assert.equal(conntrackMax({ ...defaults, maxPerCore: 0 }, 8), 0);
  assert.equal(conntrackMax({ ...defaults, min: 0 }, 1), 32768);
});

const cases: {
  name: string;
  settings?: Partial<ConntrackSettings>;
  cpus?: number;
  current?: Partial<typeof kernel> | Record<string, undefined>;
  want: [string, number][];
}[] = [
  {
    name: 'a stock kernel on 2 cores: raise max and hashsize, set both timeouts',
    want: [
      [MAX, 131072],
      [HASHSIZE, 32768],
      [ESTABLISHED, 86400],
      [CLOSE_WAIT, 3600],
    ],
  },
  {
    name: 'nothing to change',
    current: { max: 131072, hashsize: 32768, tcpEstablishedTimeout: 86400, tcpCloseWaitTimeout: 3600 },
    want: [],
  },
  {
    name: 'max is never lowered; the hash size is never lowered',
    current: { max: 1_000_000, hashsize: 262144, tcpEstablishedTimeout: 86400, tcpCloseWaitTimeout: 3600 },
    want: [],
  },
  {
    name: 'a big max with a small hash size: only the hash size',
    current: { max: 1_000_000, hashsize: 1024, tcpEstablishedTimeout: 86400, tcpCloseWaitTimeout: 3600 },
    want: [[HASHSIZE, 32768]],
  },
  {
    name: 'timeouts are set either way when they differ',
    settings: { maxPerCore: 0, tcpEstablishedTimeoutMs: 7_200_500, tcpCloseWaitTimeoutMs: 30_000 },
    current: { tcpEstablishedTimeout: 60, tcpCloseWaitTimeout: 3600 },
    want: [
      [ESTABLISHED, 7200],
      [CLOSE_WAIT, 30],
    ],
  },
  {
    name: 'zeros leave everything as it is',
    settings: { maxPerCore: 0, tcpEstablishedTimeoutMs: 0, tcpCloseWaitTimeoutMs: 0 },
    want: [],
  },
  {
    name: 'unreadable values: written, except the hash size (kube-proxy stops there)',
    current: {
      max: undefined,
      hashsize: undefined,
      tcpEstablishedTimeout: undefined,
      tcpCloseWaitTimeout: undefined,
    },
    cpus: 16,
    want: [
      [MAX, 524288],
      [ESTABLISHED, 86400],
      [CLOSE_WAIT, 3600],
    ],
  },
];
for (const c of cases)
  test(`conntrackWrites: ${c.name}`, () => {
    const writes = conntrackWrites({ ...defaults, ...c.settings }, c.cpus ?? 2, { ...kernel, ...c.current });
    assert.deepEqual(
      writes.map((w) => [w.path, w.value]),
      c.want,
    );
  });

/** A fake /proc/sys: values by path; `readOnly` paths reject writes with `code`. */
function fakeSysctl(values: Record<string, number>, readOnly: Record<string, string> = {}) {
  const writes: [string, number][] = [];
  const sysctl: Sysctl = {
    read: async (path) => values[path],
    write: async (path, value) => {
      const code = readOnly[path];
      if (code !== undefined) throw Object.assign(new Error(`${code}: cannot write ${path}`), { code });
      writes.push([path, value]);
      values[path] = value;
    },
  };
  return { sysctl, writes, values };
}

function logSink() {
  const lines: Record<string, unknown>[] = [];
  const destination = new Writable({
    write(chunk, _e, cb) {
      for (const l of String(chunk).split('\n')) if (l !== '') lines.push(JSON.parse(l));
      cb();
    },
  });
  return { log: createLogger({ level: 'info', destination }), lines };
}

test('applyConntrackSettings writes through the injected sysctl and logs each write; a second run writes nothing', async () => {
  const fake = fakeSysctl({
    [MAX]: 65536,
    [HASHSIZE]: 16384,
    [ESTABLISHED]: 432000,
    [CLOSE_WAIT]: 60,
  });
  const { log, lines } = logSink();
  const first = await applyConntrackSettings(defaults, { sysctl: fake.sysctl, log, cpuCount: 4 });
  assert.deepEqual(fake.writes, [
    [MAX, 131072],
    [HASHSIZE, 32768],
    [ESTABLISHED, 86400],
    [CLOSE_WAIT, 3600],
  ]);
  assert.equal(first.failed.length, 0);
  assert.equal(lines.filter((l) => l.msg === 'Set sysctl').length, 4);
  const second = await applyConntrackSettings(defaults, { sysctl: fake.sysctl, log, cpuCount: 4 });
  assert.deepEqual(second, { written: [], failed: [] });
});

test('a read-only /proc/sys is one clear warning per entry, never an error', async () => {
  const fake = fakeSysctl(
    { [MAX]: 65536, [HASHSIZE]: 65536, [ESTABLISHED]: 432000, [CLOSE_WAIT]: 3600 },
    { [MAX]: 'EROFS', [ESTABLISHED]: 'EACCES' },
  );
  const { log, lines } = logSink();
  const result = await applyConntrackSettings(defaults, { sysctl: fake.sysctl, log, cpuCount: 2 });
  assert.deepEqual(
    result.failed.map((w) => w.path),
    [MAX, ESTABLISHED],
  );
  const warnings = lines.filter((l) => l.level === 'warn');
  assert.equal(warnings.length, 2);
  for (const w of warnings) assert.match(String(w.msg), /read-only here \(common in containers\)/);
  assert.deepEqual(
    warnings.map((w) => w.code),
    ['EROFS', 'EACCES'],
  );
});
