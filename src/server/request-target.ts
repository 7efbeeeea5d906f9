// The request-target of an HTTP/1.1 request line (RFC 9112 §3.2), read as the health and metrics routes
// want it: a path and a query. Pure; never throws, whatever the client sent.

const BASE = 'http://localhost';
const ABSOLUTE_FORM = /^https?:\/\//i;

/**
 * The path and query of `target`, or undefined when it is not a target these servers answer (a 400).
 * Origin-form (`/path?query`) is read as a path only: `//host/x` and `/\host/x` are paths, never another
 * host, so `//[` is the path `//[` (a 404), not a URL that fails to parse. Absolute-form
 * (`http://host/path`) gives its path. Asterisk-form (`*`), authority-form (`host:port`) and anything
 * else give undefined.
 */
export function parseRequestTarget(target: string | undefined): URL | undefined {
  if (target === undefined || target === '') return undefined;
  try {
    // After the base's host, a target that starts with '/' can only add a path and a query.
    if (target.startsWith('/')) return new URL(BASE + target);
    if (ABSOLUTE_FORM.test(target)) return new URL(target);
  } catch {
    // An absolute-form target whose host does not parse (`http://[/`).
  }
  return undefined;
}
