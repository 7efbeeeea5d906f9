import assert from 'node:assert/strict';
import { test } from 'node:test';
import { storedVersion, versionText } from '../../../src/source/resource-version.ts';

test('a decimal resourceVersion is kept as a number, and gives back the same text', () => {
  for (const rv of ['1', '12345', '4294967296', '999999999999999']) {
    assert.equal(typeof storedVersion(rv), 'number', rv);
    assert.equal(versionText(storedVersion(rv)), rv);
  }
});

test('any other text stays a string: equal stored values mean equal texts', () => {
  for (const rv of ['0', '007', '-1', '+1', '1e3', '1.5', ' 1', '1234567890123456', 'abc', '']) {
    assert.equal(storedVersion(rv), rv, JSON.stringify(rv));
    assert.equal(versionText(storedVersion(rv)), rv);
  }
  assert.notEqual(storedVersion('7'), storedVersion('007'));
  assert.equal(storedVersion(undefined), undefined);
  assert.equal(versionText(undefined), undefined);
});
