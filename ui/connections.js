// The live connection table: one page of /ui/api/connections with the filter bar's values, rows kept by
// connection id and updated in place; refreshed on a timer and as soon as the trace says something opened
// or closed.
import { getJson } from './api.js';
import { h, placeChildren, setProp, setText } from './dom.js';
import { bytes, connectionLine, duration, printable } from './format.js';

const PAGE = 100;

export function connectionsPanel(filters) {
  const tbody = document.querySelector('#connections-table tbody');
  const prev = document.getElementById('connections-prev');
  const next = document.getElementById('connections-next');
  const pageText = document.getElementById('connections-page');
  const countText = document.getElementById('connections-count');
  const rows = new Map();
  let offset = 0;
  let matched = 0;
  let refreshSoon = () => {};

  prev.addEventListener('click', () => {
    offset = Math.max(0, offset - PAGE);
    refreshSoon();
  });
  next.addEventListener('click', () => {
    if (offset + PAGE < matched) offset += PAGE;
    refreshSoon();
  });

  function render(body) {
    matched = body.matched.active + body.matched.recent;
    setText(
      countText,
      `— ${body.matched.active} active, ${body.matched.recent} recently closed${body.dropped ? ` (${body.dropped} older ones no longer kept)` : ''}`,
    );
    setText(
      pageText,
      matched === 0 ? 'none' : `${body.offset + 1}–${body.offset + body.rows.length} of ${matched}`,
    );
    setProp(prev, 'disabled', body.offset === 0);
    setProp(next, 'disabled', body.offset + PAGE >= matched);
    const nodes = [];
    const seen = new Set();
    for (const r of body.rows) {
      let row = rows.get(r.id);
      if (row === undefined) {
        row = connectionRow(r.id);
        rows.set(r.id, row);
      }
      seen.add(r.id);
      row.update(r);
      nodes.push(row.tr);
    }
    for (const id of rows.keys()) if (!seen.has(id)) rows.delete(id);
    if (nodes.length === 0)
      nodes.push(h('tr', {}, h('td', { colSpan: 9, className: 'muted' }, 'no connections match')));
    placeChildren(tbody, nodes);
  }

  return {
    setRefresh(fn) {
      refreshSoon = fn;
    },
    /** Back to the first page (the filters changed). */
    reset() {
      offset = 0;
    },
    async poll(signal) {
      const f = filters.values;
      const body = await getJson(
        'api/connections',
        {
          service: f.service,
          client: f.client,
          endpoint: f.endpoint,
          protocol: f.protocol,
          state: f.state,
          offset,
          limit: PAGE,
        },
        signal,
      );
      if (body.rows.length === 0 && offset > 0 && body.matched.active + body.matched.recent > 0) {
        offset = 0;
        return this.poll(signal);
      }
      render(body);
    },
  };
}

function connectionRow(id) {
  const cells = Array.from({ length: 9 }, () => h('td'));
  for (const i of [0, 6, 7]) cells[i].className = 'num';
  cells[8].className = 'wrap';
  const tr = h('tr', { className: 'row', dataset: { id: String(id) } }, ...cells);
  const set = (i, text) => setText(cells[i], text);
  return {
    tr,
    update(r) {
      set(0, r.id);
      set(1, r.service);
      set(2, r.app && r.app.protocol !== 'unknown' ? `${r.protocol}/${r.app.protocol}` : r.protocol);
      set(3, r.client);
      set(4, r.endpoint ?? '–');
      set(5, r.state === 'active' ? 'active' : (r.closeReason ?? 'closed'));
      set(6, duration(r.durationMs));
      set(7, `${bytes(r.bytesFromClient)} / ${bytes(r.bytesToClient)}`);
      set(8, connectionLine(r));
      setProp(tr, 'className', `row${r.state === 'closed' ? ' closed' : ''}`);
      setProp(cells[8], 'title', cells[8].textContent);
      setProp(cells[1], 'title', printable(r.service));
    },
  };
}
