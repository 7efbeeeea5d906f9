// The embedded default source: a manifest file (manifest-parse.ts) watched for changes. A broken file is
// reported once, with its location, and the last good state keeps serving. Changes (also editors that
// replace the file) are applied within a second, as the difference from the last good load, through the
// intake; a huge file is read, hashed, parsed and applied in slices of a few milliseconds, so the data path
// keeps its event loop. Only a regular file is read (a FIFO at the path would block a read forever).
import { createHash } from 'node:crypto';
import { type FSWatcher, watch as fsWatch, unwatchFile, watchFile } from 'node:fs';
import { basename, dirname, resolve } from 'node:path';
import { ProxyError } from '../lib/errors.ts';
import type { Logger } from '../lib/log.ts';
import { readRegularFile } from '../lib/read-regular-file.ts';
import { Yielder } from '../lib/yielder.ts';
import type { ProxyHandlers } from './handlers.ts';
import { Intake, isProxied, type Kind } from './intake.ts';
import {
  type DocumentCache,
  type Entry,
  MANIFEST_SLICE_MS,
  type ManifestObjects,
  parseManifestAsync,
} from './manifest-parse.ts';

export type ManifestOptions = {
  /** Wait this long after the last change event before reloading. */
  debounceMs?: number;
  /** Stat-poll interval, a fallback for file systems where fs.watch misses changes. */
  pollMs?: number;
  /** This node's name: a Node object with this name feeds onNodeUpdate. */
  nodeName?: string;
};

/**
 * A manifest file as ProxyHandlers events (through the intake): start() loads it or throws, then every
 * change is applied as the difference from the last good load; a bad file changes nothing.
 */
export class ManifestSource {
  readonly path: string;
  readonly #intake: Intake;
  readonly #log: Logger;
  readonly #debounceMs: number;
  readonly #pollMs: number;
  #current: ManifestObjects = new Map();
  readonly #documents: DocumentCache = new Map();
  #hash = '';
  #watcher: FSWatcher | undefined;
  #timer: NodeJS.Timeout | undefined;
  #loading: Promise<void> = Promise.resolve();
  #again = false;
  #stopped = false;
  // Abandons a load in progress at stop().
  readonly #abort = new AbortController();
  /** Number of successful loads that changed something, and of rejected ones (tests, metrics). */
  loads = 0;
  failures = 0;
  lastError: ProxyError | undefined;

