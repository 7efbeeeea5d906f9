// Reads a file a user names (the manifest, the --config file) so that it cannot hang the proxy: opened
// non-blocking, so that a FIFO without a writer does not park a thread-pool thread in open(2) (and with it
// every later read, reload and shutdown), and refused unless it is a regular file: a FIFO, socket or
// device has no end to wait for. I/O: this and nothing else.
import { closeSync, constants, fstatSync, openSync, readFileSync, type Stats } from 'node:fs';
import { open } from 'node:fs/promises';

/** The bytes of the regular file at `path` (symlinks followed). Throws a plain Error for anything else. */
export async function readRegularFile(path: string): Promise<Buffer> {
  const handle = await open(path, constants.O_RDONLY | constants.O_NONBLOCK);
  try {
    const stats = await handle.stat();
    if (!stats.isFile()) throw new Error(`not a regular file (${fileType(stats)}); refusing to read it`);
    return await handle.readFile();
  } finally {
    await handle.close();
  }
}

/** The same, synchronously: for what is read once at start, before anything serves (the kubeconfig). */
export function readRegularFileSync(path: string): Buffer {
  const fd = openSync(path, constants.O_RDONLY | constants.O_NONBLOCK);
  try {
    const stats = fstatSync(fd);
    if (!stats.isFile()) throw new Error(`not a regular file (${fileType(stats)}); refusing to read it`);
    return readFileSync(fd);
  } finally {
    closeSync(fd);
  }
}

function fileType(stats: Stats): string {
  if (stats.isFIFO()) return 'a FIFO';
  if (stats.isDirectory()) return 'a directory';
  if (stats.isSocket()) return 'a socket';
  if (stats.isCharacterDevice()) return 'a character device';
  if (stats.isBlockDevice()) return 'a block device';
  return 'not a file';
}
