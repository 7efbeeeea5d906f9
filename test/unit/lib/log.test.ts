// Log lines are bounded and terminal-safe: an oversized string or list is cut with a note of its size
// (the 840 KB line a garbage manifest once gave), JSON lines keep exact values with no raw control
// characters, and the text format prints client bytes escaped.
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { test } from 'node:test';
import { ProxyError } from '../../../src/lib/errors.ts';
import { capLine, createLogger, MAX_LINE, sizeNote } from '../../../src/lib/log.ts';

/** A logger whose lines are kept. */
function capture(format: 'json' | 'text' = 'json') {
  const lines: string[] = [];
  const destination = new Writable({
    write(chunk, _enc, cb) {
      lines.push(chunk.toString());
      cb();
    },
  });
  return { log: createLogger({ format, destination }), lines };
}

// What the YAML parser said of a file of random bytes: the whole "token" quoted in the message.
const garbage = Buffer.alloc(353 * 1024, 0);
for (let i = 0; i < garbage.length; i++) garbage[i] = 0x20 + ((i * 7919) % 0x5e);
const GARBAGE_MESSAGE = `invalid manifest: /etc/kup/m.yaml:42:1: Unexpected scalar token in YAML stream: "${garbage.toString('latin1')}"`;

test('a 353 KB error message is cut to a bounded line with a note; the line stays JSON with its fields', () => {
  const { log, lines } = capture();
  log.fatal({ err: new ProxyError('KUP_ERR_MANIFEST_INVALID', GARBAGE_MESSAGE) }, 'Start failed');
  assert.equal(lines.length, 1);
  const line = lines[0]!;
  assert.ok(line.length <= MAX_LINE, `${line.length} chars`);
  assert.ok(line.endsWith('\n'));
  const rec = JSON.parse(line) as { msg: string; level: string; err: { code: string; message: string } };
  assert.deepEqual([rec.level, rec.msg, rec.err.code], ['fatal', 'Start failed', 'KUP_ERR_MANIFEST_INVALID']);
  assert.ok(rec.err.message.startsWith('invalid manifest: /etc/kup/m.yaml:42:1: Unexpected scalar token'));
  assert.match(rec.err.message, /…\(cut, 353 KB\)$/);
});

test('lines under the bound are written exactly as pino made them', () => {
  const { log, lines } = capture();
  const fields = { service: 'prod/shop:web', path: `/${'a'.repeat(30_000)}` };
  log.info(fields, 'Connection closed');
  const rec = JSON.parse(lines[0]!) as Record<string, unknown>;
  assert.equal(rec.path, fields.path);
  assert.equal(capLine('{"a":1}\n'), '{"a":1}\n');
});

test('a long list is cut to its first items with a count; a line of many small fields keeps its core', () => {
  const list = capLine(
    `${JSON.stringify({ level: 'info', msg: 'x', ids: Array.from({ length: 20_000 }, (_, i) => i) })}\n`,
  );
  const ids = (JSON.parse(list) as { ids: unknown[] }).ids;
  assert.equal(ids.length, 101);
  assert.equal(ids.at(-1), '…(cut, 19900 more)');
  const wide: Record<string, unknown> = { level: 'warn', time: 't', msg: 'Too wide', component: 'intake' };
  for (let i = 0; i < 20_000; i++) wide[`k${i}`] = i;
  const line = capLine(`${JSON.stringify(wide)}\n`);
  assert.ok(line.length <= MAX_LINE);
  const rec = JSON.parse(line) as Record<string, unknown>;
  assert.deepEqual(Object.keys(rec), ['level', 'time', 'component', 'msg', 'cut']);
  assert.match(rec.cut as string, /^the line was \d+ KB/);
  assert.equal(capLine(`not json ${'x'.repeat(MAX_LINE)}\n`).length <= MAX_LINE + 30, true);
  assert.deepEqual(
    [sizeNote(812), sizeNote(353 * 1024), sizeNote(1.25 * 1024 * 1024)],
    ['812 B', '353 KB', '1.3 MB'],
  );
});

const HOSTILE = '/\x1b]0;owned\x07\x1b[2J\x9b31m\u202eevil';

test('JSON lines: client bytes keep their exact value and no raw control character reaches the output', () => {
  const { log, lines } = capture();
  log.info({ path: HOSTILE }, 'Connection closed');
  assert.doesNotMatch(lines[0]!, /[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u202e]/);
  assert.equal((JSON.parse(lines[0]!) as { path: string }).path, HOSTILE);
});

test('text lines: client bytes are printed escaped, plain values bare', () => {
  const { log, lines } = capture('text');
  log.info({ path: HOSTILE, service: 'prod/shop:web', note: 'two words' }, `Closed ${HOSTILE}`);
  const line = lines[0]!;
  assert.doesNotMatch(line, /[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u202e]/);
  assert.match(line, /INFO {2}Closed \/\\x1b\]0;owned\\x07\\x1b\[2J\\x9b31m\\u\{202e\}evil /);
  assert.match(line, / path="\/\\u001b\]0;owned\\u0007\\u001b\[2J\\u009b31m\\u202eevil"/);
  assert.match(line, / service=prod\/shop:web note="two words"\n$/);
});
