// The bounds on what one list or watch may make the proxy hold (memory) or read (time): the API server,
// or whatever answers in its place, is not trusted to end what it sends. Each bound passed fails that list
// or watch with KUP_ERR_API_RESPONSE; the reflector retries with backoff and keeps what it had.

export type Limits = {
  /** Longest watch line (one event), in bytes; a longer one drops the watch. */
  maxLineBytes: number;
  /** Bytes of one list over all its pages (each page's body is read up to what is left). */
  maxListBytes: number;
  /** Bytes of one page, parsed in one piece: the most one answer makes us hold and parse at once. */
  maxPageBytes: number;
  /**
   * Values of one page (its `{`, `[` and `,` outside strings), counted as it is read, before it is parsed:
   * what parsing costs grows with them, not with the bytes.
   */
  maxPageValues: number;
  /** Objects of one list over all its pages, and of the watch cache it becomes. */
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
  // We ask for pages of 500 (client-go's pager): 500 Services are ~1.5 MB, 500 EndpointSlices of 100
  // endpoints ~13 MB. 32 MiB of real Services parse in 0.3 s to ~0.1 GB; the whole 256 MiB took 6.0 s, 1.3 GB.
  maxPageBytes: 32 * MiB,
  // A Service holds ~50 values, an EndpointSlice of 100 endpoints ~1,500: a page of 500 ≤ 0.75 M. 2 M
  // bounds a hostile page (1 M `{}` items) to what a full page of real objects costs (~0.35 s, ~0.1 GB);
  // 32 MiB of `{},` (11 M) took 3.7 s and 1.1 GB. Real objects run 12–25 bytes a value, so for them this
  // bound comes first past ~24–48 MiB: a page would have to average ~50 KB an object.
  maxPageValues: 2_000_000,
  // 50× the scalability limits' 10,000 Services; each object costs its JSON size again or more in the heap.
  maxListItems: 500_000,
  // 10,000 pages of 500; an API server fills every page but the last, so this only stops endless tokens.
  maxListPages: 10_000,
};
