// Command-line flags (+ the --config file) → Config, with kube-proxy's names and defaults: the options and
// the flag → Config mapping are read off the settings table, so a bad flag exits with one clear message
// before anything starts. Precedence: defaults < --config file < flags given on the command line.
import yargs, { type Options } from 'yargs';
import { ProxyError } from '../lib/errors.ts';
import type { FlagValue } from './codecs.ts';
import type { Config } from './config.ts';
import { DEFAULT_CONFIG } from './config.ts';
import { loadConfigFile } from './file.ts';
import { IGNORED_FLAGS } from './ignored.ts';
import { resolveConfig } from './rules.ts';
import { SETTINGS, type Setting } from './settings.ts';
import type { ValueSource } from './validate.ts';

export type ParsedArgs = {
  config: Config;
  help?: string;
  version?: boolean;
  /** --config: the KubeProxyConfiguration file that was read. */
  configFile?: string;
  /** --write-config-to: the caller writes `config` there (writeConfigFile) and exits 0. */
  writeConfigTo?: string;
  /** To log once at start (warn): ignored file fields and flags, settings accepted but not applied. */
  warnings: string[];
};

const flagSource = (name: string): ValueSource => ({ code: 'KUP_ERR_INVALID_FLAG', name: `--${name}` });

/**
 * The yargs parser; shared by `parseArgs` and `--help`. Options carry no yargs default (help shows it)
 * so that a flag left out is undefined and the config file's value can stand.
 */
function buildParser(argv: string[]) {
  let parser = yargs(argv)
    .scriptName('kube-userspace-proxy')
    .usage(
      '$0 [flags]              run the proxy\n$0 connections [flags]  the live connection table of a running proxy (--help)\n$0 trace [flags]        its trace stream: HTTP requests, TLS SNI, DNS names (--help)\n$0 completion           bash/zsh completion: >> ~/.bashrc or ~/.zshrc\n\nKubernetes userspace kube-proxy: per-service-port listeners, iptables portals, round robin with ClientIP affinity.',
    )
    .strict()
    .parserConfiguration({
      'camel-case-expansion': false,
      'boolean-negation': false,
      // A flag given twice: the last one wins, as with kube-proxy's pflag.
      'duplicate-arguments-array': false,
    })
    .options(FILE_FLAGS);
  for (const [name, option] of settingFlags()) parser = parser.option(name, option);
  return parser
    .epilogue(
      `Accepted for kube-proxy compatibility and ignored (they do not apply to the userspace mode): ${Object.keys(
        IGNORED_FLAGS,
      )
        .map((f) => `--${f}`)
        .join(', ')}.`,
    )
    .version(false)
    .help(false)
    .option('help', { type: 'boolean', alias: 'h', describe: 'Show this help' })
    .option('version', { type: 'boolean', describe: 'Show the version' })
    .wrap(Math.min(120, process.stdout.columns || 100))
    .fail((msg, err) => {
      throw err ?? new ProxyError('KUP_ERR_INVALID_FLAG', msg);
    });
}

/** The flags about the config file itself. */
const FILE_FLAGS = {
  config: {
    type: 'string',
    describe:
      'A KubeProxyConfiguration file (YAML or JSON); flags given on the command line override its fields',
  },
  'write-config-to': {
    type: 'string',
    describe: 'Write the effective configuration as a KubeProxyConfiguration to this file, then exit',
  },
} as const satisfies Record<string, Options>;

/** The settings table's flags with their yargs options, then the ignored ones (hidden). */
function settingFlags(): [string, Options][] {
  return [
    ...SETTINGS.map((setting): [string, Options] => [setting.flag, flagOption(setting)]),
    ...Object.entries(IGNORED_FLAGS).map(([name, type]): [string, Options] => [name, { type, hidden: true }]),
  ];
}

/** Every flag of the proxy with its yargs option, in --help order (shell completion offers them). */
export function proxyFlags(): [string, Options][] {
  return [...Object.entries(FILE_FLAGS), ...settingFlags()];
}

/** A row's yargs option: no yargs default (help shows it), so that a flag left out is undefined. */
function flagOption({ codec, default: value, help, shown: given }: Setting): Options {
  const shown = given ?? (value === undefined ? undefined : codec.show(value));
  return {
    describe: help,
    ...(codec.type === undefined ? {} : { type: codec.type }),
    ...(codec.choices === undefined ? {} : { choices: codec.choices }),
    ...(shown === undefined ? {} : { defaultDescription: shown }),
  };
}

/** The Config fields the command line sets, each checked; flags left out are absent. */
function fromFlags(args: Record<string, unknown>): Partial<Config> {
  const config: Record<string, unknown> = {};
  for (const { key, flag, codec } of SETTINGS) {
    const value = args[flag] as FlagValue | undefined;
    if (value === undefined) continue;
    const parsed = codec.parse(value, flagSource(flag));
    if (key !== undefined) config[key] = parsed;
  }
  return config as Partial<Config>;
}

/** Parses and validates argv (without the node and script paths) and the --config file it names.
 * Throws KUP_ERR_INVALID_FLAG for a bad flag, KUP_ERR_CONFIG_FILE for a bad file. */
export async function parseArgs(argv: string[]): Promise<ParsedArgs> {
  const parser = buildParser(argv);
  const a = await parser.parseAsync();
  if (a.help) return { config: DEFAULT_CONFIG, help: await parser.getHelp(), warnings: [] };
  if (a.version) return { config: DEFAULT_CONFIG, version: true, warnings: [] };
  if (a._.length > 0) throw new ProxyError('KUP_ERR_INVALID_FLAG', `unexpected argument "${a._[0]}"`);

  const flags = fromFlags(a);
  const warnings: string[] = [];
  const file = a.config === undefined ? undefined : await loadConfigFile(a.config);
  if (file !== undefined && file.ignored.length > 0)
    warnings.push(
      `Ignored fields of ${a.config} that do not apply to the userspace proxy: ${file.ignored.join(', ')}`,
    );
  const config = resolveConfig({ flags, file: file && { path: a.config!, config: file.config } });

  const ignoredFlags = Object.keys(IGNORED_FLAGS).filter((f) => a[f] !== undefined);
  if (ignoredFlags.length > 0)
    warnings.push(
      `Ignored flags that do not apply to the userspace proxy: ${ignoredFlags.map((f) => `--${f}`).join(', ')}`,
    );
  if (config.profiling) warnings.push('Profiling is not available (Node has no pprof): use node --cpu-prof');

  const parsed: ParsedArgs = { config, warnings };
  if (a.config !== undefined) parsed.configFile = a.config;
  if (a['write-config-to'] !== undefined) parsed.writeConfigTo = a['write-config-to'];
  return parsed;
}
