// The --config file: a KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1, YAML or JSON) read into a
// checked Partial<Config>, and a Config written back as one (--write-config-to). Strict: an unknown field
// is an error; real v1alpha1 fields that do not apply to the userspace proxy are accepted and listed. The
// text passes lib/safe-yaml.ts's limits (nesting, aliases) before it is parsed for positions.
import { writeFile } from 'node:fs/promises';
import { isDeepStrictEqual } from 'node:util';
import { Document, LineCounter, parseDocument, Scalar } from 'yaml';
import { ProxyError } from '../lib/errors.ts';
import { readRegularFile } from '../lib/read-regular-file.ts';
import { readYaml, YAML_LIMITS } from '../lib/safe-yaml.ts';
import { linePosition } from '../lib/text-position.ts';
import type { Config } from './config-type.ts';
import { IGNORED_FIELDS, isUnset } from './ignored.ts';
import { SETTINGS, type Setting } from './settings.ts';
import { invalidValue, type ValueSource } from './validate.ts';

const CONFIG_API_VERSION = 'kubeproxy.config.k8s.io/v1alpha1';
const CONFIG_KIND = 'KubeProxyConfiguration';

/** What a config file says. */
export type ConfigFile = {
  /** The fields the file sets, checked. A zero value (`""`, `0s`, `0`, null) is left out: it means the default. */
  readonly config: Partial<Config>;
  /** Paths of fields present with a non-zero value that do not apply here (`ipvs`, `featureGates`), to log once. */
  readonly ignored: string[];
};

/** A field of the file: a setting's row, a struct of fields, or a field accepted and ignored. */
type Field =
  | { readonly setting: Setting }
  | { readonly fields: Map<string, Field> }
  | { readonly ignore: 'any' | readonly string[] };

/** The v1alpha1 fields this proxy knows, by name, from the settings table and the ignored fields. */
function fieldTree(): Map<string, Field> {
  const root = new Map<string, Field>();
  const place = (path: string, field: Field) => {
    const names = path.split('.');
    let fields = root;
    for (const name of names.slice(0, -1)) {
      const struct = fields.get(name) ?? { fields: new Map<string, Field>() };
      fields.set(name, struct);
      if (!('fields' in struct)) throw new Error(`${path}: ${name} is not a struct`);
      fields = struct.fields;
    }
    fields.set(names.at(-1)!, field);
  };
  for (const setting of SETTINGS) if (setting.file !== undefined) place(setting.file, { setting });
  for (const [path, ignore] of Object.entries(IGNORED_FIELDS)) place(path, { ignore });
  return root;
}

const FIELDS = fieldTree();

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/**
 * Parses the text of a KubeProxyConfiguration. `file` names it in messages. Throws KUP_ERR_CONFIG_FILE
 * (with `file:line:col` and the field path) for a syntax error, a wrong apiVersion or kind, an unknown
 * field, or a bad value.
 */
export function parseConfigFile(text: string, file: string): ConfigFile {
  // An alias bomb or a 10,000-deep nesting is refused here, with its place, before anything expands it.
  const guard = readYaml(text);
  if (guard.error?.limit) {
    const { line, col } = linePosition(text, guard.error.offset);
    throw new ProxyError('KUP_ERR_CONFIG_FILE', `config file ${file}:${line}:${col}: ${guard.error.message}`);
  }
  const lines = new LineCounter();
  const doc = parseDocument(text, { lineCounter: lines, uniqueKeys: true });
  // `file:line:col` of the field at `path` (its value when it has one), for every message.
  const where = (path: readonly string[]): string => {
    const node =
      path.length === 0 ? doc.contents : (doc.getIn(path, true) as { range?: number[] } | undefined);
    const offset = node?.range?.[0];
    if (offset === undefined) return file;
    const pos = lines.linePos(offset);
    return `${file}:${pos.line}:${pos.col}`;
  };
  const fail = (path: readonly string[], message: string): never => {
    throw new ProxyError('KUP_ERR_CONFIG_FILE', `config file ${where(path)}: ${message}`);
  };
  const [syntax] = doc.errors;
  if (syntax !== undefined) {
    const pos = syntax.linePos?.[0];
    const at = pos === undefined ? file : `${file}:${pos.line}:${pos.col}`;
    const message =
      syntax.code === 'MULTIPLE_DOCS'
        ? 'holds more than one YAML document'
        : syntax.message.split(' at line ')[0];
    throw new ProxyError('KUP_ERR_CONFIG_FILE', `config file ${at}: ${message}`);
  }
  let root: unknown;
  try {
    // Bounded by the guard above; `yaml`'s own alias bound too, should the two parsers disagree.
    root = doc.toJS({ maxAliasCount: YAML_LIMITS.maxAliases });
  } catch (err) {
    return fail([], `cannot be read: ${(err as Error).message}`);
  }
  if (!isObject(root))
    return fail([], root == null ? 'the file is empty' : `expected a ${CONFIG_KIND} object`);
  if (root.apiVersion !== CONFIG_API_VERSION)
    fail(
      ['apiVersion'],
      `apiVersion is ${JSON.stringify(root.apiVersion)}, expected "${CONFIG_API_VERSION}"`,
    );
  if (root.kind !== CONFIG_KIND)
    fail(['kind'], `kind is ${JSON.stringify(root.kind)}, expected "${CONFIG_KIND}"`);

  const config: Partial<Config> = {};
  const ignored: string[] = [];
  const walk = (fields: Map<string, Field>, object: Record<string, unknown>, path: string[]) => {
    for (const [name, value] of Object.entries(object)) {
      const at = [...path, name];
      const field = fields.get(name);
      if (field === undefined) {
        if (path.length === 0 && (name === 'apiVersion' || name === 'kind')) continue;
        return fail(at, `unknown field "${at.join('.')}"`);
      }
      if (value === null || value === undefined) continue;
      const source: ValueSource = { code: 'KUP_ERR_CONFIG_FILE', name: at.join('.'), file: where(at) };
      if ('setting' in field) {
        const { key, codec, fileZero } = field.setting;
        // kube-proxy's defaulting treats zero values as unset: a kubeadm file full of "" and 0s means the defaults.
        if (fileZero !== 'value' && codec.isZero(value)) continue;
        const v = codec.read(value, source);
        if (key !== undefined) (config as Record<string, unknown>)[key] = v;
      } else if ('fields' in field) {
        if (!isObject(value)) invalidValue(source, value, 'expected an object');
        walk(field.fields, value, at);
      } else {
        if (field.ignore !== 'any') {
          if (!isObject(value)) invalidValue(source, value, 'expected an object');
          const unknown = Object.keys(value).find((k) => !field.ignore.includes(k));
          if (unknown !== undefined) fail([...at, unknown], `unknown field "${[...at, unknown].join('.')}"`);
        }
        if (!isUnset(value)) ignored.push(at.join('.'));
      }
    }
  };
  walk(FIELDS, root, []);
  return { config, ignored };
}

