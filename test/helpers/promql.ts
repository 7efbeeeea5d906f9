// A small PromQL parser for checking what dashboards and alert rules name: metric selectors, label
// matchers, by/without/on/ignoring/group_left labels, and which labels an expression's result carries.
// Pure: no I/O. Not an evaluator; it knows the grammar, not the values.

export type Matcher = { label: string; op: '=' | '!=' | '=~' | '!~'; value: string };
export type Grouping = { without: boolean; labels: string[] };
export type VectorMatching = {
  on: boolean;
  labels: string[];
  /** group_left / group_right and the labels they copy from the one side. */
  group?: { side: 'left' | 'right'; labels: string[] };
};

export type Expr =
  | { kind: 'number'; value: number }
  | { kind: 'string'; value: string }
  | { kind: 'selector'; name: string | undefined; matchers: Matcher[]; range?: string }
  | { kind: 'call'; fn: string; args: Expr[] }
  | { kind: 'aggregate'; op: string; grouping?: Grouping; param?: Expr; expr: Expr }
  | { kind: 'binary'; op: string; bool: boolean; matching?: VectorMatching; lhs: Expr; rhs: Expr }
  | { kind: 'unary'; op: string; expr: Expr }
  | { kind: 'paren'; expr: Expr }
  | { kind: 'subquery'; expr: Expr; range: string };

export class PromQLError extends Error {
  constructor(message: string, expr: string, at: number) {
    super(`${message} at ${at} in: ${expr}`);
    this.name = 'PromQLError';
  }
}

type Token =
  | { t: 'ident'; v: string; at: number }
  | { t: 'number'; v: string; at: number }
  | { t: 'duration'; v: string; at: number }
  | { t: 'string'; v: string; at: number }
  | { t: 'op'; v: string; at: number }
  | { t: 'eof'; v: ''; at: number };

const AGGREGATIONS = new Set([
  'sum',
  'avg',
  'min',
  'max',
  'count',
  'group',
  'stddev',
  'stdvar',
  'topk',
  'bottomk',
  'quantile',
  'count_values',
  'limitk',
  'limit_ratio',
]);
/** Aggregations whose first argument is a parameter (k, φ, a label name). */
const WITH_PARAM = new Set(['topk', 'bottomk', 'quantile', 'count_values', 'limitk', 'limit_ratio']);
/** Binary operators, loosest first; `^` binds right to left. */
const PRECEDENCE: Record<string, number> = {
  or: 1,
  and: 2,
  unless: 2,
  '==': 3,
  '!=': 3,
  '<=': 3,
  '<': 3,
  '>=': 3,
  '>': 3,
  '+': 4,
  '-': 4,
  '*': 5,
  '/': 5,
  '%': 5,
  atan2: 5,
  '^': 6,
};
const COMPARISONS = new Set(['==', '!=', '<=', '<', '>=', '>']);
const PUNCTUATION = ['=~', '!~', '==', '!=', '<=', '>=', '(', ')', '{', '}', '[', ']', ',', ':', '@'];
const SINGLE = '+-*/%^<>=';

