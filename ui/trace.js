// The live trace: follows /debug/trace (service and client filtered by the proxy, the rest here), keeps the
// last events in memory and shows the newest ones first; pause freezes the list while events keep coming
// in (and are counted), resume shows them. Reconnects with a back-off when the stream ends or is refused
// (at most 32 follow a proxy at once).
import { followTrace } from './api.js';
import { h, setText } from './dom.js';
import { eventMatches } from './filters.js';
import { clock, eventLine, printable } from './format.js';

const KEPT = 1000;
const SHOWN = 300;
const BACKLOG = 200;

export function tracePanel(filters, { onActivity }) {
  const list = document.getElementById('trace');
  const status = document.getElementById('trace-status');
  const pause = document.getElementById('trace-pause');
  const clear = document.getElementById('trace-clear');
  let events = [];
  let paused = false;
  let unseen = 0;
  let received = 0;
  let dropped = 0;
  let controller;
  let retryMs = 2000;
  let problem = '';
  let off = false;

  const say = () => {
    const base = off
      ? 'tracing is off on this proxy (--trace=none)'
      : problem || (paused ? `paused — ${unseen} new events not shown` : `following — ${received} events`);
    setText(
      status,
      dropped > 0 ? `${base}; ${dropped} dropped by the proxy (too many, or read too slowly)` : base,
    );
  };

  const item = (e) =>
    h(
      'li',
      { className: e.type === 'closed' ? 'closed' : e.type === 'dropped' ? 'note' : '' },
      h('span', { className: 't' }, clock(e.atMs)),
      e.type === 'dropped'
        ? `${e.count} events dropped by the proxy`
        : printable(`${e.service} ${e.client} → ${e.endpoint ?? '-'} ${eventLine(e)}`),
    );

  const visible = (e) => e.type === 'dropped' || eventMatches(e, filters.values);

  function renderAll() {
    const shown = [];
    for (let i = events.length - 1; i >= 0 && shown.length < SHOWN; i--)
      if (visible(events[i])) shown.push(item(events[i]));
    list.replaceChildren(...shown);
    unseen = 0;
    say();
  }

  function onEvent(e) {
    received++;
    if (e.type === 'dropped') dropped += e.count;
    if (e.type === 'opened' || e.type === 'closed') onActivity();
    events.push(e);
    if (events.length > KEPT) events = events.slice(-KEPT / 2);
    if (!visible(e)) return say();
    if (paused) unseen++;
    else {
      list.prepend(item(e));
      while (list.childElementCount > SHOWN) list.lastElementChild.remove();
    }
    say();
  }

  async function follow() {
    controller?.abort();
    const mine = new AbortController();
    controller = mine;
    const f = filters.values;
    for (;;) {
      try {
        problem = '';
        say();
        await followTrace(
          { service: f.service, client: f.client, limit: BACKLOG, follow: 'true' },
          onEvent,
          mine.signal,
        );
        retryMs = 2000;
        problem = 'the stream ended; reconnecting';
      } catch (err) {
        if (mine.signal.aborted) return;
        problem = `cannot follow the trace (${printable(err.message)}); retrying`;
        retryMs = Math.min(30_000, retryMs * 2);
      }
      if (mine.signal.aborted) return;
      say();
      await new Promise((r) => setTimeout(r, retryMs));
      if (mine.signal.aborted) return;
    }
  }

  pause.addEventListener('click', () => {
    paused = !paused;
    setText(pause, paused ? 'resume' : 'pause');
    if (!paused) renderAll();
    else say();
  });
  clear.addEventListener('click', () => {
    events = [];
    dropped = 0;
    renderAll();
  });

  return {
    start: follow,
    /** The filter bar changed: service or client → a new stream; the rest → the kept events again. */
    filtersChanged(f, before) {
      if (f.service !== before.service || f.client !== before.client) {
        events = [];
        renderAll();
        follow();
      } else if (!paused) renderAll();
    },
    /** The proxy traces nothing (--trace=none): say so instead of an empty list. */
    setOff(value) {
      off = value;
      say();
    },
  };
}
