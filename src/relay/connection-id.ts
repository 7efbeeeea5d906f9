// Connection ids: one counter for the process, shared by TCP connections and UDP sessions. A worker
// process (--workers) counts from its number times 2^40, so ids stay unique across the processes of one
// proxy (and exact: 16 workers × 2^40 stays far below 2^53).

/** The ids of one process: 2^40, a trillion connections. */
export const IDS_PER_PROCESS = 2 ** 40;

let nextId = 1;

/** Process-wide connection ids, increasing. */
export function nextConnectionId(): number {
  return nextId++;
}

/** Worker `n` (1, 2, …) counts from n × 2^40 + 1; the main process keeps 1, 2, … */
export function setConnectionIdBase(worker: number): void {
  nextId = worker * IDS_PER_PROCESS + 1;
}