  constructor(path: string, handlers: ProxyHandlers, log: Logger, options: ManifestOptions = {}) {
    this.path = resolve(path);
    this.#intake = new Intake(handlers, {
      warn: (msg, fields) => log.warn(fields, msg),
      nodeName: options.nodeName,
    });
    this.#log = log;
    this.#debounceMs = options.debounceMs ?? 100;
    this.#pollMs = options.pollMs ?? 500;
  }

  /**
   * Loads the file (throws if it is missing or invalid: at start there is no good state to keep),
   * reports the synced events, then watches for changes.
   */
  async start(): Promise<void> {
    const text = await this.#read();
    const objects = await this.#parse(text);
    await this.#apply(objects);
    this.#hash = await hash(text);
    this.#intake.synced('Service');
    this.#intake.synced('EndpointSlice');
    this.#watch();
  }

  /** Parses the file's bytes in slices, reusing the documents of the last parse that did not change. */
  #parse(text: Buffer) {
    return parseManifestAsync(text, this.path, MANIFEST_SLICE_MS, this.#documents, this.#abort.signal);
  }

  async #read(): Promise<Buffer> {
    try {
      return await readRegularFile(this.path);
    } catch (err) {
      throw new ProxyError(
        'KUP_ERR_MANIFEST_READ',
        `cannot read manifest ${this.path}: ${(err as Error).message}`,
        { cause: err },
      );
    }
  }

  #watch(): void {
    const name = basename(this.path);
    // Watch the directory, not the file: editors often write a new file and rename it over the old one.
    try {
      this.#watcher = fsWatch(dirname(this.path), { persistent: false }, (_event, file) => {
        if (file === null || file.toString() === name) this.#schedule();
      });
      this.#watcher.on('error', (err) => this.#log.warn({ err }, 'Manifest watch failed, polling only'));
    } catch (err) {
      this.#log.warn({ err }, 'Manifest watch failed, polling only');
    }
    watchFile(this.path, { interval: this.#pollMs, persistent: false }, () => this.#schedule());
  }

  #schedule(): void {
    if (this.#stopped) return;
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      this.reload();
    }, this.#debounceMs);
    this.#timer.unref();
  }

  /** Re-reads the file now. Resolves when applied or rejected; never throws. */
  reload(): Promise<void> {
    this.#again = true;
    this.#loading = this.#loading.then(async () => {
      while (this.#again && !this.#stopped) {
        this.#again = false;
        await this.#reloadOnce();
      }
    });
    return this.#loading;
  }

  async #reloadOnce(): Promise<void> {
    let text: Buffer;
    try {
      text = await this.#read();
    } catch (err) {
      this.#reject(err as ProxyError);
      return;
    }
    const h = await hash(text);
    if (h === this.#hash || this.#stopped) return;
    try {
      // A writer that truncates first (`cmd > file`, editors saving in place) shows an empty file for a
      // moment; applying it would delete every service. To mean "no objects": `{kind: List, items: []}`.
      if (isBlank(text))
        throw new ProxyError(
          'KUP_ERR_MANIFEST_INVALID',
          'invalid manifest: the file is empty (being written?)',
        );
      const objects = await this.#parse(text);
      this.#hash = h;
      await this.#apply(objects);
      this.lastError = undefined;
      this.loads++;
      this.#log.info({ file: this.path, objects: objects.size }, 'Manifest reloaded');
    } catch (err) {
      if (this.#stopped) return; // abandoned by stop()
      this.#hash = h;
      this.#reject(err as ProxyError);
    }
  }

  #reject(err: ProxyError): void {
    this.failures++;
    this.lastError = err;
    this.#log.error({ file: this.path, err }, 'Manifest rejected, keeping the last good state');
  }

  /**
   * Turns the difference between the current objects and `next` into handler events, a slice at a time.
   * A sync may run between slices, so the order keeps every intermediate state servable: slices before
   * the Services that use them (a new Service comes with its endpoints), Services deleted before their
   * slices (no Service is left without endpoints on the way out).
   */
  async #apply(next: ManifestObjects): Promise<void> {
    const prev = this.#current;
    this.#current = next;
    // Diffs over what the intake lets through, so that an object labelled for another proxy leaves in
    // the delete phase, in order, like any removed object.
    const isSelected = (e: Entry | undefined) =>
      e !== undefined && isProxied(e.kind, e.object) ? e : undefined;
    const yielder = new Yielder(MANIFEST_SLICE_MS);
    // Walked in place, a turn checked at every object: copying and filtering two 78,000-entry maps took
    // ~150 ms in one piece.
    for (const kinds of [['EndpointSlice', 'Node'], ['Service']] as const) {
      for (const [key, after] of next) {
        if (yielder.due) await yielder.turn();
        if (!(kinds as readonly Kind[]).includes(after.kind) || isSelected(after) === undefined) continue;
        const before = isSelected(prev.get(key));
        if (before === undefined) this.#intake.receive('add', after);
        else if (before.json !== after.json) this.#intake.receive('update', after, before.object);
      }
    }
    for (const kinds of [['Service'], ['EndpointSlice', 'Node']] as const) {
      for (const [key, before] of prev) {
        if (yielder.due) await yielder.turn();
        if (!(kinds as readonly Kind[]).includes(before.kind) || isSelected(before) === undefined) continue;
        if (isSelected(next.get(key)) === undefined) this.#intake.receive('delete', before);
      }
    }
  }

  /** The objects of the last good load. */
  get objects(): ManifestObjects {
    return this.#current;
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    this.#abort.abort();
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#watcher?.close();
    unwatchFile(this.path);
    await this.#loading;
  }
}

// Hashed a piece at a time: sha1 takes ~60 ms over 50 MB.
const HASH_CHUNK = 1024 * 1024;

async function hash(text: Buffer): Promise<string> {
  const h = createHash('sha1');
  const yielder = new Yielder(MANIFEST_SLICE_MS);
  for (let i = 0; i < text.length; i += HASH_CHUNK) {
    h.update(text.subarray(i, i + HASH_CHUNK));
    if (yielder.due) await yielder.turn();
  }
  return h.digest('hex');
}

function isBlank(text: Buffer): boolean {
  for (const c of text) if (c !== 0x20 && c !== 0x0a && c !== 0x0d && c !== 0x09) return false;
  return true;
}
