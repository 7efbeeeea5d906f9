// The service port table: one page from /ui/api/services (searched, sorted and cut by the proxy, so 10,000
// ports cost 50 rows), each row updated in place; a click opens the port's endpoints and rate charts.
import { getJson } from './api.js';
import { rateCharts, sparkline } from './charts.js';
import { h, placeChildren, setProp, setText } from './dom.js';
import { bytes, perSecond, reasons } from './format.js';

const PAGE = 50;
const COLUMNS = 11;

/** The panel; `onShowConnections(service)` is called by the detail's button. */
export function servicesPanel({ onShowConnections }) {
  const tbody = document.querySelector('#services-table tbody');
  const search = document.getElementById('services-q');
  const sort = document.getElementById('services-sort');
  const prev = document.getElementById('services-prev');
  const next = document.getElementById('services-next');
  const pageText = document.getElementById('services-page');
  const countText = document.getElementById('services-count');
  const rows = new Map();
  let offset = 0;
  let matched = 0;
  let expanded;
  let detail;
  let refreshSoon = () => {};

  let searchTimer;
  search.addEventListener('input', () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => {
      offset = 0;
      refreshSoon();
    }, 250);
  });
  sort.addEventListener('change', () => {
    offset = 0;
    refreshSoon();
  });
  prev.addEventListener('click', () => {
    offset = Math.max(0, offset - PAGE);
    refreshSoon();
  });
  next.addEventListener('click', () => {
    if (offset + PAGE < matched) offset += PAGE;
    refreshSoon();
  });

  function toggle(key) {
    expanded = expanded === key ? undefined : key;
    if (detail !== undefined && detail.key !== expanded) {
      detail.destroy();
      detail = undefined;
    }
    refreshSoon();
  }

  function render(body) {
    matched = body.matched;
    setText(countText, `— ${body.total.toLocaleString()} in all`);
    setText(
      pageText,
      body.matched === 0
        ? 'none'
        : `${(body.offset + 1).toLocaleString()}–${Math.min(body.offset + body.items.length, body.matched).toLocaleString()} of ${body.matched.toLocaleString()}`,
    );
    setProp(prev, 'disabled', body.offset === 0);
    setProp(next, 'disabled', body.offset + PAGE >= body.matched);
    const nodes = [];
    const seen = new Set();
    for (const item of body.items) {
      let row = rows.get(item.key);
      if (row === undefined) {
        row = serviceRow(item.key, toggle);
        rows.set(item.key, row);
      }
      seen.add(item.key);
      row.update(item);
      setProp(row.tr, 'className', `row${item.error ? ' error' : ''}${item.key === expanded ? ' open' : ''}`);
      nodes.push(row.tr);
      if (item.key === expanded && body.detail !== undefined) {
        if (detail === undefined) detail = detailRow(item.key, onShowConnections);
        detail.update(body.detail, body.times);
        nodes.push(detail.tr);
      }
    }
    for (const key of rows.keys()) if (!seen.has(key)) rows.delete(key);
    placeChildren(tbody, nodes);
  }

  return {
    /** Called by the app with a function that schedules the next poll at once. */
    setRefresh(fn) {
      refreshSoon = fn;
    },
    async poll(signal) {
      const body = await getJson(
        'api/services',
        { q: search.value, sort: sort.value, offset, limit: PAGE, expand: expanded },
        signal,
      );
      // A search that left fewer pages than the one shown: back to the last one.
      if (body.items.length === 0 && body.matched > 0 && offset > 0) {
        offset = Math.floor((body.matched - 1) / PAGE) * PAGE;
        return this.poll(signal);
      }
      render(body);
    },
  };
}

