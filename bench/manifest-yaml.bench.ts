// Parse time of a 10,000-Service manifest (20,000 YAML documents: a Service and its EndpointSlice each)
// with each YAML library the manifest source could use: `yaml` (composed documents, positions for
// file:line:col) and `js-yaml` (plain values, no positions). Prints; asserts nothing.
// Run: node bench/manifest-yaml.bench.ts [services]
import { performance } from 'node:perf_hooks';
import { loadAll } from 'js-yaml';
import { Composer, LineCounter, Parser, parseAllDocuments, stringify } from 'yaml';

const N = Number(process.argv[2] ?? 10_000);
const octets = (i: number) => `${(i >> 8) & 255}.${i & 255}`;
const docs: string[] = [];
for (let i = 0; i < N; i++) {
  docs.push(
    stringify({
      apiVersion: 'v1',
      kind: 'Service',
      metadata: { name: `svc-${i}`, namespace: 'bench' },
      spec: { clusterIP: `10.96.${octets(i)}`, ports: [{ name: 'http', protocol: 'TCP', port: 80 }] },
    }),
    stringify({
      apiVersion: 'discovery.k8s.io/v1',
      kind: 'EndpointSlice',
      metadata: {
        name: `svc-${i}-a`,
        namespace: 'bench',
        labels: { 'kubernetes.io/service-name': `svc-${i}` },
      },
      addressType: 'IPv4',
      endpoints: [1, 2, 3].map((h) => ({ addresses: [`10.${octets(i)}.${h}`], conditions: { ready: true } })),
      ports: [{ name: 'http', protocol: 'TCP', port: 8080 }],
    }),
  );
}
const text = docs.join('---\n');

function best(name: string, fn: () => number): void {
  const times: number[] = [];
  let count = 0;
  for (let r = 0; r < 5; r++) {
    const start = performance.now();
    count = fn();
    times.push(performance.now() - start);
  }
  console.log(
    `${name.padEnd(46)} ${Math.min(...times)
      .toFixed(0)
      .padStart(6)} ms  (${count} documents)`,
  );
}

console.log(
  `${N} Services + ${N} EndpointSlices, ${(text.length / 2 ** 20).toFixed(1)} MiB of YAML; best of 5`,
);
best('js-yaml loadAll (values only)', () => loadAll(text).length);
best('yaml Parser+Composer, toJS (positions kept)', () => {
  const lc = new LineCounter();
  const composer = new Composer({ uniqueKeys: true, prettyErrors: false });
  let n = 0;
  for (const doc of composer.compose(new Parser(lc.addNewLine).parse(text))) {
    doc.toJS({ maxAliasCount: 100 });
    n++;
  }
  return n;
});
best('yaml parseAllDocuments, toJS', () => {
  const all = parseAllDocuments(text);
  const list = Array.isArray(all) ? all : [all];
  for (const d of list) d.toJS();
  return list.length;
});
const json = JSON.stringify({ kind: 'List', items: loadAll(text) });
best(
  'JSON.parse of the same objects as one List',
  () => (JSON.parse(json) as { items: unknown[] }).items.length,
);
