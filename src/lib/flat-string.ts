// Strings kept for as long as a service port or an endpoint lives, written flat. V8 makes `a + b` and a
// template literal of 13 characters or more a rope, a node per `+` kept with the string: an
// `ns/name:port` took 98 bytes, its key 133, an `ip:port` 123. join writes one flat string (40).
// Imports nothing of the project.

/** `parts` written as one flat string. */
export function flat(...parts: readonly (string | number)[]): string {
  return parts.join('');
}