function serviceRow(key, toggle) {
  const cells = Array.from({ length: COLUMNS }, () => h('td'));
  const canvas = h('canvas', { className: 'spark', width: 90, height: 18 });
  const rate = h('span');
  cells[7].append(canvas, ' ', rate);
  for (const i of [6, 8, 9]) cells[i].className = 'num';
  const tr = h('tr', { className: 'row', dataset: { key } }, ...cells);
  tr.addEventListener('click', () => toggle(key));
  const set = (i, text) => setText(cells[i], text);
  return {
    tr,
    update(s) {
      set(0, `${s.service} ${s.protocol}`);
      setProp(cells[0], 'title', s.error ? `${s.error.code}: ${s.error.message}` : s.key);
      set(1, s.clusterIPs.length === 0 ? '–' : `${s.clusterIPs.join(', ')}:${s.port}`);
      set(2, s.nodePort || '–');
      const ext = [...s.externalIPs, ...s.loadBalancerIPs];
      set(3, ext.length === 0 ? '–' : ext.join(', '));
      set(
        4,
        s.error && s.proxyPort === 0
          ? s.error.code
          : s.localProxyPort
            ? `${s.proxyPort} (local ${s.localProxyPort})`
            : s.proxyPort,
      );
      set(5, endpointSummary(s.endpointCounts));
      setProp(cells[5], 'className', s.endpointCounts.total === 0 && !s.error ? 'bad' : '');
      set(6, s.connections.active);
      sparkline(canvas, s.spark);
      setText(rate, perSecond(s.rates[0]));
      set(8, `${bytes(s.rates[1])} / ${bytes(s.rates[2])}`);
      set(9, s.connections.noEndpoints);
      const failures = [reasons(s.connections.connectFailures), reasons(s.connections.rejected)];
      set(10, failures.filter((f) => f !== '').join(' · ') || '–');
    },
  };
}

function endpointSummary(c) {
  if (c.total === 0) return 'none';
  const parts = [`${c.ready} ready`];
  if (c.terminating > 0) parts.push(`${c.terminating} terminating`);
  if (c.total - c.ready - c.terminating > 0) parts.push(`${c.total - c.ready - c.terminating} serving`);
  if (c.ejected > 0) parts.push(`${c.ejected} ejected`);
  if (c.loop > 0) parts.push(`${c.loop} loop`);
  return parts.join(' · ');
}

/** The expanded port: its endpoints one by one, its facts, its three rate charts. */
function detailRow(key, onShowConnections) {
  const endpoints = h('tbody');
  const facts = h('dl', { className: 'facts' });
  const show = h('button', { type: 'button' }, 'show its connections');
  const charts = h('div', { className: 'charts' });
  const left = h(
    'div',
    {},
    facts,
    h(
      'table',
      { className: 'grid' },
      h(
        'thead',
        {},
        h(
          'tr',
          {},
          h('th', {}, 'endpoint'),
          h('th', {}, 'state'),
          h('th', {}, 'until'),
          h('th', {}, 'node'),
          h('th', { className: 'num' }, 'picks'),
        ),
      ),
      endpoints,
    ),
    h('p', {}, show),
  );
  const tr = h(
    'tr',
    { className: 'detail' },
    h('td', { colSpan: COLUMNS }, h('div', { className: 'detail-grid' }, left, charts)),
  );
  const plots = rateCharts(charts);
  let service = '';
  show.addEventListener('click', () => onShowConnections(service));
  return {
    key,
    tr,
    update(d, times) {
      service = d.service;
      const fact = (name, value) => h('div', {}, h('dt', {}, name), h('dd', {}, String(value)));
      facts.replaceChildren(
        fact('affinity', d.sessionAffinity),
        fact('accepted', d.connections.accepted.toLocaleString()),
        fact('connect failed', d.connections.connectFailed),
        fact('failures by reason', reasons(d.connections.connectFailures) || '–'),
        fact('rejected', reasons(d.connections.rejected) || '–'),
        ...(d.trace ? [fact('trace', d.trace)] : []),
        ...(d.proxyProtocol ? [fact('PROXY protocol', d.proxyProtocol)] : []),
        ...(d.loopEndpoints.length > 0 ? [fact('loop (left out)', d.loopEndpoints.join(', '))] : []),
        ...(d.error ? [fact('error', `${d.error.code}: ${d.error.message}`)] : []),
      );
      endpoints.replaceChildren(
        ...d.endpoints.map((e) =>
          h(
            'tr',
            { className: 'row' },
            h('td', {}, e.endpoint),
            h('td', {}, h('span', { className: `badge ${e.state}` }, e.state)),
            h('td', {}, e.ejectedUntil ? new Date(e.ejectedUntil).toLocaleTimeString() : ''),
            h('td', {}, e.local ? 'this node' : ''),
            h('td', { className: 'num' }, String(e.picks)),
          ),
        ),
        ...(d.moreEndpoints > 0
          ? [h('tr', {}, h('td', { colSpan: 5 }, `… and ${d.moreEndpoints} more`))]
          : []),
        ...(d.endpoints.length === 0
          ? [h('tr', {}, h('td', { colSpan: 5, className: 'bad' }, 'no endpoints'))]
          : []),
      );
      plots.update(times, d.series);
    },
    destroy() {
      plots.destroy();
      tr.remove();
    },
  };
}
