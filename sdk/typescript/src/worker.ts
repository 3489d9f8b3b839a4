/**
 * The Worker: one WebSocket to the active node, the attempts it was handed, their
 * heartbeats and results (docs/worker-protocol.md, rules 1-8).
 */
import * as os from "node:os";
import { randomBytes } from "node:crypto";
import WebSocket from "ws";

import { Agent, Interrupt, PENDING, ToolContext, ToolError } from "./agent";
import * as failpoints from "./failpoints";
import { HistoryCache, HistoryError, checkItems } from "./history";
import { ConnectionLog, Log, LogFormat, LogLevel, logFormat, logLevel } from "./log";
import * as p from "./protocol";
import { checkArguments } from "./schema";
import type { AttemptTracing } from "./tracing";

/** The address of ``dex server`` with its default ``--listen``. */
const DEFAULT_ADDRESS = "http://127.0.0.1:7450";

export interface WorkerOptions {
  /** One node's address, several comma-separated, or a list: tried in turn (default:
   * DEX_ADDRESS, else http://127.0.0.1:7450). */
  address?: string | string[];
  agents: Agent[];
  /** How many attempts the server may hand this Worker at once, and how many it runs at
   * once: one beyond it (a stopped attempt's code may still run) waits for a slot. */
  capacity?: number;
  /** The server's worker token (default: DEX_WORKER_TOKEN). */
  token?: string;
  workerId?: string;
  /** Seconds between heartbeats (at most a quarter of the server's heartbeat timeout). */
  heartbeatInterval?: number;
  reconnectInitial?: number;
  reconnectMax?: number;
  connectTimeout?: number;
  /** Seconds between WebSocket pings; a node that does not answer one in time (it hung)
   * is given up and the next address tried. */
  pingInterval?: number;
  /** How long a drain waits for running attempts before the Worker stops anyway. */
  drainTimeout?: number;
  /** Drain on SIGTERM and SIGINT (default true). */
  handleSignals?: boolean;
  /** OpenTelemetry spans of the attempts it runs, under the server's, sent to the global
   * tracer provider (default: DEX_TRACING, else off). */
  tracing?: boolean;
  /** How it logs: console (one line for people, the default) or json (one object a
   * line), as the Python Worker (default: DEX_LOG_FORMAT). */
  logFormat?: LogFormat;
  /** The least level logged: debug, info (the default), warning or error (default:
   * DEX_LOG_LEVEL). */
  logLevel?: LogLevel;
}

/** The server refused this Worker for good (a token, or a worker_id in use): do not retry. */
export class WorkerRefusedError extends Error {
  override name = "WorkerRefusedError";
}

interface Attempt {
  step: p.StepMessage;
  history: p.Item[];
  abort: AbortController;
  result: p.Result | null;
  abandoned: boolean;
  /** Resolves the wait for a start acknowledgement (or a refusal). */
  startDecided: ((started: boolean) => void) | null;
  startSeq: number;
  startSentAt: number;
}

interface Link {
  ws: WebSocket;
  address: string;
  /** Whether the node answered hello: a standby closes the connection before that. */
  welcomed: boolean;
  pending: p.WorkerMessage[];
  flushing: boolean;
}

function env(name: string): string | undefined {
  const value = process.env[name];
  return value === undefined || value === "" ? undefined : value;
}

/** Node's longest timer (2^31 - 1 ms): a longer one would fire at once. */
const MAX_SECONDS = 2_147_483;
const MAX_CAPACITY = 100_000; // as the Python and Go Workers'
const DECIMAL = /^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/;

function badVariable(name: string, value: string, want: string): Error {
  return new Error(`${name}=${JSON.stringify(value)}: ${want}`);
}

/** Seconds from the variable ``name`` (decimals allowed), or ``fallback`` when it is
 * unset or blank: above 0, or 0 or more with ``zeroOk``, as the Python Worker's settings take
 * them. A value that is no number, or out of range, throws an error naming both. */
