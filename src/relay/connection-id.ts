// Connection ids: one counter for the process, shared by TCP connections and UDP sessions.

let nextId = 1;

/** Process-wide connection ids, increasing. */
export function nextConnectionId(): number {
  return nextId++;
}