function tokenize(src: string): Token[] {
  const out: Token[] = [];
  let i = 0;
  while (i < src.length) {
    const c = src[i]!;
    if (/\s/.test(c)) {
      i++;
      continue;
    }
    if (c === '#') {
      while (i < src.length && src[i] !== '\n') i++;
      continue;
    }
    const at = i;
    if (c === '"' || c === "'" || c === '`') {
      let v = '';
      i++;
      while (i < src.length && src[i] !== c) {
        if (src[i] === '\\' && c !== '`') i++;
        v += src[i] ?? '';
        i++;
      }
      if (i >= src.length) throw new PromQLError('unterminated string', src, at);
      i++;
      out.push({ t: 'string', v, at });
      continue;
    }
    const number = /^(?:0x[0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)/.exec(src.slice(i));
    if (number) {
      // A duration is digits and units, repeated: 5m, 1h30m, 250ms.
      const duration = /^(?:\d+(?:ms|[smhdwy]))+/.exec(src.slice(i));
      if (duration && duration[0].length > number[0].length) {
        out.push({ t: 'duration', v: duration[0], at });
        i += duration[0].length;
      } else {
        out.push({ t: 'number', v: number[0], at });
        i += number[0].length;
      }
      continue;
    }
    // A name may not start with ':' here (Prometheus allows it), so a subquery's `[5m:1m]` reads.
    const ident = /^[a-zA-Z_][a-zA-Z0-9_:]*/.exec(src.slice(i));
    if (ident) {
      out.push({ t: 'ident', v: ident[0], at });
      i += ident[0].length;
      continue;
    }
    const two = PUNCTUATION.find((p) => src.startsWith(p, i));
    if (two !== undefined) {
      out.push({ t: 'op', v: two, at });
      i += two.length;
      continue;
    }
    if (SINGLE.includes(c)) {
      out.push({ t: 'op', v: c, at });
      i++;
      continue;
    }
    throw new PromQLError(`unexpected ${JSON.stringify(c)}`, src, at);
  }
  out.push({ t: 'eof', v: '', at: src.length });
  return out;
}

/** Parses one PromQL expression; throws PromQLError with the offset of what it could not read. */
export function parsePromQL(src: string): Expr {
  const tokens = tokenize(src);
  let p = 0;
  const peek = (n = 0) => tokens[Math.min(p + n, tokens.length - 1)]!;
  const next = () => tokens[p++]!;
  const fail = (message: string, token = peek()): never => {
    throw new PromQLError(`${message}, found ${JSON.stringify(token.v || 'end')}`, src, token.at);
  };
  const isOp = (v: string, token = peek()) => token.t === 'op' && token.v === v;
  const isWord = (v: string, token = peek()) => token.t === 'ident' && token.v === v;
  const expect = (v: string) => (isOp(v) ? next() : fail(`expected ${v}`));

  const labelList = (): string[] => {
    expect('(');
    const labels: string[] = [];
    while (!isOp(')')) {
      const t = next();
      if (t.t !== 'ident' && t.t !== 'string') fail('expected a label name', t);
      labels.push(t.v);
      if (!isOp(')')) expect(',');
    }
    next();
    return labels;
  };

  const matchers = (): Matcher[] => {
    expect('{');
    const out: Matcher[] = [];
    while (!isOp('}')) {
      const label = next();
      if (label.t !== 'ident' && label.t !== 'string') fail('expected a label name', label);
      const op = next();
      if (op.t !== 'op' || !['=', '!=', '=~', '!~'].includes(op.v)) fail('expected a matcher', op);
      const value = next();
      if (value.t !== 'string') fail('expected a string', value);
      out.push({ label: label.v, op: op.v as Matcher['op'], value: value.v });
      if (!isOp('}')) expect(',');
    }
    next();
    return out;
  };

  const duration = (): string => {
    const t = next();
    if (t.t !== 'duration' && t.t !== 'number') fail('expected a duration', t);
    return t.v;
  };

  const grouping = (): Grouping | undefined => {
    if (!isWord('by') && !isWord('without')) return undefined;
    const without = next().v === 'without';
    return { without, labels: labelList() };
  };

  const primary = (): Expr => {
    const t = peek();
    if (isOp('(')) {
      next();
      const expr = expression(0);
      expect(')');
      return { kind: 'paren', expr };
    }
    if (t.t === 'number') {
      next();
      return { kind: 'number', value: Number(t.v) };
    }
    if (t.t === 'string') {
      next();
      return { kind: 'string', value: t.v };
    }
    if (isOp('{')) {
      const m = matchers();
      const name = m.find((x) => x.label === '__name__' && x.op === '=')?.value;
      return { kind: 'selector', name, matchers: m };
    }
    if (t.t !== 'ident') return fail('expected an expression');
    next();
    if (/^(?:Inf|NaN)$/i.test(t.v))
      return { kind: 'number', value: Number(t.v.replace(/^inf$/i, 'Infinity')) };
    if (AGGREGATIONS.has(t.v) && (isOp('(') || isWord('by') || isWord('without'))) {
      let g = grouping();
      expect('(');
      let param: Expr | undefined;
      if (WITH_PARAM.has(t.v)) {
        param = expression(0);
        expect(',');
      }
      const expr = expression(0);
      expect(')');
      g ??= grouping();
      return { kind: 'aggregate', op: t.v, grouping: g, param, expr };
    }
    if (isOp('(')) {
      next();
      const args: Expr[] = [];
      while (!isOp(')')) {
        args.push(expression(0));
        if (!isOp(')')) expect(',');
      }
      next();
      return { kind: 'call', fn: t.v, args };
    }
    if (['by', 'without', 'on', 'ignoring', 'group_left', 'group_right', 'bool', 'offset'].includes(t.v))
      return fail('expected an expression', t);
    return { kind: 'selector', name: t.v, matchers: isOp('{') ? matchers() : [] };
  };

  const postfix = (): Expr => {
    let expr = primary();
    for (;;) {
      if (isOp('[')) {
        next();
        const range = duration();
        if (isOp(':')) {
          next();
          if (!isOp(']')) duration();
          expect(']');
          expr = { kind: 'subquery', expr, range };
        } else {
          expect(']');
          if (expr.kind !== 'selector' || expr.range !== undefined) fail('a range needs a vector selector');
          expr = { ...expr, range } as Expr;
        }
      } else if (isWord('offset')) {
        next();
        if (isOp('-')) next();
        duration();
      } else if (isOp('@')) {
        next();
        const at = next();
        if (at.t === 'ident' && (at.v === 'start' || at.v === 'end')) {
          expect('(');
          expect(')');
        } else if (at.t !== 'number') fail('expected a time', at);
      } else return expr;
    }
  };

  const unary = (): Expr => {
    if (isOp('-') || isOp('+')) {
      const op = next().v;
      return { kind: 'unary', op, expr: unary() };
    }
    return postfix();
  };

  const binaryOp = (): string | undefined => {
    const t = peek();
    if (t.t === 'op' && t.v in PRECEDENCE) return t.v;
    if (t.t === 'ident' && ['and', 'or', 'unless', 'atan2'].includes(t.v)) return t.v;
    return undefined;
  };

  function expression(min: number): Expr {
    let lhs = unary();
    for (;;) {
      const op = binaryOp();
      if (op === undefined) return lhs;
      const prec = PRECEDENCE[op]!;
      if (prec < min) return lhs;
      next();
      let bool = false;
      if (isWord('bool')) {
        if (!COMPARISONS.has(op)) fail('bool only after a comparison');
        next();
        bool = true;
      }
      let matching: VectorMatching | undefined;
      if (isWord('on') || isWord('ignoring')) {
        const on = next().v === 'on';
        matching = { on, labels: labelList() };
        if (isWord('group_left') || isWord('group_right')) {
          const side = next().v === 'group_left' ? 'left' : 'right';
          matching.group = { side, labels: isOp('(') ? labelList() : [] };
        }
      }
      const rhs = expression(op === '^' ? prec : prec + 1);
      lhs = { kind: 'binary', op, bool, matching, lhs, rhs };
    }
  }

  const expr = expression(0);
  if (peek().t !== 'eof') fail('unexpected');
  return expr;
}

/** Every vector selector of `expr`, in order. */
export function selectors(expr: Expr): Extract<Expr, { kind: 'selector' }>[] {
  const out: Extract<Expr, { kind: 'selector' }>[] = [];
  walk(expr, (e) => {
    if (e.kind === 'selector') out.push(e);
  });
  return out;
}

/** Calls `visit` on `expr` and every expression inside it, outermost first. */
export function walk(expr: Expr, visit: (e: Expr) => void): void {
  visit(expr);
  switch (expr.kind) {
    case 'call':
      for (const a of expr.args) walk(a, visit);
      break;
    case 'aggregate':
      if (expr.param) walk(expr.param, visit);
      walk(expr.expr, visit);
      break;
    case 'binary':
      walk(expr.lhs, visit);
      walk(expr.rhs, visit);
      break;
    case 'unary':
    case 'paren':
    case 'subquery':
      walk(expr.expr, visit);
      break;
  }
}

/** Whether `expr` is a scalar (a number, time(), scalar(...)): binary operators then keep the other side. */
function isScalar(expr: Expr): boolean {
  if (expr.kind === 'number') return true;
  if (expr.kind === 'paren' || expr.kind === 'unary') return isScalar(expr.expr);
  if (expr.kind === 'call') return ['time', 'scalar', 'pi'].includes(expr.fn);
  if (expr.kind === 'binary') return isScalar(expr.lhs) && isScalar(expr.rhs);
  return false;
}

/**
 * The label names every series of `expr`'s result carries (as far as the grammar tells), given the labels
 * of each metric's series. `labelsOf(name)` answers for a selector's metric (its samples' labels plus the
 * target labels Prometheus adds).
 */
export function resultLabels(expr: Expr, labelsOf: (selector: string) => ReadonlySet<string>): Set<string> {
  const self = (e: Expr) => resultLabels(e, labelsOf);
  switch (expr.kind) {
    case 'number':
    case 'string':
      return new Set();
    case 'selector':
      return new Set(expr.name === undefined ? [] : labelsOf(expr.name));
    case 'paren':
    case 'unary':
    case 'subquery':
      return self(expr.expr);
    case 'aggregate': {
      const inner = self(expr.expr);
      let out = inner;
      if (expr.grouping === undefined) out = new Set();
      else if (expr.grouping.without) out = difference(inner, expr.grouping.labels);
      else out = new Set(expr.grouping.labels);
      if (expr.op === 'count_values' && expr.param?.kind === 'string') out.add(expr.param.value);
      if (['topk', 'bottomk', 'limitk', 'limit_ratio'].includes(expr.op)) return inner;
      return out;
    }
    case 'call': {
      const vector = expr.args.find((a) => a.kind !== 'number' && a.kind !== 'string' && !isScalar(a));
      const inner = vector === undefined ? new Set<string>() : self(vector);
      switch (expr.fn) {
        case 'time':
        case 'vector':
        case 'scalar':
          return new Set();
        case 'histogram_quantile':
          return difference(inner, ['le']);
        case 'label_replace':
        case 'label_join': {
          const dst = expr.args[1];
          if (dst?.kind === 'string') inner.add(dst.value);
          return inner;
        }
        case 'absent':
        case 'absent_over_time': {
          const sel = vector?.kind === 'selector' ? vector : undefined;
          return new Set(
            sel?.matchers.filter((m) => m.op === '=' && m.label !== '__name__').map((m) => m.label),
          );
        }
        default:
          return inner;
      }
    }
    case 'binary': {
      if (isScalar(expr.lhs)) return self(expr.rhs);
      if (isScalar(expr.rhs)) return self(expr.lhs);
      const lhs = self(expr.lhs);
      const rhs = self(expr.rhs);
      if (expr.op === 'and' || expr.op === 'unless') return lhs;
      if (expr.op === 'or') return intersection(lhs, rhs);
      const m = expr.matching;
      if (m?.group) {
        const many = m.group.side === 'left' ? lhs : rhs;
        return new Set([...many, ...m.group.labels]);
      }
      // A filtering comparison returns the left side's series unchanged.
      if (COMPARISONS.has(expr.op) && !expr.bool) return lhs;
      if (m?.on) return new Set(m.labels);
      if (m) return difference(lhs, m.labels);
      return lhs;
    }
  }
}

/**
 * What `expr` names that does not exist: metrics `known` does not have, and labels (in matchers, by,
 * without, on, ignoring, group_left/right) that the series they apply to do not carry. Empty when all is
 * well. `known(name)` gives a metric's labels, or undefined when there is no such metric.
 */
export function unknownReferences(
  expr: Expr,
  known: (metric: string) => ReadonlySet<string> | undefined,
): string[] {
  const problems: string[] = [];
  const labelsOf = (name: string) => known(name) ?? new Set<string>();
  // Labels are checked only where every metric is known: an unknown one is reported once, by name.
  const allKnown = (e: Expr) =>
    selectors(e).every((s) => s.name !== undefined && known(s.name) !== undefined);
  walk(expr, (e) => {
    if (e.kind === 'selector') {
      if (e.name === undefined) {
        problems.push('a selector without a metric name');
        return;
      }
      const labels = known(e.name);
      if (labels === undefined) {
        problems.push(`no metric ${e.name}`);
        return;
      }
      for (const m of e.matchers)
        if (m.label !== '__name__' && !labels.has(m.label))
          problems.push(`${e.name} has no label ${m.label}`);
    } else if (e.kind === 'aggregate' && e.grouping !== undefined && allKnown(e.expr)) {
      const inner = resultLabels(e.expr, labelsOf);
      for (const l of e.grouping.labels)
        if (!inner.has(l))
          problems.push(`${e.op} ${e.grouping.without ? 'without' : 'by'} ${l}: not a label of its input`);
    } else if (e.kind === 'binary' && e.matching !== undefined && allKnown(e)) {
      const lhs = resultLabels(e.lhs, labelsOf);
      const rhs = resultLabels(e.rhs, labelsOf);
      for (const l of e.matching.labels)
        if (!lhs.has(l) || !rhs.has(l))
          problems.push(`${e.op} ${e.matching.on ? 'on' : 'ignoring'} ${l}: not a label of both sides`);
      const one = e.matching.group?.side === 'left' ? rhs : lhs;
      for (const l of e.matching.group?.labels ?? [])
        if (!one.has(l)) problems.push(`group_${e.matching.group!.side} ${l}: not a label of the one side`);
    }
  });
  return problems;
}

function difference(a: ReadonlySet<string>, b: readonly string[]): Set<string> {
  const out = new Set(a);
  for (const x of b) out.delete(x);
  return out;
}

function intersection(a: ReadonlySet<string>, b: ReadonlySet<string>): Set<string> {
  return new Set([...a].filter((x) => b.has(x)));
}

/**
 * Grafana's interval variables replaced by a duration, so a panel's query parses as PromQL. Template
 * variables inside strings (`instance=~"$instance"`) stay as they are.
 */
export function expandGrafanaVariables(expr: string): string {
  return expr.replace(
    /\$__(?:rate_interval|interval|range)\b|\$\{__(?:rate_interval|interval|range)\}/g,
    '5m',
  );
}