function envSeconds(name: string, fallback: number, zeroOk = false): number {
  const value = env(name)?.trim();
  if (value === undefined || value === "") return fallback;
  const seconds = DECIMAL.test(value) ? Number(value) : NaN; // NaN fails below
  const inRange = (zeroOk ? seconds >= 0 : seconds > 0) && seconds <= MAX_SECONDS;
  if (!inRange) {
    const want = `a number of seconds${zeroOk ? ", 0 or more" : " above 0"} (at most ${MAX_SECONDS})`;
    throw badVariable(name, value, `want ${want}, such as 0.5`);
  }
  return seconds;
}

const TRUE = ["1", "true", "t", "yes", "y", "on"];
const FALSE = ["0", "false", "f", "no", "n", "off"];

/** A switch from the variable ``name``, or ``fallback`` when it is unset or blank: the
 * words the Python Worker's settings take, in any case. */
function envSwitch(name: string, fallback: boolean): boolean {
  const value = env(name)?.trim();
  if (value === undefined || value === "") return fallback;
  if (TRUE.includes(value.toLowerCase())) return true;
  if (FALSE.includes(value.toLowerCase())) return false;
  throw badVariable(name, value, "want true or false (or 1/0, yes/no, on/off)");
}

/** The Worker's capacity from the variable ``name``: a whole number from 1 to 100,000. */
function envCapacity(name: string, fallback: number): number {
  const value = env(name)?.trim();
  if (value === undefined || value === "") return fallback;
  const count = /^[+]?\d+$/.test(value) ? Number(value) : NaN;
  if (!(count >= 1 && count <= MAX_CAPACITY)) {
    throw badVariable(name, value, `want a whole number from 1 to ${MAX_CAPACITY}`);
  }
  return count;
}

/** An option given in code, checked as its variable is: ``seconds`` above 0 (or 0 or more
 * with ``zeroOk``), ``capacity`` a whole number from 1 to 100,000. */
function optionSeconds(name: string, value: number | undefined, zeroOk = false): number | undefined {
  if (value === undefined) return undefined;
  const inRange =
    typeof value === "number" && (zeroOk ? value >= 0 : value > 0) && value <= MAX_SECONDS;
  if (!inRange) {
    const want = `a number of seconds${zeroOk ? ", 0 or more" : " above 0"} (at most ${MAX_SECONDS})`;
    throw new Error(`WorkerOptions.${name}=${JSON.stringify(value)}: want ${want}`);
  }
  return value;
}

function optionCapacity(value: number | undefined): number | undefined {
  if (value === undefined) return undefined;
  if (!(Number.isInteger(value) && value >= 1 && value <= MAX_CAPACITY)) {
    throw new Error(
      `WorkerOptions.capacity=${JSON.stringify(value)}: want a whole number from 1 to ${MAX_CAPACITY}`,
    );
  }
  return value;
}

/** The tracing module, loaded only when tracing is on: with it off the Worker needs no
 * OpenTelemetry (an optional peer dependency). */
function loadTracing(): typeof import("./tracing") {
  try {
    require.resolve("@opentelemetry/api");
  } catch {
    throw new Error("tracing (DEX_TRACING) needs @opentelemetry/api: npm install @opentelemetry/api");
  }
  return require("./tracing") as typeof import("./tracing");
}

const sleep = (seconds: number): Promise<void> =>
  new Promise((resolve) => setTimeout(resolve, seconds * 1000));

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

export class Worker {
  readonly id: string;
  private readonly addresses: string[];
  private readonly agents = new Map<string, Agent>();
  private readonly capacity: number;
  private readonly token: string | undefined;
  private readonly heartbeatMax: number;
  private readonly reconnectInitial: number;
  private readonly reconnectMax: number;
  private readonly connectTimeout: number;
  private readonly pingInterval: number;
  private readonly drainTimeout: number;
  private readonly handleSignals: boolean;
  /** The attempts' spans, when tracing is on. */
  private readonly tracing: AttemptTracing | null;
  private readonly log: Log;
  private readonly connection: ConnectionLog;
  /** Why the Worker drains: shutdown (called in code), or a signal's name. */
  private stopReason = "shutdown";

