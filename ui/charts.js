// Small charts: rate charts with a time axis (uPlot, served by the proxy from its package) for the totals
// and the expanded service port, and canvas sparklines for the rows of the service table.

import { bytes, perSecond } from './format.js';
import uPlot from './uPlot.esm.js';

const COLORS = ['#0969da', '#bf3989', '#1a7f37', '#cf222e'];

/** The three charts of a set of rates: connections/s, bytes/s each way, no-endpoint closes/s. */
export const RATE_CHARTS = [
  { title: 'connections/s', series: [{ label: 'connections/s', index: 0, color: 0 }], format: perSecond },
  {
    title: 'bytes/s',
    series: [
      { label: 'from clients', index: 1, color: 1 },
      { label: 'to clients', index: 2, color: 2 },
    ],
    format: bytes,
  },
  { title: 'no-endpoint closes/s', series: [{ label: 'closes/s', index: 3, color: 3 }], format: perSecond },
];

/**
 * A rate chart in `parent`; `update(times, rates)` takes sample times (ms) and the four rate series of
 * the API (null = gap). Resizes with its box.
 */
export function rateChart(parent, spec) {
  const box = document.createElement('div');
  box.className = 'chart';
  const title = document.createElement('h4');
  const now = document.createElement('span');
  now.className = 'now';
  title.append(spec.title, now);
  box.append(title);
  parent.append(box);
  const width = () => Math.max(200, box.clientWidth - 12);
  const plot = new uPlot(
    {
      width: width(),
      height: 130,
      legend: { show: true, live: false },
      cursor: { drag: { x: false, y: false } },
      scales: { x: { time: true }, y: { range: (_u, _min, max) => [0, max > 0 ? max * 1.15 : 1] } },
      axes: [{ size: 30 }, { size: 48, values: (_u, splits) => splits.map((v) => spec.format(v)) }],
      series: [
        {},
        ...spec.series.map((s) => ({
          label: s.label,
          stroke: COLORS[s.color],
          width: 1.5,
        })),
      ],
    },
    [[], ...spec.series.map(() => [])],
    box,
  );
  const observer = new ResizeObserver(() => plot.setSize({ width: width(), height: 130 }));
  observer.observe(box);
  return {
    update(times, rates) {
      const x = times.map((t) => t / 1000);
      const ys = spec.series.map((s) => (rates ? rates[s.index] : x.map(() => 0)));
      plot.setData([x, ...ys]);
      const last = ys.map((y) => y.at(-1));
      now.textContent = last.every((v) => v === null || v === undefined)
        ? ''
        : `now ${last.map((v) => (v === null || v === undefined ? '–' : spec.format(v))).join(' / ')}`;
    },
    destroy() {
      observer.disconnect();
      plot.destroy();
      box.remove();
    },
  };
}

/** The three rate charts in `parent`, updated together. */
export function rateCharts(parent) {
  const charts = RATE_CHARTS.map((spec) => rateChart(parent, spec));
  return {
    update: (times, rates) => {
      for (const c of charts) c.update(times, rates);
    },
    destroy: () => {
      for (const c of charts) c.destroy();
    },
  };
}

/** Draws `values` (null = gap) as a line in `canvas`, scaled to its own maximum. */
export function sparkline(canvas, values) {
  const ratio = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 90;
  const hgt = canvas.clientHeight || 18;
  if (canvas.width !== w * ratio) canvas.width = w * ratio;
  if (canvas.height !== hgt * ratio) canvas.height = hgt * ratio;
  const ctx = canvas.getContext('2d');
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, w, hgt);
  if (!values || values.length < 2) return;
  let max = 0;
  for (const v of values) if (v !== null && v > max) max = v;
  ctx.strokeStyle = COLORS[0];
  ctx.lineWidth = 1.2;
  ctx.beginPath();
  let pen = false;
  values.forEach((v, i) => {
    if (v === null) {
      pen = false;
      return;
    }
    const x = (i / (values.length - 1)) * (w - 2) + 1;
    const y = hgt - 1 - (max > 0 ? (v / max) * (hgt - 3) : 0);
    if (pen) ctx.lineTo(x, y);
    else ctx.moveTo(x, y);
    pen = true;
  });
  ctx.stroke();
}
