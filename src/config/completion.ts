// Shell completion through yargs: `kube-userspace-proxy completion` prints a bash script (zsh when
// $SHELL is zsh) that asks the program itself at each TAB (`--get-yargs-completions WORDS...`), so the
// subcommands and flags offered are always the ones this version has. The subcommands' flags are given
// by the caller (they belong to the trace CLI, above this folder).
import yargs, { type Argv, type Options } from 'yargs';
import { proxyFlags } from './flags.ts';

/** The words of a completion request or of the `completion` command: the caller hands argv here. */
export const COMPLETION_COMMAND = 'completion';
export const COMPLETION_REQUEST = '--get-yargs-completions';

/** A subcommand's flags as node:util parseArgs declares them. */
export type SubcommandFlags = Readonly<
  Record<string, { readonly type: 'string' | 'boolean'; readonly short?: string }>
>;

export type Subcommand = { name: string; describe: string; flags: SubcommandFlags };

/** True when `argv` asks for a completion script or for completions. */
export function isCompletion(argv: readonly string[]): boolean {
  return argv[0] === COMPLETION_COMMAND || argv[0] === COMPLETION_REQUEST;
}

/**
 * Prints the completion script (`completion`) or the completions for the words after
 * `--get-yargs-completions`, on stdout (yargs writes them there). Returns the exit code.
 */
export async function runCompletion(argv: string[], subcommands: readonly Subcommand[]): Promise<number> {
  try {
    await completionParser(argv, subcommands).parseAsync();
    return 0;
  } catch (err) {
    process.stderr.write(`kube-userspace-proxy: ${(err as Error).message}\n`);
    return 1;
  }
}

/**
 * The proxy's flags (not global: a subcommand does not offer them) and the subcommands with theirs.
 * Not strict: a half-typed command line is what it completes.
 */
function completionParser(argv: string[], subcommands: readonly Subcommand[]): Argv {
  let parser = yargs(argv)
    .scriptName('kube-userspace-proxy')
    .parserConfiguration({ 'camel-case-expansion': false, 'boolean-negation': false })
    .help(false)
    .version(false)
    .exitProcess(false);
  for (const [name, option] of proxyFlags()) parser = parser.option(name, { ...option, global: false });
  parser = parser
    .option('help', { type: 'boolean', global: false })
    .option('version', { type: 'boolean', global: false });
  for (const c of subcommands)
    parser = parser.command(c.name, c.describe, (sub) => {
      for (const [name, flag] of Object.entries(c.flags)) sub.option(name, subcommandOption(flag));
      return sub;
    });
  return parser.completion(
    COMPLETION_COMMAND,
    'Print a shell completion script (bash; zsh when $SHELL is zsh)',
  );
}

function subcommandOption(flag: SubcommandFlags[string]): Options {
  return flag.short === undefined ? { type: flag.type } : { type: flag.type, alias: flag.short };
}