/**
 * Reads and parses a config file (see parseConfigFile); an unreadable file is KUP_ERR_CONFIG_FILE too, and
 * so is anything but a regular file (a FIFO would block the start for ever).
 */
export async function loadConfigFile(path: string): Promise<ConfigFile> {
  let text: string;
  try {
    text = (await readRegularFile(path)).toString('utf8');
  } catch (err) {
    throw new ProxyError('KUP_ERR_CONFIG_FILE', `config file ${path}: ${(err as Error).message}`, {
      cause: err,
    });
  }
  return parseConfigFile(text, path);
}

/**
 * `config` as a KubeProxyConfiguration object: apiVersion, kind, `mode`, then every field a file can hold
 * in kube-proxy's (alphabetical) order. What --write-config-to writes and /configz serves.
 */
export function kubeProxyConfiguration(config: Config): Record<string, unknown> {
  const fields: Record<string, unknown> = {};
  for (const s of SETTINGS) if (s.file !== undefined) setIn(fields, s.file.split('.'), fileValue(s, config));
  // `mode` first: it says which proxier the rest is for.
  const { mode, ...rest } = fields;
  const sorted = Object.keys(rest).sort();
  return {
    apiVersion: CONFIG_API_VERSION,
    kind: CONFIG_KIND,
    mode,
    ...Object.fromEntries(sorted.map((name) => [name, rest[name]])),
  };
}

/**
 * Renders every field of `config` that a KubeProxyConfiguration can hold, as YAML that parseConfigFile
 * reads back to the same values. A value a file cannot express (a zero that means the default there: a
 * disabled server, a zero min sync period) carries a comment naming the flag that can.
 */
export function renderConfigFile(config: Config): string {
  const notes: [path: string[], note: string][] = [];
  for (const s of SETTINGS) {
    if (s.file === undefined) continue;
    const path = s.file.split('.');
    const value = fileValue(s, config);
    const current = s.key === undefined ? s.default : config[s.key];
    if (s.fileZero !== 'value' && s.codec.isZero(value) && !isDeepStrictEqual(current, s.default))
      notes.push([path, `in a file ${spell(value)} means the default; pass --${s.flag}=${s.codec.zeroFlag}`]);
  }
  const doc = new Document(kubeProxyConfiguration(config));
  for (const [path, note] of notes) {
    const node = doc.getIn(path, true);
    if (node instanceof Scalar) node.comment = ` ${note}`;
  }
  doc.commentBefore =
    ' Written by kube-userspace-proxy --write-config-to: the effective configuration. Flags of our own\n' +
    ' (--manifest, --no-iptables, --trace, --udp-max-sessions, --tcp-*-timeout, ...) have no field here.';
  return doc.toString({ lineWidth: 0 });
}

/** A row's value in the written file; undefined (no kubeconfig) is written as "", unset. */
function fileValue(s: Setting, config: Config): unknown {
  const value = s.key === undefined ? s.default : config[s.key];
  return value === undefined ? '' : s.codec.write(value);
}

/** A file value as YAML shows it (`""`, `0s`, `0`). */
function spell(value: unknown): string {
  return typeof value === 'string' && value !== '' ? value : JSON.stringify(value);
}

function setIn(object: Record<string, unknown>, path: readonly string[], value: unknown): void {
  let at = object;
  for (const name of path.slice(0, -1)) {
    at[name] ??= {};
    at = at[name] as Record<string, unknown>;
  }
  at[path.at(-1)!] = value;
}

/** Writes renderConfigFile(config) to `path` (`/dev/stdout` works); KUP_ERR_CONFIG_FILE if it cannot. */
export async function writeConfigFile(path: string, config: Config): Promise<void> {
  try {
    await writeFile(path, renderConfigFile(config));
  } catch (err) {
    throw new ProxyError('KUP_ERR_CONFIG_FILE', `cannot write ${path}: ${(err as Error).message}`, {
      cause: err,
    });
  }
}
