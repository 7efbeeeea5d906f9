// --oom-score-adj: a debug line where it cannot apply, a warning only where it should have worked.
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { test } from 'node:test';
import { createLogger } from '../../../src/lib/log.ts';
import { applyOomScoreAdj, expectedOomFailure, hasSysResource } from '../../../src/lib/oom-score-adj.ts';

const cases = [
  {
    name: 'no /proc',
    f: { value: -999, current: undefined, canLower: undefined, code: 'ENOENT' },
    expected: true,
  },
  { name: 'not root', f: { value: -999, current: 0, canLower: false, code: 'EACCES' }, expected: true },
  {
    name: 'root without CAP_SYS_RESOURCE',
    f: { value: -999, current: -997, canLower: false, code: 'EACCES' },
    expected: true,
  },
  {
    name: 'capabilities unknown',
    f: { value: -999, current: 0, canLower: undefined, code: 'EPERM' },
    expected: true,
  },
  {
    name: 'with CAP_SYS_RESOURCE',
    f: { value: -999, current: 0, canLower: true, code: 'EACCES' },
    expected: false,
  },
  {
    name: 'raising needs nothing',
    f: { value: 500, current: 0, canLower: false, code: 'EACCES' },
    expected: false,
  },
  { name: 'another error', f: { value: -999, current: 0, canLower: false, code: 'EIO' }, expected: false },
];
for (const c of cases)
  test(`expectedOomFailure: ${c.name}`, () =>
    assert.equal(expectedOomFailure(c.f) !== undefined, c.expected));

test('hasSysResource reads bit 24 of CapEff', () => {
  assert.equal(hasSysResource('Name:\tnode\nCapEff:\t000001ffffffffff\n'), true);
  assert.equal(hasSysResource('CapEff:\t000001fffeffffff\n'), false);
  assert.equal(hasSysResource('CapEff:\t0000000000000000\n'), false);
  assert.equal(hasSysResource('Name:\tnode\n'), undefined);
});

function capture() {
  const lines: Record<string, unknown>[] = [];
  const destination = new Writable({
    write(chunk, _enc, cb) {
      lines.push(JSON.parse(String(chunk)) as Record<string, unknown>);
      cb();
    },
  });
  return { log: createLogger({ level: 'debug', destination }), lines };
}

function files(current: string, capEff: string, writeError?: string) {
  const written: string[] = [];
  return {
    written,
    files: {
      read: (path: string) => (path.endsWith('oom_score_adj') ? current : `CapEff:\t${capEff}\n`),
      write: (_path: string, text: string) => {
        if (writeError !== undefined) throw Object.assign(new Error(writeError), { code: writeError });
        written.push(text);
      },
    },
  };
}

test('applyOomScoreAdj: written when it can be', () => {
  const { log, lines } = capture();
  const f = files('0\n', '000001ffffffffff');
  applyOomScoreAdj(-999, log, f.files);
  assert.deepEqual(f.written, ['-999']);
  assert.deepEqual(
    lines.map((l) => [l.level, l.msg]),
    [['debug', 'Set oom_score_adj']],
  );
});

test('applyOomScoreAdj: not root is one debug line, no warning', () => {
  const { log, lines } = capture();
  applyOomScoreAdj(-999, log, files('0\n', '0000000000000000', 'EACCES').files);
  assert.deepEqual(
    lines.map((l) => [l.level, l.msg, l.reason]),
    [['debug', 'Not setting oom_score_adj', 'lowering it needs CAP_SYS_RESOURCE']],
  );
});

test('applyOomScoreAdj: a failure with the capability is a warning', () => {
  const { log, lines } = capture();
  applyOomScoreAdj(-999, log, files('0\n', '000001ffffffffff', 'EACCES').files);
  assert.deepEqual(
    lines.map((l) => [l.level, l.msg]),
    [['warn', 'Cannot set oom_score_adj']],
  );
});

test('applyOomScoreAdj: already in place, nothing written', () => {
  const { log, lines } = capture();
  const f = files('-999\n', '0000000000000000', 'EACCES');
  applyOomScoreAdj(-999, log, f.files);
  assert.deepEqual(
    lines.map((l) => [l.level, l.msg]),
    [['debug', 'oom_score_adj already set']],
  );
});
