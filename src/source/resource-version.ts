// A resourceVersion as the reflector's cache keeps it: opaque to clients, but in practice etcd's
// revision, a decimal number. Kept as a number when its text is exactly a number's (no sign, no
// leading zero, at most 15 digits: exact in a double), else as the string: a small integer takes no
// memory of its own, a larger one a 16-byte number, where the string was 24–32 bytes (two a Service).
// Pure: the same text always gives the same value, so equal values mean equal texts.

/** What the cache holds of a resourceVersion; undefined: the object had none. */
export type StoredVersion = string | number | undefined;

const DECIMAL = /^[1-9][0-9]{0,14}$/;

/** `rv` as the cache stores it. */
export function storedVersion(rv: string | undefined): StoredVersion {
  return rv !== undefined && DECIMAL.test(rv) ? Number(rv) : rv;
}

/** The text of a stored resourceVersion, as the API server sent it. */
export function versionText(stored: StoredVersion): string | undefined {
  return typeof stored === 'number' ? String(stored) : stored;
}
