import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { EventEmitter } from 'node:events';
import { test } from 'node:test';
import { DEFAULT_CONFIG } from '../../../src/config/config.ts';
import { silentLogger } from '../../../src/lib/log.ts';
import type { ToWorker } from '../../../src/workers/messages.ts';
import { WorkerPool, workerExecArgv } from '../../../src/workers/worker-pool.ts';

/** A child process that records what it is sent and exits when told to. */
class FakeChild extends EventEmitter {
  readonly sent: ToWorker[] = [];
  connected = true;
  exitCode: number | null = null;
  signalCode: NodeJS.Signals | null = null;
  static next = 1000;
  readonly pid = FakeChild.next++;
  send(msg: ToWorker): boolean {
    this.sent.push(msg);
    return true;
  }
  kill(signal: NodeJS.Signals = 'SIGTERM'): boolean {
    this.die(null, signal);
    return true;
  }
  die(code: number | null, signal: NodeJS.Signals | null): void {
    this.connected = false;
    this.exitCode = code;
    this.signalCode = signal;
    this.emit('exit', code, signal);
  }
}

function pool(children: FakeChild[], host = '0.0.0.0') {
  return new WorkerPool({
    count: 2,
    config: DEFAULT_CONFIG,
    log: silentLogger(),
    table: () => ({ t: 'table', full: true, servicePorts: [], endpoints: [], ports: [] }),
    listenHost: () => host,
    restartDelayMs: 10,
    fork: () => {
      const c = new FakeChild();
      children.push(c);
      return c as unknown as ChildProcess;
    },
  });
}

test('each worker is told where the main process listens (IPv4 where IPv6 is missing), then gets the whole table', () => {
  const children: FakeChild[] = [];
  pool(children, '0.0.0.0').start();
  assert.equal(children.length, 2);
  for (const [i, c] of children.entries()) {
    const [init, table] = c.sent;
    assert.equal(init?.t, 'init');
    assert.deepEqual(init?.t === 'init' && [init.id, init.processes, init.listenHost], [i + 1, 3, '0.0.0.0']);
    assert.equal(table?.t, 'table');
  }
});

test('a worker that dies is restarted with the table; the other is not touched; a drain stops them for good', async () => {
  const children: FakeChild[] = [];
  const p = pool(children);
  p.start();
  const [first, second] = children as [FakeChild, FakeChild];
  first.die(1, null);
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(children.length, 3, 'one new process');
  assert.equal(children[2]!.sent[0]?.t, 'init');
  assert.equal(second.sent.length, 2, 'the other worker was told nothing');
  const drained = p.drain(1000);
  for (const c of [second, children[2]!]) {
    assert.equal(c.sent.at(-1)?.t, 'drain');
    c.die(0, null);
  }
  await drained;
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(children.length, 3, 'nothing restarted after the drain');
});

test('workers start with --disable-sigusr1, or an inspector port of their own with KUP_INSPECTOR_SIGNAL=1', () => {
  assert.deepEqual(workerExecArgv(['--max-old-space-size=512'], {}), [
    '--max-old-space-size=512',
    '--disable-sigusr1',
  ]);
  // Not twice, and the main process's inspector port is not inherited (it holds 9229).
  assert.deepEqual(workerExecArgv(['--disable-sigusr1', '--inspect-port=9229'], {}), ['--disable-sigusr1']);
  assert.deepEqual(workerExecArgv(['--disable-sigusr1'], { KUP_INSPECTOR_SIGNAL: '1' }), [
    '--inspect-port=0',
  ]);
});
