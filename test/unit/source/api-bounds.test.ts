// The pure pieces that bound what the API server can cost us: the backoff manager (a quiet period, not a
// success, starts the count over), the watch line splitter (linear, bounded), the warning rate limit, the
// value count of a page before it is parsed, which bound a page passes, and snippets safe to print.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Response } from 'undici';
import { DEFAULT_LIMITS } from '../../../src/source/api-limits.ts';
import { readJson, snippet } from '../../../src/source/api-session.ts';
import { Backoff, backoffDelay } from '../../../src/source/backoff.ts';
import { JsonValueCounter } from '../../../src/source/json-values.ts';
import { pageBounds } from '../../../src/source/list-pager.ts';
import { LogLimiter } from '../../../src/source/log-limiter.ts';
import { LineSplitter } from '../../../src/source/watch-lines.ts';
import { collectGarbage } from '../../helpers/heap.ts';

test('Backoff: a 410 storm keeps counting through successful lists; a quiet period starts over', () => {
  const b = new Backoff({ initialMs: 800, maxMs: 30_000, resetMs: 120_000 });
  // One line per failure: [time of the failure, attempt it gets]. A list succeeds between each.
  const script: [number, number][] = [
    [0, 1], // first 410: relist at once
    [700, 2], // 410 again right after the fresh list
    [2_300, 3],
    [5_500, 4],
    [11_900, 5],
    [24_700, 6],
    [50_300, 7], // capped at 30 s from here
    [80_300, 8],
    [200_300, 1], // healthy for 2 min: starts over
    [200_400, 2],
  ];
  for (const [nowMs, want] of script) assert.equal(b.fail(nowMs), want, `at ${nowMs} ms`);
  assert.equal(
    b.delay(8, () => 0),
    30_000,
  );
  assert.equal(
    b.delay(2, () => 0),
    1_600,
  );
});

test('backoffDelay: doubles from initial, capped, jittered down by up to half', () => {
  const b = { initialMs: 100, maxMs: 1000 };
  assert.deepEqual(
    [1, 2, 3, 4, 5, 10, 1000].map((n) => backoffDelay(n, b, () => 0)),
    [100, 200, 400, 800, 1000, 1000, 1000],
  );
  assert.equal(
    backoffDelay(3, b, () => 1),
    200,
  );
  for (let i = 0; i < 100; i++) {
    const d = backoffDelay(3, b);
    assert.ok(d >= 200 && d <= 400, `${d}`);
  }
});

const split = (max: number, chunks: (string | Uint8Array)[]) => {
  const s = new LineSplitter(max);
  const lines: string[] = [];
  const ok = chunks.map((c) => s.push(typeof c === 'string' ? Buffer.from(c) : c, (l) => lines.push(l)));
  return { lines, ok, end: s.end(), pending: s.pendingBytes };
};

const euro = Buffer.from('€'); // 3 bytes: a chunk boundary may cut it
const cases = [
  { name: 'lines in one chunk', max: 100, chunks: ['a\nb\n'], lines: ['a', 'b'], ok: [true], end: '' },
  {
    name: 'a line over chunks',
    max: 100,
    chunks: ['{"a"', ':1}\n{"b"', ':2}'],
    lines: ['{"a":1}'],
    ok: [true, true, true],
    end: '{"b":2}',
  },
  {
    name: 'a character cut by a chunk boundary',
    max: 100,
    chunks: [euro.subarray(0, 1), Buffer.concat([euro.subarray(1), Buffer.from('\n')])],
    lines: ['€'],
    ok: [true, true],
    end: '',
  },
  { name: 'empty lines kept', max: 100, chunks: ['\n\nx\n'], lines: ['', '', 'x'], ok: [true], end: '' },
  {
    name: 'a line of exactly max',
    max: 4,
    chunks: ['ab', 'cd\n'],
    lines: ['abcd'],
    ok: [true, true],
    end: '',
  },
  { name: 'pending line over max', max: 4, chunks: ['ab', 'cde'], lines: [], ok: [true, false], end: '' },
  { name: 'complete line over max', max: 4, chunks: ['ok\nabcde\n'], lines: ['ok'], ok: [false], end: '' },
];
for (const c of cases) {
  test(`LineSplitter: ${c.name}`, () => {
    const got = split(c.max, c.chunks);
    assert.deepEqual(got.lines, c.lines);
    assert.deepEqual(got.ok, c.ok);
    assert.equal(got.end, c.end);
  });
}

test('LineSplitter: an endless line holds at most max bytes and costs linear time', () => {
  const chunk = Buffer.alloc(64 * 1024, 'a');
  const max = 8 * 1024 * 1024;
  const s = new LineSplitter(max);
  const started = performance.now();
  let pushes = 0;
  while (s.push(chunk, () => assert.fail('no line')) && pushes < 1000) pushes++;
  // 128 chunks fill 8 MiB; the 129th passes the bound, and nothing is held after it.
  assert.equal(pushes, 128);
  assert.equal(s.pendingBytes, 0);
  // Rescanning the whole line for each chunk took 0.33 s for 8 MiB, 5.2 s for 32, 92 s for 128.
  assert.ok(performance.now() - started < 200, `${performance.now() - started} ms`);
});

test('LogLimiter: burst per window and message, then the count of what was left out', () => {
  const l = new LogLimiter(2, 1000);
  // [time, message, what admit returns]
  const script: [number, string, number | undefined][] = [
    [0, 'a', 0],
    [1, 'a', 0],
    [2, 'a', undefined],
    [3, 'a', undefined],
    [4, 'b', 0], // its own budget
    [999, 'a', undefined],
    [1000, 'a', 3], // new window: the three left out are reported
    [1001, 'a', 0],
    [1002, 'a', undefined],
    [5000, 'a', 1],
  ];
  for (const [nowMs, msg, want] of script) assert.equal(l.admit(msg, nowMs), want, `${msg} at ${nowMs}`);
});

