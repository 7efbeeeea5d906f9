// The bounds on what one list or watch may make the proxy hold (memory) or read (time): the API server,
// or whatever answers in its place, is not trusted to end what it sends. Each bound passed fails that list
// or watch with KUP_ERR_API_RESPONSE; the reflector retries with backoff and keeps what it had.

export type Limits = {
  /** Longest watch line (one event), in bytes; a longer one drops the watch. */
  maxLineBytes: number;
  /** Bytes of one list over all its pages (each page's body is read up to what is left). */
  maxListBytes: number;
  /** Objects of one list over all its pages. */
  maxListItems: number;
  /** Pages (requests) of one list. */
  maxListPages: number;
};

const MiB = 1024 * 1024;

export const DEFAULT_LIMITS: Readonly<Limits> = {
  // etcd stores objects up to 1.5 MiB by default and kube-apiserver takes request bodies up to 3 MiB:
  // no real event comes near 8 MiB (client-go's streaming decoder stops at 16 MiB).
  maxLineBytes: 8 * MiB,
  // ~10× the largest lists kube-proxy reads (10,000 Services, 20,000 EndpointSlices: ~25 MB of JSON), and
  // under V8's longest string (~512 MiB), which a page's text must fit in to be parsed at all.
  maxListBytes: 256 * MiB,
  // 50× the scalability limits' 10,000 Services; each object costs its JSON size again or more in the heap.
  maxListItems: 500_000,
  // 10,000 pages of 500; an API server fills every page but the last, so this only stops endless tokens.
  maxListPages: 10_000,
};
