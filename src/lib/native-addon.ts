// Loading one of the Node-API addons of native/ (built by scripts/build-native.ts into
// build/native/<name>.node): its environment switch turns it off, and when it is not there the answer
// says why (not built, another platform, not the addon it should be), so the caller can warn once and go
// on without it.
import { createRequire } from 'node:module';
import path from 'node:path';

/** An addon's calls, or why there are none. */
export type AddonSupport<T> = { calls: T; error?: undefined } | { calls?: undefined; error: string };

/** build/native/: src/lib/ and dist/lib/ are both two levels below the package root. */
const BUILD_DIR = path.resolve(import.meta.dirname, '..', '..', 'build', 'native');

const require = createRequire(import.meta.url);

/**
 * Loads build/native/`name`.node unless `env[offSwitch]` is `off`; its exports must include every one of
 * `functions`.
 */
export function loadAddon<T extends object>(
  name: string,
  offSwitch: string,
  functions: readonly (keyof T & string)[],
  env: NodeJS.ProcessEnv,
): AddonSupport<T> {
  if (env[offSwitch] === 'off') return { error: `turned off (${offSwitch}=off)` };
  if (process.platform !== 'linux') return { error: `not built for ${process.platform}` };
  const file = path.join(BUILD_DIR, `${name}.node`);
  try {
    const calls = require(file) as T;
    for (const fn of functions)
      if (typeof calls[fn] !== 'function') return { error: `${file} is not the ${name} addon` };
    return { calls };
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    return {
      error:
        code === 'MODULE_NOT_FOUND' || code === 'ERR_DLOPEN_FAILED'
          ? `${file} not built (npm run build; needs a C compiler): ${(err as Error).message.split('\n')[0]}`
          : `${file}: ${(err as Error).message}`,
    };
  }
}