const counted = [
  { name: 'empty object', chunks: ['{}'], want: 1 },
  { name: 'a page of empty objects', chunks: ['{"items":[{},{},{}]}'], want: 7 },
  { name: 'numbers', chunks: ['[0,1,2]'], want: 3 },
  { name: 'commas and braces inside strings', chunks: ['{"a":"{[,,,]}"}'], want: 1 },
  { name: 'an escaped quote does not end the string', chunks: ['["a\\",{[", 1]'], want: 2 },
  { name: 'an escaped backslash does', chunks: ['["a\\\\",{}]'], want: 3 },
  { name: 'a string cut by a chunk boundary', chunks: ['["a,b', ',c",', '{}]'], want: 3 },
  { name: 'an escape cut by a chunk boundary', chunks: ['["a\\', '",{"]'], want: 1 },
];
for (const c of counted) {
  test(`JsonValueCounter: ${c.name}`, () => {
    const v = new JsonValueCounter();
    for (const chunk of c.chunks) v.push(Buffer.from(chunk));
    assert.equal(v.count, c.want);
  });
}

test('JsonValueCounter: real objects hold a value per 12 bytes or more; `{},` one per 1.5', () => {
  const endpoint = {
    addresses: ['10.244.1.23'],
    conditions: { ready: true, serving: true, terminating: false },
    nodeName: 'node-123',
    targetRef: { kind: 'Pod', namespace: 'default', name: 'web-7d4b9c8f6d-abcde', uid: crypto.randomUUID() },
    zone: 'zone-a',
  };
  const slice = {
    metadata: { name: 'web-abcde', namespace: 'default', labels: { 'kubernetes.io/service-name': 'web' } },
    addressType: 'IPv4',
    endpoints: Array.from({ length: 100 }, () => endpoint),
    ports: [{ name: 'http', port: 8080, protocol: 'TCP' }],
  };
  for (const text of [
    JSON.stringify({ items: Array(500).fill(slice) }),
    `{"items":[${'{},'.repeat(999)}{}]}`,
  ]) {
    const v = new JsonValueCounter();
    v.push(Buffer.from(text));
    const perValue = text.length / v.count;
    assert.ok(text.startsWith('{"items":[{}') ? perValue < 2 : perValue > 12, `${perValue} bytes a value`);
  }
});

test('pageBounds: the page bound or what is left of the list, named in the error', () => {
  const limits = { ...DEFAULT_LIMITS, maxListBytes: 100, maxPageBytes: 40, maxPageValues: 7 };
  const bound = (what: string) => new Error(what);
  const cases = [
    { name: 'first page', listed: 0, want: 40, message: /page 3 is over 40 bytes \(maxPageBytes\)/ },
    { name: 'exactly the page bound left', listed: 60, want: 40, message: /maxPageBytes/ },
    {
      name: 'less left than a page',
      listed: 90,
      want: 10,
      message: /more than 100 bytes \(maxListBytes\) by page 3/,
    },
  ];
  for (const c of cases) {
    const b = pageBounds(limits, c.listed, 3, bound);
    assert.equal(b.maxBytes, c.want, c.name);
    assert.equal(b.maxValues, 7);
    assert.match(b.exceeded('bytes').message, c.message, c.name);
    assert.match(b.exceeded('values').message, /page 3 holds more than 7 values \(maxPageValues\)/);
  }
});

test('snippet: quoted, whitespace folded, every control, bidi and line-breaking character escaped', () => {
  const hostile = '<h1>\u001b[31mred</h1>\u0085\u202e\u2066evil\u2069\u2028x\u2029\r\n\t y\u007f';
  const got = snippet(hostile);
  assert.equal(got, '"<h1>\\u001b[31mred</h1>\\u0085\\u202e\\u2066evil\\u2069 x y\\u007f"');
  assert.doesNotMatch(
    got,
    /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/,
  );
  assert.equal(typeof JSON.parse(got), 'string');
});

test("readJson: the body's bytes are not kept while it is read; a character split between chunks decodes", async () => {
  const text = JSON.stringify({
    items: Array.from({ length: 40 }, (_, i) => ({ name: `svc-${i}`, note: 'é€😀' })),
  });
  const bytes = Buffer.from(text, 'utf8');
  // Chunks of 7 bytes: the multi-byte characters land across chunk boundaries.
  const size = 7;
  const handed: WeakRef<Uint8Array>[] = [];
  let kept = 0;
  let offset = 0;
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      if (offset >= bytes.length) {
        // Every chunk handed over before this one: gone once read (not gathered for a join).
        await collectGarbage();
        kept = handed.filter((r) => r.deref() !== undefined).length;
        controller.close();
        return;
      }
      // A copy: a view of `bytes` would keep the whole buffer.
      const chunk = new Uint8Array(bytes.subarray(offset, offset + size));
      offset += size;
      handed.push(new WeakRef(chunk));
      controller.enqueue(chunk);
    },
  });
  const res = new Response(body, { headers: { 'content-type': 'application/json' } });
  const bounds = { maxBytes: 1 << 20, maxValues: 10_000, exceeded: () => new Error('bound') };
  const { value, bytes: read } = await readJson(res, new URL('http://api/x'), bounds, () => {});
  assert.deepEqual(value, JSON.parse(text));
  assert.equal(read, bytes.length);
  assert.ok(handed.length > 100);
  assert.ok(kept <= 2, `${kept} of ${handed.length} chunks still held while reading`);
});
