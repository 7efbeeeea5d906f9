// The filter bar shared by the connection table and the trace: service, client, endpoint, protocol, state.
// The table is filtered by the proxy (/ui/api/connections); the trace stream by service and client at the
// proxy (/debug/trace), and by the rest here, with the same meaning.

/** The filter form's values ('' for unset), and a callback for changes. */
export function filterBar(form, onChange) {
  const read = () => Object.fromEntries(new FormData(form).entries());
  let current = read();
  let timer;
  const changed = () => {
    clearTimeout(timer);
    timer = setTimeout(() => {
      const next = read();
      if (JSON.stringify(next) === JSON.stringify(current)) return;
      const before = current;
      current = next;
      onChange(current, before);
    }, 200);
  };
  form.addEventListener('input', changed);
  form.addEventListener('change', changed);
  // The form is never sent anywhere (the CSP forbids it): Enter applies at once, reset clears.
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    changed();
  });
  form.addEventListener('reset', () => setTimeout(changed, 0));
  return {
    get values() {
      return current;
    },
    /** Sets one field (e.g. from a click on a service) and applies it. */
    set(name, value) {
      form.elements.namedItem(name).value = value;
      changed();
    },
  };
}

const IP_OF = /^\[?(.*?)\]?:\d+$/;

function sameEndpoint(key, filter) {
  if (key === null || key === undefined) return false;
  return key === filter || key.replace(IP_OF, '$1') === filter;
}

const EVENT_APP = {
  'http-request': 'http1',
  'http-response': 'http1',
  'dns-query': 'dns',
  'dns-response': 'dns',
  'redis-command': 'redis',
};

/** Whether a trace event passes the filters the proxy did not apply (endpoint, protocol, state). */
export function eventMatches(e, f) {
  if (
    f.endpoint &&
    !sameEndpoint(e.endpoint, f.endpoint) &&
    !(e.attempts ?? []).some((a) => sameEndpoint(a.endpoint, f.endpoint))
  )
    return false;
  if (f.protocol) {
    if (f.protocol === 'TCP' || f.protocol === 'UDP') {
      if (e.protocol !== f.protocol) return false;
    } else if ((e.type === 'closed' ? e.app?.protocol : EVENT_APP[e.type]) !== f.protocol) return false;
  }
  if (f.state === 'closed' && e.type !== 'closed') return false;
  if (f.state === 'active' && e.type === 'closed') return false;
  return true;
}
