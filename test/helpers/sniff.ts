// Helpers for the sniffer tests: record real client/server bytes on loopback, replay a conversation into a
// sniffer whole, split at every offset or byte by byte, and a seeded PRNG for fuzzing.
import net from 'node:net';
import type { AppInfo, Sniffer } from '../../src/trace/sniff/types.ts';

export type Step = { readonly from: 'client' | 'server'; readonly bytes: Buffer };

/** Feeds a conversation, each step as one chunk (or as `split` returns), all at the same time. */
export function replay(
  s: Sniffer,
  steps: readonly Step[],
  split: (b: Buffer) => Buffer[] = (b) => [b],
): AppInfo {
  for (const step of steps) {
    for (const part of split(step.bytes)) {
      if (s.done) break;
      // A copy that we scribble over afterwards: proves the sniffer keeps no reference to our chunks.
      const chunk = Buffer.from(part);
      if (step.from === 'client') s.onClientData(chunk, 1000);
      else s.onEndpointData(chunk, 1000);
      chunk.fill(0x7e);
    }
  }
  return s.info();
}

export const bytewise = (b: Buffer): Buffer[] =>
  Array.from({ length: b.length }, (_, i) => b.subarray(i, i + 1));

/** Merges consecutive chunks from the same side into one step. */
export function merge(steps: readonly Step[]): Step[] {
  const out: Step[] = [];
  for (const s of steps) {
    const last = out.at(-1);
    if (last?.from === s.from)
      out[out.length - 1] = { from: s.from, bytes: Buffer.concat([last.bytes, s.bytes]) };
    else out.push({ from: s.from, bytes: s.bytes });
  }
  return out;
}

/**
 * Asserts `make()` fed with the steps whole, split in two at every offset of every step, and one byte at a
 * time gives the same info() (via `check`, which gets the whole-feed info first).
 */
export function assertSplitInvariant(
  make: () => Sniffer,
  steps: readonly Step[],
  equal: (got: AppInfo, want: AppInfo, how: string) => void,
): AppInfo {
  const want = replay(make(), steps);
  equal(replay(make(), steps, bytewise), want, 'byte by byte');
  for (let k = 0; k < steps.length; k++) {
    const n = steps[k]!.bytes.length;
    for (let at = 1; at < n; at++) {
      const got = replay(make(), steps, (b) =>
        b === steps[k]!.bytes ? [b.subarray(0, at), b.subarray(at)] : [b],
      );
      equal(got, want, `step ${k} split at ${at}`);
    }
  }
  return want;
}

/** The conversation cut after its first `upTo` bytes (a truncated capture). */
export function truncated(steps: readonly Step[], upTo: number): Step[] {
  const out: Step[] = [];
  let left = upTo;
  for (const s of steps) {
    if (left <= 0) break;
    out.push({ from: s.from, bytes: s.bytes.subarray(0, left) });
    left -= s.bytes.length;
  }
  return out;
}

/** mulberry32: small, seeded, good enough for fuzzing. */
export function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export function randomBytes(rand: () => number, n: number): Buffer {
  const b = Buffer.allocUnsafe(n);
  for (let i = 0; i < n; i++) b[i] = Math.floor(rand() * 256);
  return b;
}

/** A copy of `b` with a few random bytes changed, inserted or cut. */
export function mutate(rand: () => number, b: Buffer): Buffer {
  const out = Buffer.from(b);
  const edits = 1 + Math.floor(rand() * 4);
  for (let e = 0; e < edits && out.length > 0; e++) {
    const at = Math.floor(rand() * out.length);
    const kind = rand();
    if (kind < 0.6) out[at] = Math.floor(rand() * 256);
    else if (kind < 0.8) out[at] = rand() < 0.5 ? 0 : 0xff;
    else return Buffer.concat([out.subarray(0, at), out.subarray(at + 1 + Math.floor(rand() * 8))]);
  }
  return out;
}

/** Splits b into random chunks. */
export function randomChunks(rand: () => number, b: Buffer): Buffer[] {
  const out: Buffer[] = [];
  for (let i = 0; i < b.length; ) {
    const n = 1 + Math.floor(rand() * Math.min(64, b.length - i));
    out.push(b.subarray(i, i + n));
    i += n;
  }
  return out;
}

function listen(server: net.Server): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve((server.address() as net.AddressInfo).port));
  });
}

/**
 * Runs `drive(port)` against a recording TCP proxy in front of 127.0.0.1:targetPort and returns what
 * went by, in arrival order. Everything it opened is closed before it returns.
 */
export async function recordConversation(
  targetPort: number,
  drive: (port: number) => Promise<void>,
): Promise<Step[]> {
  const steps: Step[] = [];
  const sockets = new Set<net.Socket>();
  const proxy = net.createServer((client) => {
    const upstream = net.connect(targetPort, '127.0.0.1');
    sockets.add(client).add(upstream);
    client.on('data', (d) => {
      steps.push({ from: 'client', bytes: Buffer.from(d) });
      upstream.write(d);
    });
    upstream.on('data', (d) => {
      steps.push({ from: 'server', bytes: Buffer.from(d) });
      client.write(d);
    });
    client.on('end', () => upstream.end());
    upstream.on('end', () => client.end());
    client.on('error', () => upstream.destroy());
    upstream.on('error', () => client.destroy());
  });
  const port = await listen(proxy);
  try {
    await drive(port);
  } finally {
    for (const s of sockets) s.destroy();
    await new Promise<void>((resolve) => proxy.close(() => resolve()));
  }
  return steps;
}

/**
 * Accepts one connection, records what the client sends until `enough(bytes)` says so (or `deadlineMs`
 * passes), then destroys it. `connect(port)` starts the client; its errors are ignored.
 */
export async function captureClientBytes(
  connect: (port: number) => { destroy(): void },
  enough: (got: Buffer) => boolean,
  deadlineMs = 5000,
): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let client: { destroy(): void } | undefined;
  let timer: NodeJS.Timeout | undefined;
  const server = net.createServer();
  try {
    const port = await listen(server);
    const done = new Promise<Buffer>((resolve, reject) => {
      timer = setTimeout(() => reject(new Error('capture deadline passed')), deadlineMs);
      server.once('connection', (sock) => {
        sock.on('error', () => {});
        sock.on('data', (d) => {
          chunks.push(Buffer.from(d));
          const all = Buffer.concat(chunks);
          if (enough(all)) {
            sock.destroy();
            resolve(all);
          }
        });
      });
    });
    client = connect(port);
    return await done;
  } finally {
    clearTimeout(timer);
    client?.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}
