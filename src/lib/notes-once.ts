// Warnings about one object, logged once per distinct set: a resync or an update that changes nothing
// about what is wrong with an object says nothing again. Imports nothing of the project.

/** A short message and key/values (pino style). */
export type Note = readonly [msg: string, fields: Record<string, unknown>];

export class NotesOnce {
  readonly #warn: (msg: string, fields: Record<string, unknown>) => void;
  /** The notes last logged per object id. */
  readonly #last = new Map<string, string>();

  constructor(warn: (msg: string, fields: Record<string, unknown>) => void) {
    this.#warn = warn;
  }

  /** Logs `notes` for `id` unless they are exactly what was logged for it last time; [] forgets it. */
  report(id: string, notes: readonly Note[]): void {
    if (notes.length === 0) {
      this.#last.delete(id);
      return;
    }
    const signature = JSON.stringify(notes);
    if (this.#last.get(id) === signature) return;
    this.#last.set(id, signature);
    for (const [msg, fields] of notes) this.#warn(msg, fields);
  }

  /** The object is gone: its next notes are logged whatever they are. */
  forget(id: string): void {
    this.#last.delete(id);
  }
}
