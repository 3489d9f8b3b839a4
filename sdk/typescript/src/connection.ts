/**
 * The Worker's connection to one node: its addresses tried in turn with a pause that
 * grows, hello and welcome, heartbeats and pings, the messages queued and sent as frames,
 * and the log of each connection's life (docs/worker-protocol.md, rules 6-7). What the
 * messages are about is the Runner's. In a cluster the Worker holds one per node
 * (cluster.ts, rule 13): the seed, on the configured addresses, and one per member; each
 * claims the Worker's strays at every heartbeat and when another connection drops (rule 14,
 * Runner.strays).
 */
import WebSocket from "ws";

import type { Cluster } from "./cluster";
import * as failpoints from "./failpoints";
import { HistoryCache } from "./history";
import type { ConnectionLog, Log } from "./log";
import * as p from "./protocol";
import { WorkerRefusedError } from "./refused";
import type { Origin, Runner } from "./runner";
import type { Settings } from "./settings";

interface Link {
  ws: WebSocket;
  address: string;
  /** Whether the node answered hello: a standby closes the connection before that. */
  welcomed: boolean;
  /** The next heartbeat, once welcomed. */
  beat: NodeJS.Timeout | null;
  pending: p.WorkerMessage[];
  flushing: boolean;
}

/** The pause before the next connection attempt after ``failures`` failed in a row:
 * exponential from ``initial`` up to ``max`` seconds, with full jitter. */
export function backoff(
  failures: number,
  initial: number,
  max: number,
  random: () => number = Math.random,
): number {
  return random() * Math.min(max, initial * 2 ** failures);
}


export class Connection implements Origin {
  private link: Link | null = null;
  /** The resume token of the last welcome: proves a reconnect is this process (and, in a
   * cluster, a ``claim`` of an attempt handed out under it, on another node). */
  resume: string | null = null;
  /** Seconds between heartbeats: the longest gap, and four per heartbeat timeout. */
  private heartbeatInterval: number;
  private stopping = false;
  private wake: (() => void) | null = null;
  /** The address it is on, or tries, or tried last. */
  address: string;
  /** The nodes its node listed last (welcome, then members), while connected. */
  members: string[] | null = null;
  /** A member that no connected node lists any more: it stops once its connection is down. */
  letGo = false;
  /** Each session's model view, as last handed out on this connection. */
  readonly histories = new HistoryCache();

  constructor(
    private readonly settings: Settings,
    private readonly addresses: string[],
    private readonly runner: Runner,
    private readonly log: Log,
    readonly life: ConnectionLog,
    private readonly cluster: Cluster | null = null,
  ) {
    this.heartbeatInterval = settings.heartbeatInterval;
    this.address = addresses[0];
  }

  /** Whether a welcomed link is up. */
  get linked(): boolean {
    return this.link !== null && this.link.welcomed;
  }

  /** Whether to (re)connect now: not while stopping, nor (in a cluster) while down and
   * listed by no connected node. */
  private wanted(): boolean {
    return !this.stopping && (this.cluster === null || this.cluster.wanted(this));
  }

  /** The seed waits, unwanted, rather than stop. */
  private get seed(): boolean {
    return this.cluster === null || this.cluster.seed === this;
  }

  /** The next address: in turn, but none another of the Worker's connections is on (two
   * connections of one Worker id to one node refuse each other). */
  private nextAddress(counter: { next: number }): string {
    for (let i = 0; i < this.addresses.length; i++) {
      const address = this.addresses[counter.next++ % this.addresses.length];
      if (this.cluster === null || !this.cluster.taken(address, this)) return address;
    }
    return this.address;
  }

  /** Connect, and again whenever the connection drops, until stop(). Rejects with
   * WorkerRefusedError if the server refuses this Worker for good. In a cluster, while no
   * connected node lists its address and it is down, it does not reconnect: a member
   * stops for good (the node left), the seed waits until it is listed again or no node is
   * connected. The attempts handed out on it are strays since its connection dropped
   * (Runner.lost): the node that took their sessions over answers for them. */
  async serveUntilStopped(): Promise<void> {
    const counter = { next: 0 };
    let failures = 0;
    while (!this.stopping) {
      if (!this.wanted()) {
        if (!this.seed) break;
        await this.cluster?.change();
        continue;
      }
      const base = (this.address = this.nextAddress(counter));
      let ws: WebSocket;
      try {
        ws = await this.connect(base);
      } catch (e) {
        if (e instanceof WorkerRefusedError) throw e;
        this.life.failed(base, e instanceof Error ? e.message : String(e));
        await this.pause(backoff(failures++, this.settings.reconnectInitial, this.settings.reconnectMax));
        continue;
      }
      if (this.stopping) {
        // stopped (or let go) while it connected: stop() had no link to close
        ws.close(1000, "worker stopping");
        break;
      }
      failures = 0;
      const { code, reason, welcomed } = await this.serve(ws, base);
      this.members = null;
      this.cluster?.changed();
      if (code === p.CLOSE_ID_IN_USE && this.cluster?.othersLinked(this)) {
        // another connection of this Worker is on that node (a seed through a load balancer)
        this.life.failed(base, `worker_id ${this.settings.workerId} is connected there already`);
        await this.pause(backoff(failures++, this.settings.reconnectInitial, this.settings.reconnectMax));
        continue;
      }
      if (code === p.CLOSE_UNAUTHORIZED || code === p.CLOSE_ID_IN_USE) {
        const why =
          code === p.CLOSE_UNAUTHORIZED
            ? "the token was refused"
            : `another live connection uses worker_id ${this.settings.workerId}`;
        this.log.error("worker.refused", `${base} refused this Worker (${code}: ${why}) ${reason}`, {
          address: base,
        });
        throw new WorkerRefusedError(`${base} refused this Worker (close ${code}): ${why}`);
      }
      if (this.stopping && !this.letGo) return;
      const ended = `the connection closed (${code}${reason === "" ? "" : `: ${reason}`})`;
      if (welcomed) {
        const reconnecting = this.wanted();
        this.life.lost(base, ended, reconnecting);
        if (!reconnecting && !this.seed) return;
      } else {
        this.life.failed(base, ended); // accepted, then closed: a standby, say
      }
      // a node that accepts and closes at once (a standby) is not asked again at once
      await this.pause(this.settings.reconnectInitial * (0.5 + Math.random() / 2));
    }
    if (this.letGo) this.life.letGo(this.address); // let go while it waited to try again
  }

