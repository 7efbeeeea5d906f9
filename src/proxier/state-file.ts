// The proxy-port assignment kept across restarts (--state-file): a small JSON file of
// `ns/name:port/PROTO` → proxy port, read at start and rewritten atomically (temp file, fsync, rename,
// fsync of the directory) after syncs that opened or closed listeners. A missing file is a first start;
// a corrupt one is logged and ignored: the worst it can cost is new proxy ports.
import { constants } from 'node:fs';
import { access, mkdir, open, readFile, rename, rm, stat } from 'node:fs/promises';
import { dirname } from 'node:path';
import { DEFAULT_STATE_FILE } from '../config/config.ts';
import type { Logger } from '../lib/log.ts';

/** Larger than any real assignment (a few MB for 65535 service ports), small enough to read at once. */
const MAX_FILE_BYTES = 16 << 20;
const VERSION = 1;
/** `ns/name:port/PROTO` with the characters names can hold; anything else is not ours. */
// A service port's key, `/local` after it for its local-list listener (see localProxyPortKey).
const KEY = /^[a-z0-9.-]{1,253}\/[a-z0-9.-]{1,253}:[a-z0-9-]{0,63}\/(?:TCP|UDP|SCTP)(?:\/local)?$/;

/** The file's content: `{"version": 1, "proxyPorts": {"ns/name:port/TCP": 34567, ...}}`. */
export type StateFileContent = { version: number; proxyPorts: Record<string, number> };

/**
 * The proxy ports in a state file's text. Throws (with why) when the text is not a state file; entries
 * that are not a service port key with a port in 1-65535 are skipped and counted in `skipped`.
 */
export function parseStateFile(text: string): { ports: Map<string, number>; skipped: number } {
  const value: unknown = JSON.parse(text);
  if (typeof value !== 'object' || value === null || Array.isArray(value)) throw new Error('not an object');
  const { version, proxyPorts } = value as Partial<StateFileContent>;
  if (version !== VERSION) throw new Error(`unknown version ${JSON.stringify(version)}`);
  if (typeof proxyPorts !== 'object' || proxyPorts === null || Array.isArray(proxyPorts))
    throw new Error('proxyPorts is not an object');
  const ports = new Map<string, number>();
  let skipped = 0;
  for (const [key, port] of Object.entries(proxyPorts)) {
    if (KEY.test(key) && Number.isInteger(port) && port >= 1 && port <= 65535) ports.set(key, port);
    else skipped++;
  }
  return { ports, skipped };
}

/** The text of a state file for `ports` (keys sorted, so equal assignments give equal bytes). */
export function renderStateFile(ports: ReadonlyMap<string, number>): string {
  const proxyPorts: Record<string, number> = {};
  for (const key of [...ports.keys()].sort()) proxyPorts[key] = ports.get(key)!;
  return `${JSON.stringify({ version: VERSION, proxyPorts } satisfies StateFileContent, null, 1)}\n`;
}

/**
 * The state file to use: `configured` when given ('' = none; its directory is created), else the default
 * path when its directory exists and is writable (so a host or test without it writes nothing).
 */
export async function resolveStateFile(configured: string | undefined): Promise<string | undefined> {
  if (configured === '') return undefined;
  if (configured !== undefined) {
    await mkdir(dirname(configured), { recursive: true }).catch(() => {});
    return configured;
  }
  try {
    await access(dirname(DEFAULT_STATE_FILE), constants.W_OK);
    return DEFAULT_STATE_FILE;
  } catch {
    return undefined;
  }
}

/** Reads and writes one state file; writes are queued and coalesced (only the latest is written). */
export class StateFile {
  readonly path: string;
  readonly #log: Logger;
  #pending: ReadonlyMap<string, number> | undefined;
  #writing: Promise<void> | undefined;
  #lastText = '';
  #lastError = '';
  /** Successful writes (tests). */
  writes = 0;

  constructor(path: string, log: Logger) {
    this.path = path;
    this.#log = log;
  }

  /** The ports in the file; empty (and logged) when it is missing, unreadable or corrupt. */
  async load(): Promise<Map<string, number>> {
    let text: string;
    try {
      const { size } = await stat(this.path);
      if (size > MAX_FILE_BYTES) throw new Error(`${size} bytes, more than ${MAX_FILE_BYTES}`);
      text = await readFile(this.path, 'utf8');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT')
        this.#log.warn({ file: this.path, err }, 'Cannot read the state file, ignoring it');
      return new Map();
    }
    try {
      const { ports, skipped } = parseStateFile(text);
      if (skipped > 0)
        this.#log.warn({ file: this.path, skipped }, 'Ignoring invalid entries of the state file');
      this.#lastText = text;
      return ports;
    } catch (err) {
      this.#log.warn({ file: this.path, err }, 'Corrupt state file, ignoring it');
      return new Map();
    }
  }

  /**
   * Queues a write of `ports` (kept as given: pass a copy); a write already running is followed by one
   * with the latest ports. Returns at once: the text is rendered on a later turn of the event loop.
   */
  save(ports: ReadonlyMap<string, number>): void {
    this.#pending = ports;
    this.#writing ??= this.#drain().finally(() => {
      this.#writing = undefined;
    });
  }

  /** Resolves when every queued write is done (or failed and was logged). */
  async flush(): Promise<void> {
    while (this.#writing !== undefined) await this.#writing;
  }

  async #drain(): Promise<void> {
    // Not in the caller's turn (a sync's, right after its rules): 10,000 ports take ~5-10 ms to sort and
    // render, and connections that arrived meanwhile are accepted first.
    await new Promise((resolve) => setImmediate(resolve));
    while (this.#pending !== undefined) {
      const text = renderStateFile(this.#pending);
      this.#pending = undefined;
      if (text === this.#lastText) continue;
      try {
        await writeAtomically(this.path, text);
        this.#lastText = text;
        this.#lastError = '';
        this.writes++;
      } catch (err) {
        // Once per distinct failure (a read-only directory would otherwise log after every sync).
        const message = (err as Error).message;
        if (message !== this.#lastError)
          this.#log.warn({ file: this.path, err: message }, 'Cannot write the state file');
        this.#lastError = message;
      }
    }
  }
}

/** Writes `text` so that a crash leaves either the old file or the new one, never a mix. */
async function writeAtomically(path: string, text: string): Promise<void> {
  const tmp = `${path}.${process.pid}.tmp`;
  try {
    const file = await open(tmp, 'w', 0o600);
    try {
      await file.writeFile(text);
      await file.sync();
    } finally {
      await file.close();
    }
    await rename(tmp, path);
  } catch (err) {
    await rm(tmp, { force: true }).catch(() => {});
    throw err;
  }
  // The rename lives in the directory: sync it too, or a crash could bring the old file back.
  const dir = await open(dirname(path), 'r');
  try {
    await dir.sync();
  } finally {
    await dir.close();
  }
}
