// Reads Prometheus' text exposition format (what /metrics answers): the families its `# TYPE` lines
// declare, and the label names each series name carries. Pure: no I/O.

export type Family = { name: string; type: string };

export type Exposition = {
  families: Map<string, Family>;
  /** Label names seen on the samples of each series name (`x_bucket` has `le`). */
  labels: Map<string, Set<string>>;
};

/** Parses exposition text; a line it cannot read throws with its number. */
export function parseExposition(text: string): Exposition {
  const families = new Map<string, Family>();
  const labels = new Map<string, Set<string>>();
  text.split('\n').forEach((line, i) => {
    if (line.trim() === '') return;
    if (line.startsWith('#')) {
      const type = /^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$/.exec(line);
      if (type) families.set(type[1]!, { name: type[1]!, type: type[2]! });
      return;
    }
    const sample = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? \S+( \d+)?$/.exec(line);
    if (!sample) throw new Error(`line ${i + 1}: not a sample: ${line}`);
    const set = labels.get(sample[1]!) ?? new Set<string>();
    for (const name of labelNames(sample[2] ?? '')) set.add(name);
    labels.set(sample[1]!, set);
  });
  return { families, labels };
}

/** The label names of `{a="x",b="y\"z"}`. */
function labelNames(block: string): string[] {
  const out: string[] = [];
  const re = /([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*",?/gy;
  re.lastIndex = 1;
  while (re.lastIndex < block.length - 1) {
    const m = re.exec(block);
    if (!m) throw new Error(`bad labels: ${block}`);
    out.push(m[1]!);
  }
  return out;
}

/** The series names a family exposes: itself, or a histogram's and a summary's _bucket/_sum/_count. */
export function seriesNames(family: Family): string[] {
  if (family.type === 'histogram') return ['_bucket', '_sum', '_count'].map((s) => family.name + s);
  if (family.type === 'summary') return [family.name, `${family.name}_sum`, `${family.name}_count`];
  return [family.name];
}

/**
 * The labels of the series named `name` as Prometheus stores them (their own plus `targetLabels`), or
 * undefined when no `# TYPE` line declares a family with such a series. A declared family without samples
 * yet has only the target labels (and `le` for buckets, `quantile` for a summary).
 */
export function seriesLabels(
  exposition: Exposition,
  name: string,
  targetLabels: readonly string[],
): Set<string> | undefined {
  for (const family of exposition.families.values()) {
    if (!seriesNames(family).includes(name)) continue;
    const out = new Set([...(exposition.labels.get(name) ?? []), ...targetLabels]);
    if (name === `${family.name}_bucket`) out.add('le');
    if (family.type === 'summary' && name === family.name) out.add('quantile');
    return out;
  }
  return undefined;
}