  private readonly attempts = new Map<string, Attempt>();
  private readonly histories = new HistoryCache();
  /** Attempts whose code runs now (never more than capacity), and those waiting. */
  private slotsTaken = 0;
  private readonly slotWaiters: (() => void)[] = [];
  private link: Link | null = null;
  private resume: string | null = null;
  private heartbeatInterval: number;
  private startWindow = 5;
  private seq = 0;
  private draining = false;
  private stopping = false;
  private wake: (() => void) | null = null;
  private running: Promise<void> | null = null;
  private shuttingDown: Promise<void> | null = null;

  constructor(options: WorkerOptions) {
    const address = options.address ?? env("DEX_ADDRESS") ?? DEFAULT_ADDRESS;
    this.addresses = (Array.isArray(address) ? address : address.split(","))
      .map((a) => a.trim().replace(/\/+$/, ""))
      .filter((a) => a !== "");
    if (this.addresses.length === 0) throw new Error("no server address (address or DEX_ADDRESS)");
    for (const agent of options.agents) this.agents.set(agent.name, agent);
    this.capacity = optionCapacity(options.capacity) ?? envCapacity("DEX_WORKER_CAPACITY", 16);
    this.token = options.token ?? env("DEX_WORKER_TOKEN");
    this.id =
      options.workerId ??
      env("DEX_WORKER_ID") ??
      `${os.hostname()}-${process.pid}-${randomBytes(3).toString("hex")}`;
    this.heartbeatMax =
      optionSeconds("heartbeatInterval", options.heartbeatInterval) ??
      envSeconds("DEX_WORKER_HEARTBEAT_INTERVAL", 1.0);
    this.heartbeatInterval = this.heartbeatMax;
    this.reconnectInitial =
      optionSeconds("reconnectInitial", options.reconnectInitial) ??
      envSeconds("DEX_WORKER_RECONNECT_INITIAL", 0.1);
    this.reconnectMax = optionSeconds("reconnectMax", options.reconnectMax) ??
      envSeconds("DEX_WORKER_RECONNECT_MAX", 1.0);
    this.connectTimeout = optionSeconds("connectTimeout", options.connectTimeout) ??
      envSeconds("DEX_WORKER_CONNECT_TIMEOUT", 3.0);
    this.pingInterval = optionSeconds("pingInterval", options.pingInterval) ??
      envSeconds("DEX_WORKER_PING_INTERVAL", 2.0);
    this.drainTimeout = optionSeconds("drainTimeout", options.drainTimeout, true) ??
      envSeconds("DEX_DRAIN_TIMEOUT", 30.0, true);
    this.handleSignals = options.handleSignals ?? true;
    const tracing = options.tracing ?? envSwitch("DEX_TRACING", false);
    this.tracing = tracing ? new (loadTracing().AttemptTracing)(this.id) : null;
    this.log = new Log(
      options.logFormat !== undefined
        ? logFormat(options.logFormat, "WorkerOptions.logFormat")
        : logFormat(env("DEX_LOG_FORMAT")),
      options.logLevel !== undefined
        ? logLevel(options.logLevel, "WorkerOptions.logLevel")
        : logLevel(env("DEX_LOG_LEVEL")),
    );
    this.connection = new ConnectionLog(this.log, this.id, [...this.agents.keys()], this.capacity);
  }

  /** Serve until shutdown(). Rejects with WorkerRefusedError if the server refuses us. */
  run(): Promise<void> {
    if (this.running === null) this.running = this.runOnce();
    return this.running;
  }

