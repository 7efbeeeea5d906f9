// How many connections the health and metrics servers hold, in total and per client address, so that
// idle clients cannot take the process's file descriptors. Pure counting: the sockets are http-guard.ts's.

export type ConnectionBudgetLimits = {
  /** Open connections at most; past it a new one is closed at once. */
  readonly maxConnections: number;
  /** Open connections at most from one client address; 0 = no per-client cap. */
  readonly maxConnectionsPerClient: number;
};

/** Why a connection was turned away. */
export type Refusal = 'server-full' | 'client-full';

/**
 * The connections held by one server, or by several that share it (every health check node port shares
 * one). admit() and release() must pair: release once for each admitted connection, when it closes.
 */
export class ConnectionBudget {
  readonly limits: ConnectionBudgetLimits;
  readonly #byClient = new Map<string, number>();
  #open = 0;

  constructor(limits: ConnectionBudgetLimits) {
    this.limits = limits;
  }

  /** Open connections now. */
  get open(): number {
    return this.#open;
  }

  /** Counts a new connection from `client` in and returns undefined, or returns why it is refused. */
  admit(client: string): Refusal | undefined {
    if (this.#open >= this.limits.maxConnections) return 'server-full';
    const mine = this.#byClient.get(client) ?? 0;
    if (this.limits.maxConnectionsPerClient > 0 && mine >= this.limits.maxConnectionsPerClient)
      return 'client-full';
    this.#open++;
    this.#byClient.set(client, mine + 1);
    return undefined;
  }

  /** An admitted connection from `client` closed. */
  release(client: string): void {
    const mine = this.#byClient.get(client) ?? 0;
    if (mine === 0) return;
    this.#open--;
    if (mine === 1) this.#byClient.delete(client);
    else this.#byClient.set(client, mine - 1);
  }
}