  /** Stop: no new connection, and the live one closes. */
  stop(): void {
    this.stopping = true;
    this.wake?.();
    this.link?.ws.close(1000, "worker stopping");
  }

  /** A member no connected node lists any more, whose connection is down: stop trying it. */
  release(): void {
    this.letGo = true;
    this.stopping = true;
    this.wake?.();
  }

  private pause(seconds: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(done, seconds * 1000);
      function done(): void {
        clearTimeout(timer);
        resolve();
      }
      this.wake = done;
    });
  }

  private connect(base: string): Promise<WebSocket> {
    const url = base.replace(/^http:/, "ws:").replace(/^https:/, "wss:") + "/v1/workers/connect";
    const headers: Record<string, string> =
      this.settings.token === undefined ? {} : { Authorization: `Bearer ${this.settings.token}` };
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(url, {
        headers,
        handshakeTimeout: this.settings.connectTimeout * 1000,
        maxPayload: 64 << 20,
      });
      ws.once("open", () => resolve(ws));
      ws.once("unexpected-response", (_request, response) => {
        const status = response.statusCode ?? 0;
        ws.terminate();
        if (status === 401 || status === 403) {
          const why = status === 401 ? "no worker token" : "a token without the worker role";
          const message =
            `${base} refused this Worker (HTTP ${status}: ${why}): set DEX_WORKER_TOKEN ` +
            "(or the token option) to the server's worker token";
          this.log.error("worker.unauthorized", message, { address: base });
          reject(new WorkerRefusedError(message));
        } else {
          reject(new Error(`HTTP ${status}`));
        }
      });
      ws.once("error", (e) => reject(e));
    });
  }

  private serve(
    ws: WebSocket,
    address: string,
  ): Promise<{ code: number; reason: string; welcomed: boolean }> {
    const link: Link = { ws, address, welcomed: false, beat: null, pending: [], flushing: false };
    ws.on("error", () => undefined); // the close event follows and says how it ended
    this.link = link;
    this.put(link, {
      t: "hello",
      worker_id: this.settings.workerId,
      agents: [...this.runner.agents.values()].map((a) => a.spec()),
      capacity: this.runner.capacity,
      // on a reconnect: re-claim what this process still holds of this connection's
      attempts: this.runner.heldBy(this),
      resume: this.resume,
      history_cache: this.histories.sessions,
      protocol: p.PROTOCOL_VERSION,
    });
    if (this.runner.draining) this.put(link, { t: "drain" });
    // results the last node never acknowledged: send them again (a stray's waits for the
    // node that takes it)
    for (const result of this.runner.unacknowledged(this)) this.put(link, result);
    // a node that hung keeps the TCP connection open: a ping it does not answer ends it
    let answered = true;
    let lastTick = Date.now();
    const ping = setInterval(() => {
      const late = Date.now() - lastTick > 1.5 * this.settings.pingInterval * 1000;
      lastTick = Date.now();
      // this process was blocked (a long synchronous call): the pong may wait unread
      if (!answered && !late) {
        this.log.warning("worker.ping_timeout", "the node did not answer a ping: giving it up", {
          address,
        });
        ws.terminate();
        return;
      }
      answered = false;
      ws.ping();
    }, this.settings.pingInterval * 1000);
    ws.on("pong", () => (answered = true));
    return new Promise((resolve) => {
      ws.on("message", (data) => {
        answered = true;
        let frame: unknown;
        try {
          frame = JSON.parse(data.toString());
        } catch (e) {
          frame = e;
        }
        if (!Array.isArray(frame)) {
          this.log.error("worker.bad_frame", "the server sent a frame that is not a JSON array", {
            address,
          });
          ws.close(p.CLOSE_BAD_FRAME, "a frame is a JSON array of messages");
          return;
        }
        for (const message of frame as p.ServerMessage[]) this.onMessage(link, message);
      });
      ws.once("close", (code, reason) => {
        clearInterval(ping);
        if (link.beat !== null) clearTimeout(link.beat);
        if (this.link === link) this.link = null;
        // a cluster's node may be gone for good: its attempts are strays, claimed at once on
        // the others, not a heartbeat later (a Worker that was blocked sees the drop after
        // its overdue heartbeats, and the node that took their sessions over waits only its
        // reclaim window); a single node's are re-claimed by the next hello
        const cluster = this.cluster !== null && (this.members?.length ?? 0) > 0;
        this.runner.lost(this, cluster);
        if (cluster) for (const other of this.cluster?.connections() ?? []) other.claim();
        resolve({ code, reason: reason.toString(), welcomed: link.welcomed });
      });
    });
  }

  // --- sending ------------------------------------------------------------------------

  /** Claim the Worker's strays on the live link, once welcomed, if its node is a cluster's
   * (it listed members): a single node or a standby needs none, its hello re-claims what
   * this connection holds, and an older node would refuse the frame (rule 14). */
  claim(): void {
    if (this.link === null || !this.link.welcomed || !this.members?.length) return;
    const strays = this.runner.strays();
    if (Object.keys(strays).length > 0) this.put(this.link, { t: "claim", attempts: strays });
  }

  /** Claim the strays and beat every attempt this connection holds, and again every
   * heartbeat interval (the welcome's): at once on the welcome, so that a stray the hello
   * re-claimed is taken by the reply and the result it kept goes out. */
  private heartbeat(link: Link): void {
    if (link.beat !== null) clearTimeout(link.beat);
    link.beat = setTimeout(() => this.heartbeat(link), this.heartbeatInterval * 1000);
    // before the heartbeat, in the same frame: this node may be the one that took a
    // stray's session over, and it answers the claim first
    this.claim();
    // every attempt it holds, with a seq of its own: only the reply to it makes strays
    const beat = this.runner.beat(this);
    if (beat !== null) this.put(link, beat);
  }

  /** Queue a message on the live link; whatever is queued in one tick leaves in one frame. */
  send(message: p.WorkerMessage): void {
    if (this.link !== null) this.put(this.link, message);
  }

  private put(link: Link, message: p.WorkerMessage): void {
    const last = link.pending[link.pending.length - 1];
    if (message.t === "delta" && last?.t === "delta" && last.attempt_id === message.attempt_id) {
      last.text += message.text; // one delta per attempt that waits to be sent
    } else {
      link.pending.push(message.t === "delta" ? { ...message } : message);
    }
    if (!link.flushing) {
      link.flushing = true;
      setImmediate(() => {
        link.flushing = false;
        const batch = link.pending;
        link.pending = [];
        if (batch.length > 0 && link.ws.readyState === WebSocket.OPEN) {
          const results = batch.some((m) => m.t === "done");
          link.ws.send(this.encode(batch), (error) => {
            // written to the socket: a crash from here on loses nothing the server got
            if (results && error == null) failpoints.hit("worker.after_send_result");
          });
        }
      });
    }
  }

  /** The frame of `batch`, where a result JSON cannot carry (a BigInt, a cycle) becomes the
   * attempt's failure: its code ran, so the server decides, as for any exception, whether
   * the call is retried or its outcome is unknown. Thrown here, it would end the process. */
  private encode(batch: p.WorkerMessage[]): string {
    try {
      return JSON.stringify(batch);
    } catch {
      const parts: string[] = [];
      for (const message of batch) {
        try {
          parts.push(JSON.stringify(message));
          continue;
        } catch (e) {
          const problem = `the result cannot be sent as JSON: ${e instanceof Error ? e.message : e}`;
          const failure = this.runner.unencodable(message, problem);
          if (failure !== null) parts.push(JSON.stringify(failure));
        }
      }
      return `[${parts.join(",")}]`;
    }
  }

  // --- receiving ----------------------------------------------------------------------

  private onMessage(link: Link, message: p.ServerMessage): void {
    if (message.t === "members") {
      this.listed(message.members);
      return;
    }
    if (message.t !== "welcome") {
      this.runner.onMessage(message, this);
      return;
    }
    // four beats per timeout: one lost or late beat does not fail an attempt
    const timeout = message.heartbeat_timeout > 0 ? message.heartbeat_timeout : Infinity;
    this.heartbeatInterval = Math.min(this.settings.heartbeatInterval, timeout / 4);
    this.resume = message.resume;
    link.welcomed = true;
    this.life.connected(link.address);
    this.histories.clear(); // the server sends each session's whole view first
    this.runner.welcome(message, this);
    this.listed(message.members ?? []);
    this.heartbeat(link); // at once, not a heartbeat later
  }

  /** The nodes this one says the Worker should be connected to. */
  private listed(members: string[]): void {
    this.members = members.map((m) => m.trim().replace(/\/+$/, "")).filter((m) => m !== "");
    this.cluster?.changed();
  }
}