  /** Drain: no new hand-outs, running attempts finish, unstarted ones go back. */
  shutdown(timeout: number = this.drainTimeout): Promise<void> {
    if (this.shuttingDown === null) this.shuttingDown = this.drain(timeout);
    return this.shuttingDown;
  }

  private async runOnce(): Promise<void> {
    const onSignal = (signal: NodeJS.Signals): void => {
      if (this.shuttingDown === null) this.stopReason = signal;
      void this.shutdown();
    };
    if (this.handleSignals) {
      process.on("SIGTERM", onSignal);
      process.on("SIGINT", onSignal);
    }
    try {
      await this.connectLoop();
      this.connection.stopped(this.stopReason);
    } catch (e) {
      this.connection.stopped("error", e instanceof Error ? e.message : String(e));
      throw e;
    } finally {
      process.off("SIGTERM", onSignal);
      process.off("SIGINT", onSignal);
      for (const attempt of this.attempts.values()) attempt.abort.abort(new Error("worker stopped"));
    }
  }

  private async drain(timeout: number): Promise<void> {
    this.log.info(
      "worker.draining",
      `draining: taking no new Steps, finishing ${this.attempts.size} running attempts within ${timeout}s`,
      { running: this.attempts.size, timeout },
    );
    this.draining = true;
    this.send({ t: "drain" });
    for (const attempt of this.attempts.values()) attempt.startDecided?.(false);
    const deadline = Date.now() + timeout * 1000;
    while (this.attempts.size > 0 && Date.now() < deadline) await sleep(0.02);
    this.stopping = true;
    this.wake?.();
    this.link?.ws.close(1000, "worker stopping");
    await this.running;
  }

  // --- connecting ---------------------------------------------------------------------

