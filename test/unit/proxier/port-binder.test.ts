// The port binder with fake listeners: which port a service port binds, in what order ports are tried,
// and that the state file's ports win over other service ports' hashed starts.
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { test } from 'node:test';
import { createLogger } from '../../../src/lib/log.ts';
import { PortAllocator, type StartOffset } from '../../../src/proxier/port-allocator.ts';
import { PortBinder } from '../../../src/proxier/port-binder.ts';
import type { ListenerFactory, ServicePortListener } from '../../../src/proxier/service-port-listener.ts';
import type { ServicePortContext } from '../../../src/relay/service-context.ts';

/** Binds that fail with EADDRINUSE on `held` ports and on ports already bound; port 0 gets 50000+. */
function fakeListeners(held: Set<number>) {
  const bound = new Set<number>();
  const tried: number[] = [];
  let kernelPort = 50000;
  const factory: ListenerFactory = () => {
    let port = 0;
    const listener: ServicePortListener = {
      get port() {
        return port;
      },
      async listen(_host, want) {
        tried.push(want);
        if (want !== 0 && (held.has(want) || bound.has(want)))
          throw Object.assign(new Error(`listen EADDRINUSE ${want}`), { code: 'EADDRINUSE' });
        port = want === 0 ? kernelPort++ : want;
        bound.add(port);
      },
      async close() {
        bound.delete(port);
      },
      destroy() {
        bound.delete(port);
      },
      async drained() {},
      endpointsChanged: () => 0,
    };
    return listener;
  };
  return { factory, tried, bound };
}

function context(key: string): ServicePortContext {
  const slash = key.lastIndexOf('/');
  return { name: key.slice(0, slash), protocol: key.slice(slash + 1) } as unknown as ServicePortContext;
}

function binder(
  allocator: PortAllocator,
  preferred: Map<string, number>,
  held = new Set<number>(),
): { binder: PortBinder; tried: number[]; logs: Record<string, unknown>[] } {
  const fake = fakeListeners(held);
  const logs: Record<string, unknown>[] = [];
  const destination = new Writable({
    write(chunk, _enc, cb) {
      logs.push(JSON.parse(String(chunk)) as Record<string, unknown>);
      cb();
    },
  });
  const b = new PortBinder({
    allocator,
    listeners: fake.factory,
    preferredPorts: preferred,
    log: createLogger({ level: 'debug', destination }),
    host: () => '127.0.0.1',
  });
  return { binder: b, tried: fake.tried, logs };
}

const at =
  (offsets: Record<string, number>): StartOffset =>
  (key) =>
    offsets[key] ?? 0;

test('a service port binds on its hashed start; a collision takes the next port', async () => {
  const allocator = new PortAllocator({ base: 100, size: 10 }, at({ 'a/x:p/TCP': 3, 'a/y:p/TCP': 3 }));
  const { binder: b } = binder(allocator, new Map());
  assert.equal((await b.listen(context('a/x:p/TCP'), 'a/x:p/TCP')).port, 103);
  assert.equal((await b.listen(context('a/y:p/TCP'), 'a/y:p/TCP')).port, 104);
});

test('the state file wins: a port another service port used before is passed over by one that hashes onto it', async () => {
  // b sorts before c and starts first; its hashed start is c's port of the previous process.
  const allocator = new PortAllocator({ base: 100, size: 10 }, at({ 'ns/b:p/TCP': 5, 'ns/c:p/TCP': 1 }));
  const { binder: b } = binder(allocator, new Map([['ns/c:p/TCP', 105]]));
  assert.equal((await b.listen(context('ns/b:p/TCP'), 'ns/b:p/TCP')).port, 106);
  assert.equal((await b.listen(context('ns/c:p/TCP'), 'ns/c:p/TCP')).port, 105, 'c keeps its port');
});

test('ports the state file remembers are used when nothing else is left', async () => {
  const allocator = new PortAllocator({ base: 100, size: 2 }, at({}));
  const { binder: b } = binder(
    allocator,
    new Map([
      ['ns/gone:p/TCP', 100],
      ['ns/gone2:p/TCP', 101],
    ]),
  );
  assert.equal((await b.listen(context('ns/new:p/TCP'), 'ns/new:p/TCP')).port, 100);
});

test('plan() takes the state file port, else the hashed start, and listen() binds the planned port', async () => {
  const allocator = new PortAllocator({ base: 100, size: 10 }, at({ 'ns/a:p/TCP': 7 }));
  const { binder: b, tried } = binder(allocator, new Map([['ns/b:p/TCP', 102]]));
  assert.equal(b.plan('ns/a:p/TCP'), 107);
  assert.equal(b.plan('ns/b:p/TCP'), 102);
  assert.equal((await b.listen(context('ns/a:p/TCP'), 'ns/a:p/TCP', 107)).port, 107);
  assert.deepEqual(tried, [107]);
});

test('a port someone else holds: the scan moves on and warns (a configured range)', async () => {
  const allocator = new PortAllocator({ base: 100, size: 10 }, at({ 'ns/a:p/TCP': 2 }));
  const { binder: b, tried, logs } = binder(allocator, new Map(), new Set([102, 103]));
  assert.equal((await b.listen(context('ns/a:p/TCP'), 'ns/a:p/TCP')).port, 104);
  assert.deepEqual(tried, [102, 103, 104]);
  assert.equal(logs.filter((l) => l.level === 'warn' && l.port === 102).length, 1);
});

test('kernel-chosen over the ephemeral range: busy ports are passed over at debug, then the kernel chooses', async () => {
  const allocator = new PortAllocator({ base: 100, size: 3 }, at({}), { kernelChosen: true });
  const { binder: b, tried, logs } = binder(allocator, new Map(), new Set([100, 101, 102]));
  const bound = await b.listen(context('ns/a:p/TCP'), 'ns/a:p/TCP');
  assert.equal(bound.port, 50000);
  assert.deepEqual(tried, [100, 101, 102, 0]);
  assert.equal(logs.filter((l) => l.level === 'warn').length, 0, 'no warning');
  assert.equal(logs.filter((l) => l.msg === 'Proxy port in use, trying another').length, 3);
});

test('kernel-chosen: a remembered port outside the range is tried as it is; a failed one frees no other port', async () => {
  const allocator = new PortAllocator({ base: 100, size: 3 }, at({}), { kernelChosen: true });
  const preferred = new Map([
    ['ns/a:p/TCP', 9000],
    ['ns/b:p/TCP', 100],
  ]);
  const { binder: b, tried } = binder(allocator, preferred);
  assert.equal((await b.listen(context('ns/a:p/TCP'), 'ns/a:p/TCP')).port, 9000);
  assert.equal((await b.listen(context('ns/c:p/TCP'), 'ns/c:p/TCP')).port, 101, "100 is b's");
  assert.equal((await b.listen(context('ns/b:p/TCP'), 'ns/b:p/TCP')).port, 100);
  // d remembers c's port: its bind fails, the scan goes on, and c's port stays marked.
  preferred.set('ns/d:p/TCP', 101);
  assert.equal((await b.listen(context('ns/d:p/TCP'), 'ns/d:p/TCP')).port, 102);
  assert.deepEqual(tried.slice(-2), [101, 102]);
  assert.ok(!allocator.allocate(101), "c's port is still marked");
});
