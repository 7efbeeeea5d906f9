// The UDP addon's tap is one per process; its own file, so that no other test set it up first.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { type UdpFastCalls, udpTap } from '../../../src/relay/udp-fast.ts';

test('one tap per process: a second calls object (a wrapper of the addon) gets the first one, not a new array', () => {
  const arrays: Float64Array[] = [];
  const addon = {
    setupTap: (info: Float64Array) => {
      arrays.push(info);
      return Buffer.alloc(64);
    },
  } as unknown as UdpFastCalls;
  const wrapper = { ...addon };
  const first = udpTap(addon);
  assert.ok(first !== undefined);
  assert.equal(udpTap(wrapper), first);
  assert.equal(udpTap(addon), first);
  assert.equal(arrays.length, 1, 'the addon was given one entries array');
  assert.equal(first.info, arrays[0]);
});