  private async connectLoop(): Promise<void> {
    let next = 0;
    let failures = 0;
    while (!this.stopping) {
      const base = this.addresses[next++ % this.addresses.length];
      let ws: WebSocket;
      try {
        ws = await this.connect(base);
      } catch (e) {
        if (e instanceof WorkerRefusedError) throw e;
        this.connection.failed(base, e instanceof Error ? e.message : String(e));
        await this.pause(backoff(failures++, this.reconnectInitial, this.reconnectMax));
        continue;
      }
      failures = 0;
      const { code, reason, welcomed } = await this.serve(ws, base);
      if (code === p.CLOSE_UNAUTHORIZED || code === p.CLOSE_ID_IN_USE) {
        const why =
          code === p.CLOSE_UNAUTHORIZED
            ? "the token was refused"
            : `another live connection uses worker_id ${this.id}`;
        this.log.error("worker.refused", `${base} refused this Worker (${code}: ${why}) ${reason}`, {
          address: base,
        });
        throw new WorkerRefusedError(`${base} refused this Worker (close ${code}): ${why}`);
      }
      if (this.stopping) break;
      const ended = `the connection closed (${code}${reason === "" ? "" : `: ${reason}`})`;
      if (welcomed) this.connection.lost(base, ended);
      else this.connection.failed(base, ended); // accepted, then closed: a standby, say
      // a node that accepts and closes at once (a standby) is not asked again at once
      await this.pause(this.reconnectInitial * (0.5 + Math.random() / 2));
    }
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
      this.token === undefined ? {} : { Authorization: `Bearer ${this.token}` };
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(url, {
        headers,
        handshakeTimeout: this.connectTimeout * 1000,
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
    const link: Link = { ws, address, welcomed: false, pending: [], flushing: false };
    ws.on("error", () => undefined); // the close event follows and says how it ended
    this.link = link;
    this.put(link, {
      t: "hello",
      worker_id: this.id,
      agents: [...this.agents.values()].map((a) => a.spec()),
      capacity: this.capacity,
      // on a reconnect: re-claim what this process still holds
      attempts: [...this.attempts.keys()],
      resume: this.resume,
      history_cache: this.histories.sessions,
      protocol: p.PROTOCOL_VERSION,
    });
    if (this.draining) this.put(link, { t: "drain" });
    // results the last node never acknowledged: send them again
    for (const attempt of this.attempts.values()) {
      if (attempt.result !== null) this.put(link, attempt.result);
    }
    let beat: NodeJS.Timeout | null = null;
    const heartbeat = (): void => {
      beat = setTimeout(heartbeat, this.heartbeatInterval * 1000);
      if (this.attempts.size > 0) this.put(link, { t: "hb", attempts: [...this.attempts.keys()] });
    };
    heartbeat();
    // a node that hung keeps the TCP connection open: a ping it does not answer ends it
    let answered = true;
    let lastTick = Date.now();
    const ping = setInterval(() => {
      const late = Date.now() - lastTick > 1.5 * this.pingInterval * 1000;
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
    }, this.pingInterval * 1000);
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
        if (beat !== null) clearTimeout(beat);
        if (this.link === link) this.link = null;
        resolve({ code, reason: reason.toString(), welcomed: link.welcomed });
      });
    });
  }

  // --- sending ------------------------------------------------------------------------

  /** Queue a message on the live link; whatever is queued in one tick leaves in one frame. */
  private send(message: p.WorkerMessage): void {
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
          const attempt = "attempt_id" in message ? this.attempts.get(message.attempt_id) : undefined;
          this.log.warning("worker.result_unencodable", problem, { attempt_id: attempt?.step.attempt_id });
          if (message.t === "done" && attempt !== undefined) {
            attempt.result = fail(attempt.step, problem, true);
            parts.push(JSON.stringify(attempt.result));
          }
        }
      }
      return `[${parts.join(",")}]`;
    }
  }

  // --- receiving ----------------------------------------------------------------------

  private onMessage(link: Link, message: p.ServerMessage): void {
    switch (message.t) {
      case "welcome": {
        // four beats per timeout: one lost or late beat does not fail an attempt
        const timeout = message.heartbeat_timeout > 0 ? message.heartbeat_timeout : Infinity;
        this.heartbeatInterval = Math.min(this.heartbeatMax, timeout / 4);
        this.startWindow = Math.min(5, timeout / 2);
        this.resume = message.resume;
        this.histories.clear(); // the server sends each session's whole view first
        link.welcomed = true;
        this.connection.connected(link.address);
        for (const id of message.stop ?? []) {
          const stopped = this.attempts.get(id);
          if (stopped !== undefined) this.abandon(stopped, "the server no longer runs this attempt");
        }
        break;
      }
      case "step":
        this.onStep(message);
        break;
      case "hb":
        for (const [id, status] of Object.entries(message.status)) {
          const held = this.attempts.get(id);
          if (held === undefined) continue;
          if (held.startDecided !== null) {
            if (status !== "ok") held.startDecided(false);
            else if (
              message.seq != null &&
              message.seq === held.startSeq &&
              (Date.now() - held.startSentAt) / 1000 <= this.startWindow
            ) {
              held.startDecided(true); // a timely answer to our own ask
            }
          } else if (status !== "ok" && held.result === null) {
            this.abandon(held, "the server no longer runs this attempt");
          }
        }
        break;
      case "ack": {
        const acked = this.attempts.get(message.attempt_id);
        if (acked !== undefined) this.attempts.delete(message.attempt_id);
        if (acked !== undefined && !message.ok) {
          this.log.info("worker.result_refused", `result refused: ${message.error ?? ""}`, {
            attempt_id: message.attempt_id,
          });
        }
        break;
      }
      case "cancel": {
        const cancelled = this.attempts.get(message.attempt_id);
        if (cancelled !== undefined && cancelled.result === null) {
          this.abandon(cancelled, "cancelled by the server");
        }
        break;
      }
    }
  }

  private onStep(step: p.StepMessage): void {
    if (this.attempts.has(step.attempt_id)) return;
    const attempt: Attempt = {
      step,
      history: [],
      abort: new AbortController(),
      result: null,
      abandoned: false,
      startDecided: null,
      startSeq: -1,
      startSentAt: 0,
    };
    this.attempts.set(step.attempt_id, attempt);
    try {
      if (step.step_type === "RunModel") {
        const base = step.history_base ?? 0;
        const view = this.histories.view(step.session_id, base, step.history ?? []);
        if (view === null) {
          // we lack what it builds on: the server sends it whole next time
          this.log.info("worker.history_missing", "the hand-out builds on a view this Worker lacks", {
            attempt_id: step.attempt_id,
            session_id: step.session_id,
          });
          attempt.result = { t: "back", attempt_id: step.attempt_id, reason: "history" };
          this.send(attempt.result);
          return;
        }
        attempt.history = view;
      } else if (step.step_type === "CompactContext") {
        attempt.history = checkItems(step.history ?? []); // the whole view, every time
      }
    } catch (e) {
      if (!(e instanceof HistoryError)) throw e;
      const why = `the hand-out's history does not fit the protocol: ${e.message}`;
      attempt.result = fail(step, why, false);
      this.send(attempt.result);
      return;
    }
    step.history = undefined; // kept once, in attempt.history
    void this.withSlot(attempt, () => this.runAttempt(attempt));
  }

  /**
   * Run ``body`` once fewer than ``capacity`` attempts' code runs. The code of an
   * abandoned attempt may run on (JavaScript cannot stop it): its slot stays taken until
   * it returns.
   */
  private async withSlot(attempt: Attempt, body: () => Promise<void>): Promise<void> {
    if (this.slotsTaken < this.capacity) {
      this.slotsTaken++;
    } else {
      this.log.info("worker.at_capacity", `waiting for a slot (capacity ${this.capacity})`, {
        attempt_id: attempt.step.attempt_id,
        session_id: attempt.step.session_id,
      });
      await new Promise<void>((resolve) => this.slotWaiters.push(resolve)); // handed a slot
    }
    try {
      if (!attempt.abandoned) await body();
    } finally {
      const next = this.slotWaiters.shift();
      if (next !== undefined) next();
      else this.slotsTaken--;
    }
  }

  private abandon(attempt: Attempt, why: string): void {
    this.log.info("worker.attempt_abandoned", why, { attempt_id: attempt.step.attempt_id });
    this.attempts.delete(attempt.step.attempt_id);
    attempt.abandoned = true;
    attempt.startDecided?.(false);
    attempt.abort.abort(new Error(why));
  }

  // --- running one attempt ------------------------------------------------------------

  private async runAttempt(attempt: Attempt): Promise<void> {
    const step = attempt.step;
    const ids = {
      session_id: step.session_id,
      step_id: step.step_id,
      attempt_id: step.attempt_id,
      worker_id: this.id,
    };
    let result: p.Result | null;
    try {
      const agent = this.agents.get(step.agent);
      if (agent === undefined) throw new ToolError(`this Worker does not serve agent ${step.agent}`);
      const run = (): Promise<p.Done["result"] | null> => {
        if (step.step_type === "RunModel") return this.runModel(agent, attempt);
        if (step.step_type === "CompactContext") return this.compact(agent, attempt);
        return this.runTool(agent, attempt);
      };
      const value =
        this.tracing === null
          ? await run()
          : await this.tracing.span(step, agent.model.spec(), () => attempt.abandoned, run);
      if (value === null) return;
      failpoints.hit("worker.before_send_result");
      result = { t: "done", attempt_id: step.attempt_id, result: value };
    } catch (e) {
      if (attempt.abandoned) return;
      if (e instanceof Interrupt) {
        result = { t: "done", attempt_id: step.attempt_id, result: e.outcome };
      } else if (e instanceof ToolError) {
        if (step.step_type === "RunModel" || step.step_type === "CompactContext") {
          result = fail(step, e.message, false);
        } else {
          const outcome: p.ToolOutcome =
            step.step_type === "CheckToolCall"
              ? { status: "checked", happened: null, error: e.message }
              : { status: "failed", error: e.message };
          result = { t: "done", attempt_id: step.attempt_id, result: outcome };
        }
      } else {
        const error = e instanceof Error ? e : new Error(String(e));
        this.log.warning(
          "worker.attempt_failed",
          `${step.step_type} attempt ${step.attempt} of ${step.tool ?? step.agent} failed: ` +
            `${error.name}: ${error.message}`,
          ids,
        );
        const retryable = (error as { retryable?: unknown }).retryable;
        result = fail(step, `${error.name}: ${error.message}`, retryable !== false);
      }
    }
    if (attempt.abandoned) return; // stopped or cancelled meanwhile: no result is wanted
    attempt.result = result;
    this.send(result);
  }

  private async runModel(agent: Agent, attempt: Attempt): Promise<p.ModelResponse> {
    const step = attempt.step;
    const request = {
      sessionId: step.session_id,
      agent: agent.name,
      instructions: agent.instructions,
      history: attempt.history,
      tools: [...agent.tools.values()].map((t) => t.spec()),
      attempt: step.attempt,
      signal: attempt.abort.signal,
      traceparent: step.traceparent ?? null,
    };
    failpoints.hit("worker.run_model.before_output");
    let response: p.ModelResponse | null = null;
    for await (const event of agent.model.stream(request)) {
      if (attempt.abandoned) throw attempt.abort.signal.reason;
      if (typeof event === "string") {
        this.send({ t: "delta", attempt_id: step.attempt_id, text: event });
      } else {
        response = event;
      }
    }
    if (response === null) {
      throw new Error(`model ${JSON.stringify(agent.model.spec())} returned no response`);
    }
    const approvalRequired = [...(response.approval_required ?? [])];
    for (const call of response.tool_calls ?? []) {
      const approval = agent.tools.get(call.name)?.options.approval;
      if (typeof approval === "function" && needsApproval(this.log, approval, call.arguments ?? {})) {
        approvalRequired.push(call.id);
      }
    }
    return {
      text: "",
      stop_reason: "end_turn",
      ...response,
      tool_calls: (response.tool_calls ?? []).map((c) => ({ arguments: {}, ...c })),
      approval_required: approvalRequired,
    };
  }

  private async compact(agent: Agent, attempt: Attempt): Promise<p.Summary> {
    if (agent.model.summarize === undefined) {
      throw new ToolError(`the model of agent ${agent.name} cannot summarize`);
    }
    const step = attempt.step;
    failpoints.hit("worker.compact_context.running");
    return agent.model.summarize({
      sessionId: step.session_id,
      agent: agent.name,
      instructions: agent.instructions,
      history: attempt.history,
      tools: [],
      attempt: step.attempt,
      signal: attempt.abort.signal,
      traceparent: step.traceparent ?? null,
    });
  }

  private async runTool(agent: Agent, attempt: Attempt): Promise<p.ToolOutcome | null> {
    const step = attempt.step;
    const tool = agent.tools.get(step.tool ?? "");
    if (tool === undefined) {
      throw new ToolError(`this Worker's agent ${agent.name} has no tool ${step.tool ?? ""}`);
    }
    // invalid arguments: the body never runs; valid ones gain their parameters' defaults
    const args = checkArguments(tool.options.name, tool.options.parameters, step.arguments ?? {});
    failpoints.hit("worker.before_first_heartbeat");
    if (step.needs_start_ack || this.draining) {
      if (!(await this.startAcknowledged(attempt))) {
        if (attempt.abandoned) return null;
        if (this.draining) {
          attempt.result = { t: "back", attempt_id: step.attempt_id };
          this.send(attempt.result);
        } else {
          this.log.info("worker.start_refused", "the server no longer runs this attempt: not starting it", {
            attempt_id: step.attempt_id,
          });
          this.attempts.delete(step.attempt_id);
        }
        return null;
      }
    }
    const answers = [...(step.answers ?? [])];
    const sleepsDone = step.sleeps_done ?? 0;
    let asked = 0;
    let slept = 0;
    const ctx: ToolContext = {
      sessionId: step.session_id,
      callId: step.call_id ?? "",
      tool: tool.options.name,
      idempotencyKey: step.idempotency_key ?? "",
      attempt: step.attempt,
      signal: attempt.abort.signal,
      traceparent: step.traceparent ?? null,
      answers,
      sleepsDone,
      ask(question: string, choices?: string[]): string {
        const index = asked++;
        if (index < answers.length) return answers[index];
        throw new Interrupt({ status: "asked", question, choices: choices ?? null });
      },
      sleep(seconds: number): void {
        if (slept++ < sleepsDone) return;
        throw new Interrupt({ status: "sleep", sleep_seconds: seconds });
      },
      heartbeat: () => this.send({ t: "hb", attempts: [step.attempt_id] }),
    };
    if (step.step_type === "PollToolTask") {
      if (tool.options.poll === undefined) throw new ToolError(`tool ${tool.options.name} has no poll`);
      failpoints.hit("worker.poll_running");
      const value = await tool.options.poll(ctx, step.task_handle);
      return value === PENDING ? { status: "pending" } : { status: "succeeded", result: value ?? null };
    }
    if (step.step_type === "CheckToolCall") {
      if (tool.options.check === undefined) {
        throw new ToolError(`tool ${tool.options.name} has no check`);
      }
      const verdict = await tool.options.check(ctx, args);
      return { status: "checked", happened: verdict.happened, result: verdict.result ?? null };
    }
    if (step.step_type !== "CallTool" && step.step_type !== "CallSingleAttemptTool") {
      throw new ToolError(`a Worker does not run ${step.step_type} Steps`);
    }
    failpoints.hit("worker.tool_running");
    const value = await tool.options.run(args, ctx);
    return { status: "succeeded", result: value ?? null };
  }

  /**
   * Ask the node whether to start (an hb with a seq of ours) until it answers in time:
   * an ``ok`` later than half the heartbeat timeout (a node that paused, and may have lost
   * its lease meanwhile) does not count.
   */
  private async startAcknowledged(attempt: Attempt): Promise<boolean> {
    if (this.draining) return false;
    let decided: boolean | null = null;
    const verdict = new Promise<boolean>((resolve) => {
      attempt.startDecided = (started: boolean): void => {
        decided = started;
        resolve(started);
      };
    });
    while (decided === null) {
      attempt.startSeq = this.seq++;
      attempt.startSentAt = Date.now();
      this.send({ t: "hb", attempts: [attempt.step.attempt_id], seq: attempt.startSeq });
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        verdict,
        new Promise<void>((resolve) => (timer = setTimeout(resolve, this.startWindow * 1000))),
      ]);
      clearTimeout(timer);
    }
    attempt.startDecided = null;
    return decided;
  }
}

function fail(step: p.StepMessage, message: string, retryable: boolean): p.Fail {
  return {
    t: "fail",
    attempt_id: step.attempt_id,
    error: { message, retryable, attempt_progress: "NOT_COMPLETED" },
  };
}

/** Whether a call waits for a person's approval: a predicate that throws says yes. */
function needsApproval(
  log: Log,
  predicate: (args: Record<string, unknown>) => boolean,
  args: Record<string, unknown>,
): boolean {
  try {
    return Boolean(predicate(args));
  } catch (e) {
    const why = `the approval predicate threw (a person approves): ${String(e)}`;
    log.warning("worker.approval_predicate_failed", why);
    return true;
  }
}
