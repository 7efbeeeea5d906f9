// The layers of src/: every import between folders must be one the table allows, and no file may reach
// itself through imports. Reads the sources as text (static `import`/`export ... from` and `import()`).
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, normalize, relative } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const SRC = fileURLToPath(new URL('../../src/', import.meta.url));

/**
 * What each folder of src/ may import besides itself, lowest first: lib/ is the leaf; the files at the
 * top of src/ (main.ts, proxy-server.ts) build the parts and may import anything. A folder named with
 * files may import only those files of it (netfilter implements the proxier's portal contract).
 */
const ALLOWED: Record<string, readonly (string | { folder: string; files: readonly string[] })[]> = {
  lib: [],
  config: ['lib'],
  source: ['lib'],
  state: ['lib', 'config', 'source'],
  loadbalancer: ['lib', 'state'],
  relay: ['lib', 'state', 'loadbalancer'],
  trace: ['lib', 'config', 'state', 'relay'],
  proxier: ['lib', 'config', 'state', 'loadbalancer', 'relay'],
  netfilter: ['lib', 'config', 'state', { folder: 'proxier', files: ['portal-programmer.ts'] }],
  server: ['lib', 'config', 'state', 'relay', 'trace', 'proxier'],
  workers: ['lib', 'config', 'state', 'relay', 'trace', 'proxier'],
};

type Edge = { from: string; to: string; typeOnly: boolean };

function sourceFiles(dir: string): string[] {
  const out: string[] = [];
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) out.push(...sourceFiles(path));
    else if (entry.name.endsWith('.ts')) out.push(relative(SRC, path));
  }
  return out.sort();
}

const IMPORT = /^\s*(import|export)(\s+type)?\b[^'"]*?\bfrom\s+'(\.[^']+)'|\bimport\(\s*'(\.[^']+)'\s*\)/gm;

function importsOf(file: string): Edge[] {
  const text = readFileSync(join(SRC, file), 'utf8');
  const out: Edge[] = [];
  for (const m of text.matchAll(IMPORT)) {
    const spec = m[3] ?? m[4]!;
    out.push({ from: file, to: normalize(join(dirname(file), spec)), typeOnly: m[2] !== undefined });
  }
  return out;
}

function folderOf(file: string): string | undefined {
  const slash = file.indexOf('/');
  return slash < 0 ? undefined : file.slice(0, slash);
}

function allowed(from: string, to: string): boolean {
  const a = folderOf(from);
  const b = folderOf(to);
  if (a === undefined || a === b) return true;
  if (b === undefined) return false; // a folder importing main.ts or proxy-server.ts
  const rule = ALLOWED[a];
  if (rule === undefined) return false;
  return rule.some((r) =>
    typeof r === 'string' ? r === b : r.folder === b && r.files.includes(to.slice(b.length + 1)),
  );
}

const files = sourceFiles(SRC);
const edges = files.flatMap(importsOf);

test('every folder of src/ is in the layer table', () => {
  const folders = new Set(files.map(folderOf).filter((f) => f !== undefined));
  assert.deepEqual([...folders].sort(), Object.keys(ALLOWED).sort());
});

test('imports between folders follow the layer table', () => {
  const bad = edges.filter((e) => !allowed(e.from, e.to)).map((e) => `${e.from} -> ${e.to}`);
  assert.deepEqual(bad, []);
});

test('every import names a file that exists', () => {
  const known = new Set(files);
  assert.deepEqual(
    edges.filter((e) => !known.has(e.to)).map((e) => `${e.from} -> ${e.to}`),
    [],
  );
});

test('no import cycle, counting type-only imports too', () => {
  const next = new Map<string, string[]>();
  for (const e of edges) next.set(e.from, [...(next.get(e.from) ?? []), e.to]);
  const cycles: string[] = [];
  const state = new Map<string, 'open' | 'done'>();
  const stack: string[] = [];
  const visit = (file: string): void => {
    state.set(file, 'open');
    stack.push(file);
    for (const to of next.get(file) ?? []) {
      const s = state.get(to);
      if (s === 'open') cycles.push([...stack.slice(stack.indexOf(to)), to].join(' -> '));
      else if (s === undefined) visit(to);
    }
    stack.pop();
    state.set(file, 'done');
  };
  for (const f of files) if (!state.has(f)) visit(f);
  assert.deepEqual(cycles, []);
});

test('state/ imports only types from source/ (sources hand it checked objects through the intake)', () => {
  assert.deepEqual(
    edges
      .filter((e) => folderOf(e.from) === 'state' && folderOf(e.to) === 'source' && !e.typeOnly)
      .map((e) => `${e.from} -> ${e.to}`),
    [],
  );
});

test('lib/ imports nothing of the project but lib/', () => {
  assert.deepEqual(
    edges.filter((e) => folderOf(e.from) === 'lib' && folderOf(e.to) !== 'lib').map((e) => e.from),
    [],
  );
});
