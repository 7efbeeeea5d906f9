// A list kept as its only item when it has one: most Services have one port and one EndpointSlice, most
// slices one port, and a list of one is an array of its own (56 bytes). Pure; imports nothing.

/** One item (an object, never an array), or a list of any other length. */
export type OneOrMore<T extends object> = T | readonly T[];

/** The items of `v`: the list itself, or a new array of its one item (for reads on changes, not per connection). */
export function itemsOf<T extends object>(v: OneOrMore<T>): readonly T[] {
  return Array.isArray(v) ? (v as readonly T[]) : [v as T];
}

/** `list` as kept: its item when it has exactly one, else the list. */
export function keptAs<T extends object>(list: readonly T[]): OneOrMore<T> {
  return list.length === 1 ? list[0]! : list;
}
