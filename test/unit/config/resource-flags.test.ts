// The flags of the resource limits and the state file.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { DEFAULT_CONFIG } from '../../../src/config/config.ts';
import { parseArgs } from '../../../src/config/flags.ts';
import { isProxyError } from '../../../src/lib/errors.ts';

test('defaults: automatic TCP cap and UDP total, the default state file if writable', () => {
  assert.equal(DEFAULT_CONFIG.maxConnectionsPerService, -1);
  assert.equal(DEFAULT_CONFIG.udpMaxSessionsTotal, 0);
  assert.equal(DEFAULT_CONFIG.stateFile, undefined);
});

test('flags set them', async () => {
  const { config } = await parseArgs([
    '--manifest=m.yaml',
    '--max-connections-per-service=100',
    '--udp-max-sessions-total=5000',
    '--state-file=/tmp/kup/state.json',
  ]);
  assert.equal(config.maxConnectionsPerService, 100);
  assert.equal(config.udpMaxSessionsTotal, 5000);
  assert.equal(config.stateFile, '/tmp/kup/state.json');
  assert.equal((await parseArgs(['--manifest=m.yaml', '--state-file='])).config.stateFile, '');
});

const bad = [
  { name: 'negative cap', args: ['--max-connections-per-service=-1'], want: /--max-connections-per-service/ },
  {
    name: 'fractional cap',
    args: ['--max-connections-per-service=1.5'],
    want: /--max-connections-per-service/,
  },
  { name: 'negative UDP total', args: ['--udp-max-sessions-total=-5'], want: /--udp-max-sessions-total/ },
];
for (const c of bad) {
  test(`rejects ${c.name}`, async () => {
    await assert.rejects(parseArgs(['--manifest=m.yaml', ...c.args]), (err: Error) => {
      assert.match(err.message, c.want);
      return isProxyError(err, 'KUP_ERR_INVALID_FLAG');
    });
  });
}
