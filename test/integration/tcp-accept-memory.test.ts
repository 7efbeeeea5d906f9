// What a native listener (native/tcp_listen.c) costs outside V8's heap: the process's anonymous memory
// (after full GCs and malloc_trim) less V8's own pages, over thousands of idle listeners on loopback.
// Each listener is a slot of the addon's epoll set: ~0.2 KiB here, where a uv_poll, an external and two
// Node-API references of its own cost ~0.75-0.9 KiB (what else counts here: V8's pooled pages, the
// listeners' garbage).
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { getHeapStatistics } from 'node:v8';
import { processMallocTrim } from '../../src/lib/malloc-trim.ts';
import { DEFAULT_TCP_OPTIONS, TcpListener } from '../../src/relay/tcp.ts';
import { processTcpAccept } from '../../src/relay/tcp-accept.ts';
import { collectGarbage } from '../helpers/heap.ts';
import { log, makeContext } from '../helpers/relay.ts';

const LISTENERS = 4000;

/** Anonymous memory of the process not in V8's heap pages, after full GCs and a trim, in bytes. */
async function outsideHeap(): Promise<number> {
  await collectGarbage();
  processMallocTrim().calls?.trim();
  const anonKiB = Number(/^RssAnon:\s+(\d+) kB/m.exec(readFileSync('/proc/self/status', 'utf8'))?.[1]);
  return anonKiB * 1024 - getHeapStatistics().total_physical_size;
}

test('an idle native listener costs under 400 bytes outside the heap', async (t) => {
  const tcpAccept = processTcpAccept();
  assert.ok(tcpAccept, 'build/native/tcp_listen.node (npm run build), and KUP_TCP_ACCEPT not off');
  const context = makeContext([]);
  const listeners = Array.from(
    { length: LISTENERS },
    () => new TcpListener(context, DEFAULT_TCP_OPTIONS, { log, tcpAccept }),
  );
  t.after(() => {
    for (const l of listeners) l.destroy();
  });
  // One listener first: what the first one sets up (the addon's set, its slots' first block) is not counted.
  await listeners[0]!.listen('127.0.0.1', 0);
  const before = await outsideHeap();
  for (const l of listeners.slice(1)) await l.listen('127.0.0.1', 0);
  const perListener = ((await outsideHeap()) - before) / (LISTENERS - 1);
  assert.ok(perListener < 400, `${perListener.toFixed(0)} bytes a listener`);
});
