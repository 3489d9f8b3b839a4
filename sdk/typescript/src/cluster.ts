/**
 * A Worker's connections to the nodes of a cluster (docs/worker-protocol.md, rule 13).
 *
 * Each node of a cluster hands out only the Steps of its own sessions, so a Worker must be
 * connected to every node. The configured addresses are the seed: one connection tries
 * them in turn, as on a single node. A node's welcome (and later members messages) lists
 * the base URLs of every node; the Worker keeps one connection to each it is not
 * connected to yet (the seed counts for the address it is on), each with its own
 * reconnect loop. A member that no connected node lists any more and whose connection is
 * down is let go. The seed stays, but while down it tries again only an address a
 * connected node lists, or once no node is connected. While no node is connected, nothing
 * is let go. All connections share one Runner, so one capacity.
 */
import { Connection } from "./connection";
import { ConnectionLog, Log } from "./log";
import type * as p from "./protocol";
import type { Runner } from "./runner";
import type { Settings } from "./settings";

export class Cluster {
  readonly seed: Connection;
  /** The connections to the nodes the seed is not on, by address. */
  readonly members = new Map<string, Connection>();
  private readonly serving = new Map<Connection, Promise<void>>();
  private stopping = false;
  private waiters: (() => void)[] = [];
  private fail: ((error: unknown) => void) | null = null;

  constructor(
    private readonly settings: Settings,
    private readonly runner: Runner,
    private readonly log: Log,
  ) {
    this.seed = this.connection(settings.addresses);
  }

  private connection(addresses: string[]): Connection {
    const agents = [...this.runner.agents.keys()];
    const life = new ConnectionLog(this.log, this.settings.workerId, agents, this.settings.capacity);
    return new Connection(this.settings, addresses, this.runner, this.log, life, this);
  }

  connections(): Connection[] {
    return [this.seed, ...this.members.values()];
  }

  sendAll(message: p.WorkerMessage): void {
    for (const connection of this.connections()) connection.send(message);
  }

  /** Whether a connection other than ``by`` is on (or tries) ``address``. */
  taken(address: string, by: Connection | null): boolean {
    return this.connections().some((c) => c !== by && c.address === address);
  }

  /** Whether a connection other than ``by`` is up. */
  othersLinked(by: Connection): boolean {
    return this.connections().some((c) => c !== by && c.linked);
  }

  /** The nodes the connected nodes list; null while no node is connected. */
  listed(): Set<string> | null {
    const lists = this.connections().flatMap((c) => (c.linked && c.members !== null ? [c.members] : []));
    return lists.length === 0 ? null : new Set(lists.flat());
  }

  /** Whether ``connection`` should (re)connect: while it is up, while a connected node lists
   * its address, or while no node is connected. */
  wanted(connection: Connection): boolean {
    if (connection.linked) return true;
    const listed = this.listed();
    return listed === null || listed.has(connection.address);
  }

  /** Resolves at the next changed() or stop(). */
  change(): Promise<void> {
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  /** A node listed its members, or a connection came up or went down: connect to every
   * listed node that no connection is on; let go of those no node lists. */
  changed(): void {
    for (const wake of this.waiters.splice(0)) wake();
    if (this.stopping || this.fail === null) return;
    const listed = this.listed();
    if (listed === null) return;
    for (const address of [...listed].sort()) {
      if (!this.taken(address, null)) this.start(address);
    }
    for (const [address, connection] of this.members) {
      if (!connection.linked && !listed.has(address)) connection.release();
    }
  }

  private start(address: string): void {
    const connection = this.connection([address]);
    this.members.set(address, connection);
    const serving = connection.serveUntilStopped().then(
      () => this.ended(connection),
      (error: unknown) => {
        this.ended(connection);
        if (!this.stopping) this.fail?.(error);
      },
    );
    this.serving.set(connection, serving);
  }

  private ended(connection: Connection): void {
    this.serving.delete(connection);
    if (this.members.get(connection.address) === connection) this.members.delete(connection.address);
  }

  /** Serve until stop(); rejects with what made a connection give up for good. */
  async serveUntilStopped(): Promise<void> {
    try {
      await new Promise<void>((resolve, reject) => {
        this.fail = reject;
        this.seed.serveUntilStopped().then(resolve, reject);
      });
    } finally {
      this.stop();
      await Promise.all([...this.serving.values()]);
    }
  }

  /** Close every connection (the Worker has drained). */
  stop(): void {
    this.stopping = true;
    for (const connection of this.connections()) connection.stop();
    for (const wake of this.waiters.splice(0)) wake();
  }
}
