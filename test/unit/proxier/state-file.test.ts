import assert from 'node:assert/strict';
import { mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { test } from 'node:test';
import { createLogger } from '../../../src/lib/log.ts';
import { parseStateFile, renderStateFile, StateFile } from '../../../src/proxier/state-file.ts';

const good = new Map([
  ['default/web:http/TCP', 34567],
  ['kube-system/kube-dns:dns/UDP', 40001],
  ['default/plain:/TCP', 30000],
]);

test('render then parse gives the same ports, with sorted keys', () => {
  const text = renderStateFile(good);
  assert.deepEqual(parseStateFile(text), { ports: good, skipped: 0 });
  assert.equal(renderStateFile(new Map([...good].reverse())), text, 'deterministic');
  assert.ok(text.indexOf('default/plain') < text.indexOf('kube-system/'), 'sorted');
});

const corrupt = [
  { name: 'not JSON', text: '{"version": 1, "proxyPorts": {' },
  { name: 'an array', text: '[]' },
  { name: 'another version', text: '{"version": 2, "proxyPorts": {}}' },
  { name: 'ports not an object', text: '{"version": 1, "proxyPorts": [1, 2]}' },
  { name: 'empty', text: '' },
];
for (const c of corrupt) {
  test(`parse rejects ${c.name}`, () => assert.throws(() => parseStateFile(c.text)));
}

test('entries that are not a service port and a port are skipped', () => {
  const text = JSON.stringify({
    version: 1,
    proxyPorts: {
      'default/web:http/TCP': 1234,
      'default/web:http/TCP\n-A INPUT -j ACCEPT': 1,
      'default/web:"x"/TCP': 2,
      'default/zero:http/TCP': 0,
      'default/big:http/TCP': 70000,
      'default/frac:http/TCP': 1.5,
      'default/str:http/TCP': '80',
      'default/noproto:http': 80,
    },
  });
  const { ports, skipped } = parseStateFile(text);
  assert.deepEqual([...ports], [['default/web:http/TCP', 1234]]);
  assert.equal(skipped, 7);
});

async function setup(t: { after(fn: () => unknown): void }) {
  const dir = await mkdtemp(join(tmpdir(), 'kup-state-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const lines: string[] = [];
  const log = createLogger({
    destination: new Writable({
      write(chunk, _e, cb) {
        lines.push(String(chunk));
        cb();
      },
    }),
  });
  return { dir, file: join(dir, 'state.json'), lines, log };
}

test('a missing file is a first start: empty, nothing logged', async (t) => {
  const { file, lines, log } = await setup(t);
  assert.deepEqual(await new StateFile(file, log).load(), new Map());
  assert.deepEqual(lines, []);
});

test('save writes atomically (0600, no temp file left) and load reads it back', async (t) => {
  const { dir, file, log } = await setup(t);
  const state = new StateFile(file, log);
  state.save(good);
  await state.flush();
  assert.deepEqual(await new StateFile(file, log).load(), good);
  assert.equal((await stat(file)).mode & 0o777, 0o600);
  assert.deepEqual(await readdir(dir), ['state.json']);
});

test('saves are coalesced: only the latest of a burst is written, an unchanged one not at all', async (t) => {
  const { file, log } = await setup(t);
  const state = new StateFile(file, log);
  for (let i = 1; i <= 50; i++) state.save(new Map([['default/web:http/TCP', 30000 + i]]));
  await state.flush();
  assert.ok(state.writes <= 2, `${state.writes} writes for 50 saves`);
  assert.match(await readFile(file, 'utf8'), /30050/);
  const writes = state.writes;
  state.save(new Map([['default/web:http/TCP', 30050]]));
  await state.flush();
  assert.equal(state.writes, writes, 'same content, no write');
});

test('save returns before the ports are read: the caller does not render 10,000 of them', async (t) => {
  const { file, log } = await setup(t);
  const state = new StateFile(file, log);
  let reads = 0;
  const ports = new (class extends Map<string, number> {
    override keys() {
      reads++;
      return super.keys();
    }
  })(good);
  state.save(ports);
  assert.equal(reads, 0, 'not read in the call');
  await state.flush();
  assert.ok(reads > 0);
  assert.deepEqual(await state.load(), good);
});

test('a corrupt file is logged and ignored, then replaced by the next save', async (t) => {
  const { file, lines, log } = await setup(t);
  await writeFile(file, '{"version": 1, "proxyPorts": {"default/web:http/TCP": 12');
  const state = new StateFile(file, log);
  assert.deepEqual(await state.load(), new Map());
  assert.match(lines.join(''), /Corrupt state file, ignoring it/);
  state.save(good);
  await state.flush();
  assert.deepEqual(await state.load(), good);
});

test('a write that fails is logged once, and the proxy goes on', async (t) => {
  const { dir, lines, log } = await setup(t);
  const state = new StateFile(join(dir, 'missing-dir', 'state.json'), log);
  for (let i = 0; i < 3; i++) {
    state.save(new Map([['default/web:http/TCP', 30000 + i]]));
    await state.flush();
  }
  assert.equal(lines.filter((l) => l.includes('Cannot write the state file')).length, 1);
  assert.equal(state.writes, 0);
});
