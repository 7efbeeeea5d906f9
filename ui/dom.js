// DOM helpers for the console. Everything the proxy sends (service names, paths, server names) is hostile
// input: it only ever becomes a text node (textContent) or a property, never parsed as markup.

/**
 * An element: `props` sets properties (className, title, hidden, colSpan, …) and `dataset` entries,
 * never attributes parsed as markup; children are nodes or text.
 */
export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === 'dataset') Object.assign(el.dataset, v);
    else el[k] = v;
  }
  for (const c of children) if (c !== undefined && c !== null) el.append(c);
  return el;
}

/** Sets the text of `el` when it changed (a poll that changes nothing touches nothing). */
export function setText(el, text) {
  const s = String(text);
  if (el.textContent !== s) el.textContent = s;
}

/** Sets a property when it changed. */
export function setProp(el, name, value) {
  if (el[name] !== value) el[name] = value;
}

/**
 * Makes `parent`'s children exactly `nodes`, in order, moving only what is out of place (so that a row
 * that stays keeps its node, its text selection and its state).
 */
export function placeChildren(parent, nodes) {
  let at = parent.firstChild;
  for (const n of nodes) {
    if (n === at) {
      at = at.nextSibling;
      continue;
    }
    parent.insertBefore(n, at);
  }
  while (at !== null) {
    const next = at.nextSibling;
    at.remove();
    at = next;
  }
}
