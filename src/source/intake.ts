// The one way from a source into the handlers (the state): each object is validated once, kube-proxy's
// label selection and "this Node only" are applied, every bad or partly ignored object version is logged
// once, and the event goes to the handler for its kind and operation. No I/O but the injected `warn`.

import { ProxyError } from '../lib/errors.ts';
import { LABEL_HEADLESS, LABEL_SERVICE_NAME, LABEL_SERVICE_PROXY_NAME } from '../lib/kubernetes-labels.ts';
import { type Note, NotesOnce } from '../lib/notes-once.ts';
import type { ProxyHandlers } from './handlers.ts';
import type { EndpointSlice, Node, ObjectMeta, Service } from './objects.ts';
import {
  formatProblem,
  hasErrors,
  type Problem,
  validateEndpointSlice,
  validateNode,
  validateService,
} from './validate.ts';

export type Kind = 'Service' | 'EndpointSlice' | 'Node';
export type Op = 'add' | 'update' | 'delete';
export type KubeObject = Service | EndpointSlice | Node;

/** An object with its problems: validated once, by check() or by a source that already had to (manifest). */
export type Checked = {
  readonly kind: Kind;
  readonly object: KubeObject;
  readonly problems: readonly Problem[];
};

/** How the intake reports input it ignores: a short message and key/values (pino style). */
export type Warn = (msg: string, fields: Record<string, unknown>) => void;

export type IntakeOptions = {
  warn: Warn;
  /** This node's name: Node objects with another name are dropped. Undefined or '' = keep every Node. */
  nodeName?: string | undefined;
};

/** The problems of an object of `kind` (validate.ts, by kind). */
export function validate(kind: Kind, object: unknown): Problem[] {
  if (kind === 'Service') return validateService(object);
  if (kind === 'EndpointSlice') return validateEndpointSlice(object);
  return validateNode(object);
}

/** The object with its problems. */
export function check(kind: Kind, object: KubeObject): Checked {
  return { kind, object, problems: validate(kind, object) };
}

/**
 * False for objects kube-proxy's informers never see (its label selector, PROXY_LABEL_SELECTOR): those
 * of another proxy implementation, and slices of headless Services. Nodes are always proxied.
 */
export function isProxied(kind: Kind, object: KubeObject): boolean {
  if (kind === 'Node') return true;
  const labels: unknown = object.metadata?.labels;
  if (typeof labels !== 'object' || labels === null) return true;
  return !Object.hasOwn(labels, LABEL_SERVICE_PROXY_NAME) && !Object.hasOwn(labels, LABEL_HEADLESS);
}

/**
 * Validates, selects, reports and dispatches. Also ProxyHandlers itself, for callers holding unchecked
 * objects (tests, benchmarks): each call is a receive() of the checked object.
 */
export class Intake implements ProxyHandlers {
  readonly #handlers: ProxyHandlers;
  readonly #nodeName: string | undefined;
  // Notes per object (`Kind namespace/name`), so a resync of the same object is quiet.
  readonly #notes: NotesOnce;

  constructor(handlers: ProxyHandlers, options: IntakeOptions) {
    this.#handlers = handlers;
    this.#notes = new NotesOnce(options.warn);
    this.#nodeName = options.nodeName || undefined;
  }

