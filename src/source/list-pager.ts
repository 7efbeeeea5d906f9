// One complete list of a collection, page by page (client-go's pager): follows continue tokens within the
// bounds (pages, objects, bytes of the list and of each page), and starts over once, paged, from a fresh
// snapshot when a token expires. Knows nothing of what the objects mean.
import { ProxyError } from '../lib/errors.ts';
import type { Limits } from './api-limits.ts';
import {
  apiError,
  type BodyBounds,
  describeUrl,
  get,
  isRecord,
  readJson,
  type Session,
} from './api-session.ts';

export type ListRequest = {
  path: string;
  labelSelector?: string;
  fieldSelector?: string;
  /** Objects per page; 0 lists in one response. */
  pageSize: number;
};

/** Every object of the collection and the resourceVersion to watch from. */
export type ListResult = { items: unknown[]; rv: string };

/**
 * Lists `request.path` completely. Fails with the API server's ApiError, or KUP_ERR_API_RESPONSE (naming
 * the URL) for an answer that is not a list or passes a bound in `limits`; a failed list holds nothing.
 */
export async function listAll(
  session: Session,
  request: ListRequest,
  limits: Limits,
  signal: AbortSignal,
  touch: () => void,
): Promise<ListResult> {
  const { path, labelSelector, fieldSelector } = request;
  const items: unknown[] = [];
  let bytes = 0;
  const limit = request.pageSize;
  let next: string | undefined;
  let restarted = false;
  for (let page = 1; ; page++) {
    const query = { labelSelector, fieldSelector, limit: limit > 0 ? limit : undefined, continue: next };
    const url = session.url(path, query);
    const bound = (what: string) =>
      new ProxyError('KUP_ERR_API_RESPONSE', `GET ${describeUrl(url)}: ${what}; the list is dropped`);
    if (page > limits.maxListPages) throw bound(`more than ${limits.maxListPages} pages (maxListPages)`);
    const res = await get(session, url, signal);
    touch();
    if (res.status === 410 && next !== undefined && !restarted) {
      // The continue token expired mid-list: start over (once). client-go's pager asks for the rest in
      // one piece; a fresh paged list is as consistent (a new snapshot) and keeps every page bounded.
      await res.body?.cancel();
      restarted = true;
      items.length = 0;
      bytes = 0;
      next = undefined;
      continue;
    }
    if (res.status !== 200) throw await apiError(res, url);
    const body = await readJson(res, url, pageBounds(limits, bytes, page, bound), touch);
    bytes += body.bytes;
    const list = body.value;
    if (!isRecord(list) || !Array.isArray(list.items)) throw bound('not a list (no items array)');
    if (items.length + list.items.length > limits.maxListItems) {
      throw bound(`more than ${limits.maxListItems} objects (maxListItems) after ${page} pages`);
    }
    for (const item of list.items) items.push(item);
    const meta = isRecord(list.metadata) ? list.metadata : {};
    const token = typeof meta.continue === 'string' && meta.continue !== '' ? meta.continue : undefined;
    if (token === undefined) {
      return { items, rv: typeof meta.resourceVersion === 'string' ? meta.resourceVersion : '' };
    }
    if (token === next) throw bound('the same continue token twice (the list does not advance)');
    next = token;
  }
}

/**
 * What page `page` may hold, `listed` bytes into the list: the page bound or what is left of the list's,
 * whichever is less, and the error that names the one it passes.
 */
export function pageBounds(
  limits: Limits,
  listed: number,
  page: number,
  bound: (what: string) => Error,
): BodyBounds {
  const left = limits.maxListBytes - listed;
  const pageBound = limits.maxPageBytes <= left;
  return {
    maxBytes: pageBound ? limits.maxPageBytes : left,
    maxValues: limits.maxPageValues,
    exceeded: (what) =>
      what === 'values'
        ? bound(`page ${page} holds more than ${limits.maxPageValues} values (maxPageValues), not parsed`)
        : pageBound
          ? bound(`page ${page} is over ${limits.maxPageBytes} bytes (maxPageBytes), not parsed`)
          : bound(`more than ${limits.maxListBytes} bytes (maxListBytes) by page ${page}`),
  };
}
