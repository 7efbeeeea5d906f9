// The classic YAML alias bomb ("billion laughs"): `levels` levels of 9 aliases each, 9^levels strings
// once expanded. Tests that want the hostile text in front of the reader write it out instead.

export function aliasBomb(levels: number): string {
  const names = 'abcdefghijkl';
  let text = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n';
  for (let i = 1; i < levels; i++) {
    const name = names[i]!;
    const prev = names[i - 1]!;
    text += `${name}: &${name} [${Array(9).fill(`*${prev}`).join(',')}]\n`;
  }
  return text;
}
