// parseRequestTarget: what path a request-target names, or none (a 400). Origin-form is a path only:
// nothing a client sends after the first '/' can name another host or throw.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parseRequestTarget } from '../../../src/server/request-target.ts';

const cases: {
  name: string;
  target: string | undefined;
  want: { path: string; search?: string } | undefined;
}[] = [
  { name: 'a path', target: '/healthz', want: { path: '/healthz' } },
  {
    name: 'a path and a query',
    target: '/debug/trace?limit=5',
    want: { path: '/debug/trace', search: '?limit=5' },
  },
  // new URL('//[', base) throws: this target crashed the process (issue 18, item 1).
  { name: '//[ is a path', target: '//[', want: { path: '//[' } },
  { name: '//host/x is a path, not a host', target: '//evil/healthz', want: { path: '//evil/healthz' } },
  { name: '/\\host/x is a path, not a host', target: '/\\evil/healthz', want: { path: '//evil/healthz' } },
  { name: 'dot segments resolve', target: '/a/../healthz', want: { path: '/healthz' } },
  { name: 'an escaped slash stays', target: '/..%2fmetrics', want: { path: '/..%2fmetrics' } },
  { name: 'a lone percent', target: '/%', want: { path: '/%' } },
  {
    name: 'bad escapes in the query',
    target: '/healthz?%zz=%ff',
    want: { path: '/healthz', search: '?%zz=%ff' },
  },
  { name: 'a fragment is dropped', target: '/healthz#x', want: { path: '/healthz' } },
  { name: 'a long path', target: `/${'a'.repeat(20_000)}`, want: { path: `/${'a'.repeat(20_000)}` } },
  { name: 'absolute-form', target: 'http://example/healthz?x=1', want: { path: '/healthz', search: '?x=1' } },
  { name: 'absolute-form, any case', target: 'HTTPS://example/livez', want: { path: '/livez' } },
  { name: 'absolute-form with a bad host', target: 'http://[/healthz', want: undefined },
  { name: 'absolute-form, another scheme', target: 'ftp://example/healthz', want: undefined },
  { name: 'asterisk-form', target: '*', want: undefined },
  { name: 'authority-form', target: 'localhost:10256', want: undefined },
  { name: 'a relative path', target: 'healthz', want: undefined },
  { name: 'empty', target: '', want: undefined },
  { name: 'none', target: undefined, want: undefined },
];

for (const c of cases) {
  test(c.name, () => {
    const url = parseRequestTarget(c.target);
    if (c.want === undefined) return assert.equal(url, undefined);
    assert.ok(url !== undefined);
    assert.equal(url.pathname, c.want.path);
    assert.equal(url.search, c.want.search ?? '');
    // The host is never the client's to choose in origin-form.
    if (c.target?.startsWith('/')) assert.equal(url.host, 'localhost');
  });
}

test('never throws, whatever the bytes', () => {
  let seed = 7;
  const next = () => {
    seed = (seed * 1_103_515_245 + 12_345) >>> 0;
    return seed;
  };
  for (let i = 0; i < 5000; i++) {
    let s = i % 2 === 0 ? '/' : i % 3 === 0 ? 'http://' : '';
    for (let n = next() % 30; n > 0; n--) s += String.fromCharCode(next() % 0x3000);
    parseRequestTarget(s);
  }
});
