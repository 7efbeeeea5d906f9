import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  CAP_NET_ADMIN,
  CAP_NET_RAW,
  hasCapability,
  parseEffectiveCapabilities,
  parseFdLimits,
  readFdLimits,
  tcpConnectionCap,
  udpSessionCap,
} from '../../../src/proxier/process-limits.ts';

const LIMITS = `Limit                     Soft Limit           Hard Limit           Units
Max cpu time              unlimited            unlimited            seconds
Max open files            1024                 524288               files
Max locked memory         8388608              8388608              bytes
`;

test('parseFdLimits reads Max open files (soft, hard)', () => {
  assert.deepEqual(parseFdLimits(LIMITS), { soft: 1024, hard: 524288 });
  assert.deepEqual(
    parseFdLimits(LIMITS.replace('1024                 524288', 'unlimited            unlimited')),
    {
      soft: Number.POSITIVE_INFINITY,
      hard: Number.POSITIVE_INFINITY,
    },
  );
  assert.equal(parseFdLimits('Max cpu time unlimited unlimited seconds\n'), undefined);
});

test('readFdLimits reads this process (Node raised the soft limit to the hard one)', () => {
  const limits = readFdLimits();
  assert.ok(limits !== undefined && limits.soft > 0 && limits.soft <= limits.hard, JSON.stringify(limits));
});

test('parseEffectiveCapabilities and hasCapability', () => {
  const status = 'Name:\tnode\nCapInh:\t0000000000000000\nCapEff:\t0000000000001000\n';
  const caps = parseEffectiveCapabilities(status)!;
  assert.ok(hasCapability(caps, CAP_NET_ADMIN));
  assert.ok(!hasCapability(caps, CAP_NET_RAW));
  assert.ok(hasCapability(parseEffectiveCapabilities('CapEff:\t000001ffffffffff\n')!, CAP_NET_RAW));
  assert.equal(parseEffectiveCapabilities('Name:\tnode\n'), undefined);
});

const caps = [
  { name: 'configured wins', configured: 500, limits: { soft: 100, hard: 100 }, want: 500 },
  { name: 'auto: half the soft limit', configured: 0, limits: { soft: 20000, hard: 20000 }, want: 10000 },
  { name: 'auto: at least 1024', configured: 0, limits: { soft: 256, hard: 4096 }, want: 1024 },
  { name: 'auto: at most 65536', configured: 0, limits: { soft: 1048576, hard: 1048576 }, want: 65536 },
  {
    name: 'auto: unlimited',
    configured: 0,
    limits: { soft: Number.POSITIVE_INFINITY, hard: Number.POSITIVE_INFINITY },
    want: 65536,
  },
  { name: 'auto: unknown limit', configured: 0, limits: undefined, want: 32768 },
];
for (const c of caps)
  test(`udpSessionCap: ${c.name}`, () => assert.equal(udpSessionCap(c.configured, c.limits), c.want));

const tcpCaps = [
  { name: 'configured wins', configured: 500, limits: { soft: 100, hard: 100 }, want: 500 },
  { name: '0 is no cap', configured: 0, limits: { soft: 1024, hard: 1024 }, want: 0 },
  {
    name: 'auto: an eighth of the soft limit',
    configured: -1,
    limits: { soft: 1048576, hard: 1048576 },
    want: 131072,
  },
  { name: 'auto: at least 64', configured: -1, limits: { soft: 256, hard: 256 }, want: 64 },
  {
    name: 'auto: unlimited is no cap',
    configured: -1,
    limits: { soft: Number.POSITIVE_INFINITY, hard: Number.POSITIVE_INFINITY },
    want: 0,
  },
  { name: 'auto: unknown limit', configured: -1, limits: undefined, want: 8192 },
];
for (const c of tcpCaps)
  test(`tcpConnectionCap: ${c.name}`, () => assert.equal(tcpConnectionCap(c.configured, c.limits), c.want));