  /**
   * One event. An invalid add or update is dropped (the handlers keep the last good version); a delete
   * needs only a name. Selection works as an informer with a label selector does: an object that stops
   * matching is deleted, one that never matched is not seen. `old` is the source's previous version.
   */
  receive(op: Op, next: Checked, old?: KubeObject): void {
    const { kind, object } = next;
    if (kind === 'Node') {
      const name = object?.metadata?.name;
      if (typeof name !== 'string' || name === '') return;
      if (this.#nodeName !== undefined && name !== this.#nodeName) return;
    } else if (objectKey(object?.metadata) === undefined) {
      const what = op === 'delete' ? 'Ignoring delete of an unnamed object' : undefined;
      if (what !== undefined) this.#notes.report(`${kind} (unnamed)`, [[what, { kind }]]);
      else this.#reportInvalid(kind, undefined, next.problems);
      return;
    }
    const id = `${kind} ${nameOf(kind, object)}`;
    if (op === 'delete') {
      this.#notes.forget(id);
      this.#dispatch('delete', kind, object, object);
      return;
    }
    if (!isProxied(kind, object)) {
      this.#notes.forget(id);
      if (op === 'update' && (old === undefined || isProxied(kind, old)))
        this.#dispatch('delete', kind, object, object);
      return;
    }
    if (hasErrors(next.problems)) {
      this.#reportInvalid(kind, nameOf(kind, object), next.problems);
      return;
    }
    this.#notes.report(id, notesOf(kind, nameOf(kind, object), next));
    this.#dispatch(op, kind, object, old ?? object);
  }

  /** The first complete list of `kind` was delivered. */
  synced(kind: 'Service' | 'EndpointSlice'): void {
    if (kind === 'Service') this.#handlers.onServicesSynced();
    else this.#handlers.onEndpointSlicesSynced();
  }

  #dispatch(op: Op, kind: Kind, object: KubeObject, old: KubeObject): void {
    const h = this.#handlers;
    switch (kind) {
      case 'Service':
        if (op === 'add') h.onServiceAdd(object as Service);
        else if (op === 'update') h.onServiceUpdate(old as Service, object as Service);
        else h.onServiceDelete(object as Service);
        return;
      case 'EndpointSlice':
        if (op === 'add') h.onEndpointSliceAdd(object as EndpointSlice);
        else if (op === 'update') h.onEndpointSliceUpdate(old as EndpointSlice, object as EndpointSlice);
        else h.onEndpointSliceDelete(object as EndpointSlice);
        return;
      case 'Node':
        if (op === 'delete') h.onNodeDelete(object as Node);
        else h.onNodeUpdate(object as Node);
    }
  }

  // One warning per bad object version, naming it and every problem found.
  #reportInvalid(kind: Kind, name: string | undefined, problems: readonly Problem[]): void {
    const object = name ?? '(unnamed)';
    const lines = problems.map(formatProblem);
    const err = new ProxyError('KUP_ERR_INVALID_OBJECT', `${kind} ${object} skipped: ${lines.join('; ')}`);
    const fields = { kind, object, problems: lines, err };
    this.#notes.report(`${kind} ${object}`, [['Ignoring invalid object', fields]]);
  }

  onServiceAdd(service: Service): void {
    this.receive('add', check('Service', service));
  }
  onServiceUpdate(oldService: Service, service: Service): void {
    this.receive('update', check('Service', service), oldService);
  }
  onServiceDelete(service: Service): void {
    this.receive('delete', { kind: 'Service', object: service, problems: [] });
  }
  onServicesSynced(): void {
    this.synced('Service');
  }
  onEndpointSliceAdd(slice: EndpointSlice): void {
    this.receive('add', check('EndpointSlice', slice));
  }
  onEndpointSliceUpdate(oldSlice: EndpointSlice, slice: EndpointSlice): void {
    this.receive('update', check('EndpointSlice', slice), oldSlice);
  }
  onEndpointSliceDelete(slice: EndpointSlice): void {
    this.receive('delete', { kind: 'EndpointSlice', object: slice, problems: [] });
  }
  onEndpointSlicesSynced(): void {
    this.synced('EndpointSlice');
  }
  onNodeUpdate(node: Node): void {
    this.receive('update', check('Node', node));
  }
  onNodeDelete(node: Node): void {
    this.receive('delete', { kind: 'Node', object: node, problems: [] });
  }
}

// `namespace/name`, or undefined when either is missing (such an object cannot be tracked).
function objectKey(meta: ObjectMeta | undefined): string | undefined {
  const namespace = meta?.namespace;
  const name = meta?.name;
  if (typeof namespace !== 'string' || typeof name !== 'string' || namespace === '' || name === '')
    return undefined;
  return `${namespace}/${name}`;
}

function nameOf(kind: Kind, object: KubeObject): string {
  return kind === 'Node'
    ? String(object.metadata?.name)
    : `${object.metadata?.namespace}/${object.metadata?.name}`;
}

// The warnings of a valid object, and a slice that names no Service (kube-proxy's slice cache says so too).
function notesOf(kind: Kind, name: string, { object, problems }: Checked): Note[] {
  const notes: Note[] = [];
  const warnings = problems.filter((p) => p.severity === 'warning');
  if (warnings.length > 0)
    notes.push([
      'Ignoring parts of an object',
      { kind, object: name, problems: warnings.map(formatProblem) },
    ]);
  const slice = kind === 'EndpointSlice' ? (object as EndpointSlice) : undefined;
  const service = slice?.metadata?.labels?.[LABEL_SERVICE_NAME];
  if (slice !== undefined && (service === undefined || service === '') && slice.addressType !== 'FQDN')
    notes.push(['Ignoring EndpointSlice without a service-name label', { kind, object: name }]);
  return notes;
}
