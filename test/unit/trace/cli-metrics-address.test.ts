// The metrics server address of the `connections` and `trace` subcommands: --metrics-address or the
// proxy's own --metrics-bind-address, in every form the proxy's flag takes.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { isProxyError } from '../../../src/lib/errors.ts';
import { metricsUrl } from '../../../src/trace/cli.ts';

const good = [
  { name: 'default', input: {}, want: 'http://127.0.0.1:10249' },
  {
    name: 'IPv4 bind-all',
    input: { 'metrics-bind-address': '0.0.0.0:10249' },
    want: 'http://127.0.0.1:10249',
  },
  { name: 'IPv6 bind-all', input: { 'metrics-bind-address': '[::]:10249' }, want: 'http://[::1]:10249' },
  { name: 'a bare port', input: { 'metrics-bind-address': ':10250' }, want: 'http://127.0.0.1:10250' },
  { name: 'a bare IPv4', input: { 'metrics-bind-address': '127.0.0.1' }, want: 'http://127.0.0.1:10249' },
  { name: 'a bare IPv6', input: { 'metrics-bind-address': '::1' }, want: 'http://[::1]:10249' },
  { name: 'a bare bind-all', input: { 'metrics-bind-address': '::' }, want: 'http://[::1]:10249' },
  { name: 'a node IP', input: { 'metrics-bind-address': '10.0.0.5:9000' }, want: 'http://10.0.0.5:9000' },
  {
    name: '--metrics-address',
    input: { 'metrics-address': '0.0.0.0:10249' },
    want: 'http://127.0.0.1:10249',
  },
  {
    name: 'both, the same',
    input: { 'metrics-address': '127.0.0.1:1', 'metrics-bind-address': '127.0.0.1:1' },
    want: 'http://127.0.0.1:1',
  },
];
for (const c of good) test(`metricsUrl: ${c.name}`, () => assert.equal(metricsUrl(c.input), c.want));

const bad = [
  {
    name: 'both, different',
    input: { 'metrics-address': ':1', 'metrics-bind-address': ':2' },
    want: /not both/,
  },
  {
    name: 'empty (disabled)',
    input: { 'metrics-bind-address': '' },
    want: /--metrics-bind-address is empty/,
  },
  {
    name: 'a host name',
    input: { 'metrics-bind-address': 'localhost:10249' },
    want: /invalid --metrics-bind-address/,
  },
  { name: 'a bad port', input: { 'metrics-address': '127.0.0.1:99999' }, want: /invalid --metrics-address/ },
];
for (const c of bad)
  test(`metricsUrl rejects ${c.name}`, () =>
    assert.throws(
      () => metricsUrl(c.input),
      (err) => isProxyError(err, 'KUP_ERR_INVALID_FLAG') && c.want.test(err.message),
    ));
