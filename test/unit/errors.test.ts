import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { ERROR_CODES, isProxyError, ProxyError } from '../../src/lib/errors.ts';

test('every error code is documented in docs/errors.md', () => {
  const doc = readFileSync(new URL('../../docs/errors.md', import.meta.url), 'utf8');
  for (const code of ERROR_CODES)
    assert.ok(doc.includes(`\`${code}\``), `${code} missing from docs/errors.md`);
});

test('ProxyError carries its code and cause', () => {
  const cause = new Error('inner');
  const err = new ProxyError('KUP_ERR_LISTEN', 'cannot listen', { cause });
  assert.equal(err.code, 'KUP_ERR_LISTEN');
  assert.equal(err.cause, cause);
  assert.ok(isProxyError(err, 'KUP_ERR_LISTEN'));
  assert.ok(!isProxyError(err, 'KUP_ERR_MANIFEST_INVALID'));
});
