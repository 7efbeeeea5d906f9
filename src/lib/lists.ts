// Comparing lists element by element. Pure; imports nothing of the project.

/** True when `a` and `b` hold the same elements (===) in the same order. */
export function sameList<T>(a: readonly T[], b: readonly T[]): boolean {
  if (a === b) return true;
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}
