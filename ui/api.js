// The console's requests to the proxy: the JSON endpoints under /ui/api and the /debug/trace stream, by
// URLs relative to the page (so they also work behind a path prefix).

/** GET `path?params` as JSON; throws an Error that says what failed. */
export async function getJson(path, params = {}, signal) {
  const url = new URL(path, document.baseURI);
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== '') url.searchParams.set(k, v);
  const res = await fetch(url, { signal, cache: 'no-store' });
  if (!res.ok) throw new Error(`${url.pathname}: HTTP ${res.status} ${(await res.text()).trim()}`);
  return res.json();
}

/**
 * Follows /debug/trace (NDJSON) with `params`, calling `onEvent` for each event; resolves when the stream
 * ends or `signal` aborts, throws on a refusal (HTTP status and the proxy's text).
 */
export async function followTrace(params, onEvent, signal) {
  const url = new URL('../debug/trace', document.baseURI);
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== '') url.searchParams.set(k, v);
  const res = await fetch(url, { signal, cache: 'no-store' });
  if (!res.ok) throw new Error(`HTTP ${res.status} ${(await res.text()).trim()}`);
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let rest = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    const lines = (rest + value).split('\n');
    rest = lines.pop();
    for (const line of lines) {
      if (line === '') continue;
      try {
        onEvent(JSON.parse(line));
      } catch {
        // Not JSON: skip the line, keep the stream.
      }
    }
  }
}
