// The console's entry point: the header (sync health, totals), the total rate charts, and the three panels.
// It polls (every 2 s while the tab is visible; the connection table also right after the trace reports a
// connection opening or closing) rather than holding a stream per panel: each poll is one bounded page.
import { getJson } from './api.js';
import { rateCharts } from './charts.js';
import { connectionsPanel } from './connections.js';
import { h, setProp, setText } from './dom.js';
import { filterBar } from './filters.js';
import { duration, printable } from './format.js';
import { servicesPanel } from './services.js';
import { tracePanel } from './trace.js';

const INTERVAL_MS = 2000;
/** After a trace event, the table is asked again within this long (and not more often). */
const ACTIVITY_DELAY_MS = 150;

const banner = document.getElementById('banner');
const failures = new Map();
function report(name, err) {
  if (err === undefined) failures.delete(name);
  else if (err.name !== 'AbortError') failures.set(name, printable(err.message));
  setProp(banner, 'hidden', failures.size === 0);
  setText(banner, [...failures.values()].map((m) => `Cannot read the proxy: ${m}`).join('\n'));
}

/** Runs `fn` now and every interval while the page is visible, never twice at once; `soon()` runs it early. */
function poller(name, fn) {
  let timer;
  let running = false;
  let again = false;
  const run = async () => {
    clearTimeout(timer);
    if (running) {
      again = true;
      return;
    }
    running = true;
    try {
      if (!document.hidden) {
        await fn(AbortSignal.timeout(10_000));
        report(name);
      }
    } catch (err) {
      report(name, err);
    } finally {
      running = false;
      if (again) {
        again = false;
        queueMicrotask(run);
      } else timer = setTimeout(run, INTERVAL_MS);
    }
  };
  document.addEventListener('visibilitychange', () => {
    if (!document.hidden) run();
  });
  return { run, soon: run };
}

const syncFacts = document.getElementById('sync');
function renderOverview(o) {
  setText(
    document.getElementById('node'),
    `node ${o.node || '(unnamed)'} · ${o.mode.iptables ? 'iptables' : 'no iptables'} · trace ${o.mode.trace}`,
  );
  const s = o.sync;
  const fact = (name, value, cls = '') => h('div', {}, h('dt', {}, name), h('dd', { className: cls }, value));
  const health = h(
    'span',
    { className: `badge ${s.healthy ? 'ok' : 'bad'}` },
    s.healthy ? 'healthy' : s.reason,
  );
  syncFacts.replaceChildren(
    fact('sync', health),
    fact('last sync', s.lastSyncAgoMs === null ? 'never' : `${duration(s.lastSyncAgoMs)} ago`),
    fact(
      'took',
      s.lastSyncDurationMs === null ? '–' : `${s.lastSyncDurationMs} ms${s.lastSyncFull ? ' (full)' : ''}`,
    ),
    fact(
      'pending',
      `${s.pendingServiceChanges} services, ${s.pendingEndpointChanges} endpoint slices`,
      s.pendingServiceChanges + s.pendingEndpointChanges > 0 ? 'bad' : '',
    ),
    fact(
      'iptables-restore failures',
      s.iptablesRestoreFailures === null ? 'n/a (--no-iptables)' : String(s.iptablesRestoreFailures),
      s.iptablesRestoreFailures > 0 ? 'bad' : '',
    ),
    fact('ports not opened', String(s.failedServicePorts), s.failedServicePorts > 0 ? 'bad' : ''),
    fact('service ports', o.totals.servicePorts.toLocaleString()),
    fact('active connections', o.totals.active.toLocaleString()),
    fact('accepted', o.totals.accepted.toLocaleString()),
    fact('trace followers', `${o.tracer.followers} of ${o.tracer.maxFollowers}`),
    ...(o.tracer.dropped > 0 ? [fact('trace events dropped', o.tracer.dropped.toLocaleString(), 'bad')] : []),
  );
}

const filters = filterBar(document.getElementById('filters'), (f, before) => {
  connections.reset();
  connectionsPoll.soon();
  trace.filtersChanged(f, before);
});
const connections = connectionsPanel(filters);
const services = servicesPanel({
  onShowConnections: (service) => {
    filters.set('service', service);
    document.getElementById('live').scrollIntoView({ behavior: 'smooth' });
  },
});
const totals = rateCharts(document.getElementById('total-charts'));
let traceOff = false;

const overviewPoll = poller('overview', async (signal) => {
  const [o] = await Promise.all([getJson('api/overview', {}, signal), services.poll(signal)]);
  renderOverview(o);
  totals.update(o.times, o.rates);
  if ((o.mode.trace === 'none') !== traceOff) {
    traceOff = o.mode.trace === 'none';
    trace.setOff(traceOff);
  }
});
services.setRefresh(() => overviewPoll.soon());

const connectionsPoll = poller('connections', (signal) => connections.poll(signal));
connections.setRefresh(() => connectionsPoll.soon());

let activityTimer = 0;
const trace = tracePanel(filters, {
  onActivity: () => {
    if (activityTimer !== 0) return;
    activityTimer = setTimeout(() => {
      activityTimer = 0;
      connectionsPoll.soon();
    }, ACTIVITY_DELAY_MS);
  },
});

overviewPoll.run();
connectionsPoll.run();
trace.start();
