/**
 * The attempts a Worker runs: the hand-outs it is given, their start acknowledgements
 * and results, and running their models and tools (docs/worker-protocol.md, rules 1-5
 * and 8-11). The Connections carry the messages both ways: in a cluster one per node
 * (rule 13), all sharing this Runner and its capacity; every message about an attempt
 * goes on the connection that handed it out (its origin). When that node dies or gives the
 * session up, the attempt runs on as a stray, claimed on every connection (``claim``) until
 * the node that took its session over answers: it is that connection's from then on, or it
 * stops (rule 14). A stray's result waits for the node that takes it.
 */
import {
  Agent,
  Interrupt,
  MAX_RETRY_AFTER,
  ModelRequest,
  ModelResponse,
  ModelTool,
  PENDING,
  RateLimitedError,
  ToolContext,
  ToolError,
  wireResponse,
  wireSummary,
} from "./agent";
import * as failpoints from "./failpoints";
import { HistoryCache, HistoryError, checkItems } from "./history";
import type { Log } from "./log";
import * as p from "./protocol";
import { checkArguments } from "./schema";
import type { AttemptTracing } from "./tracing";

/** The connection an attempt was handed out on: its messages go back on it, and only its
 * node's messages about it count. */
export interface Origin {
  readonly address: string;
  /** The history views its node sent (``history_base`` counts on them). */
  readonly histories: HistoryCache;
  /** The resume token of its welcome: what a ``claim`` of an attempt it handed out proves
   * itself with. */
  readonly resume: string | null;
  send(message: p.WorkerMessage): void;
}

export interface Attempt {
  step: p.StepMessage;
  origin: Origin;
  history: p.Item[];
  abort: AbortController;
  result: p.Result | null;
  abandoned: boolean;
  /** Resolves the wait for a start acknowledgement (or a refusal). */
  startDecided: ((started: boolean) => void) | null;
  startSeq: number;
  startSentAt: number;
  /** The resume token it was handed out under (its origin's then). */
  resume: string | null;
  /** Its origin may not run it any more: its connection to a cluster's node dropped, or the
   * reply to its connection's beat (``beat``) left it out (the node that handed it out died
   * or gave its session up). Claimed on every connection (``strays``) until a node takes it
   * (``taken``); its result, if it ends meanwhile, waits for that node. */
  stray: boolean;
}

export class Runner {
  readonly agents = new Map<string, Agent>();
  /** The attempts handed out and not yet acknowledged, by id. */
  readonly attempts = new Map<string, Attempt>();
  /** The attempts taken on to run and not stopped: a Step that comes while there are as
   * many as the capacity is handed back at once (another node's Steps took it). */
  private readonly running = new Set<Attempt>();
  /** Steps handed back at once because the capacity was taken. */
  handedBack = 0;
  /** Stopping: start nothing new, and hand back what has not started. */
  draining = false;
  /** Attempts whose code runs now (never more than capacity), and those waiting. */
  private slotsTaken = 0;
  private readonly slotWaiters: (() => void)[] = [];
  /** How long a start acknowledgement may take, in seconds: half the heartbeat timeout. */
  private startWindow = 5;
  /** Numbers the heartbeats that expect a reply of their own: start asks and beats. */
  private seq = 0;
  /** Per connection, its last beat of all it holds (``beat``): its ``seq`` and what it named. */
  private readonly beats = new Map<Origin, { seq: number; attempts: string[] }>();

  constructor(
    agents: Agent[],
    readonly capacity: number,
    private readonly workerId: string,
    private readonly log: Log,
    /** The attempts' spans, when tracing is on. */
    private readonly tracing: AttemptTracing | null,
  ) {
    for (const agent of agents) this.agents.set(agent.name, agent);
  }

  /** The attempts handed out on ``origin`` that this Worker holds. */
  heldBy(origin: Origin): string[] {
    return [...this.attempts.values()].filter((a) => a.origin === origin).map((a) => a.step.attempt_id);
  }

  /** The heartbeat of every attempt ``origin`` holds (null if it holds none), with a ``seq``
   * of its own: an attempt it names that the reply leaves out is a stray. */
  beat(origin: Origin): p.Heartbeat | null {
    const held = this.heldBy(origin);
    if (held.length === 0) return null;
    const seq = this.seq++;
    this.beats.set(origin, { seq, attempts: held });
    return { t: "hb", attempts: held, seq };
  }

  /** The results sent on ``origin`` and not yet acknowledged: sent again on its next
   * connection (a stray's waits for the node that takes it). */
  unacknowledged(origin: Origin): p.Result[] {
    return [...this.attempts.values()].flatMap((a) =>
      a.result === null || a.origin !== origin || a.stray ? [] : [a.result],
    );
  }

  /** ``origin``'s connection dropped: no reply to its last beat will come. If its node is a
   * cluster's (``cluster``: it listed members), its attempts are strays until its node,
   * back, or the node that took their sessions over, answers for them; a single node's are
   * re-claimed by the hello of the next connection. */
  lost(origin: Origin, cluster: boolean): void {
    this.beats.delete(origin);
    if (!cluster) return;
    for (const attempt of this.attempts.values()) if (attempt.origin === origin) attempt.stray = true;
  }

  /** What to ``claim``: each stray attempt, with the token it was handed out under. */
  strays(): Record<string, string> {
    const strays: Record<string, string> = {};
    for (const [id, attempt] of this.attempts) {
      if (attempt.stray && attempt.resume !== null) strays[id] = attempt.resume;
    }
    return strays;
  }

  private mine(id: string, origin: Origin): Attempt | undefined {
    const held = this.attempts.get(id);
    return held?.origin === origin ? held : undefined;
  }

  /** A node welcomed this Worker: its heartbeat timeout, and the attempts it no longer runs. */
  welcome(message: p.Welcome, origin: Origin): void {
    const timeout = message.heartbeat_timeout > 0 ? message.heartbeat_timeout : Infinity;
    this.startWindow = Math.min(5, timeout / 2);
    for (const id of message.stop ?? []) {
      const stopped = this.mine(id, origin);
      if (stopped !== undefined) this.abandon(stopped, "the server no longer runs this attempt");
    }
  }

  /** Drain: start nothing new; an attempt that waits for its start acknowledgement goes back. */
  drain(): void {
    this.draining = true;
    for (const attempt of this.attempts.values()) attempt.startDecided?.(false);
  }

  /** The Worker stopped: the attempts' code is told to stop (through their signals). */
  abortAll(): void {
    for (const attempt of this.attempts.values()) attempt.abort.abort(new Error("worker stopped"));
  }

  /** The failure that replaces a ``done`` whose result JSON cannot carry (a BigInt, a
   * cycle): the attempt's code ran, so the server decides, as for any exception, whether
   * the call is retried or its outcome is unknown. Null for any other message. */
  unencodable(message: p.WorkerMessage, problem: string): p.Fail | null {
    const attempt = "attempt_id" in message ? this.attempts.get(message.attempt_id) : undefined;
    this.log.warning("worker.result_unencodable", problem, { attempt_id: attempt?.step.attempt_id });
    if (message.t !== "done" || attempt === undefined) return null;
    attempt.result = fail(attempt.step, problem, true);
    return attempt.result;
  }

  /** A message from ``origin``'s node about the attempts (anything but its welcome); about
   * an attempt another node handed out, it does nothing, but a ``claimed`` of a stray. */
  onMessage(message: Exclude<p.ServerMessage, p.Welcome | p.Members>, origin: Origin): void {
    switch (message.t) {
      case "step":
        this.onStep(message, origin);
        break;
      case "hb": {
        const beat = this.beats.get(origin);
        if (beat !== undefined && message.seq != null && message.seq === beat.seq) {
          // the reply to the beat of all it held: one it leaves out is a stray (its node gave
          // the session up); a reply to a tool's own beat or a start ask names only those
          for (const id of beat.attempts) {
            const held = this.mine(id, origin);
            if (held !== undefined && !(id in message.status)) held.stray = true;
          }
        }
        for (const [id, status] of Object.entries(message.status)) {
          const held = this.mine(id, origin);
          if (held === undefined) continue;
          if (status === "ok" && held.stray) this.taken(held, origin); // its node, back, owns it
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
      }
      case "ack": {
        const acked = this.mine(message.attempt_id, origin);
        if (acked !== undefined) this.attempts.delete(message.attempt_id);
        if (acked !== undefined && !message.ok) {
          this.log.info("worker.result_refused", `result refused: ${message.error ?? ""}`, {
            attempt_id: message.attempt_id,
          });
        }
        break;
      }
      case "cancel": {
        const cancelled = this.mine(message.attempt_id, origin);
        if (cancelled !== undefined && cancelled.result === null) {
          this.abandon(cancelled, "cancelled by the server");
        }
        break;
      }
      case "claimed":
        this.onClaimed(message, origin);
        break;
    }
  }

  /** A stray is ``origin``'s: the result it kept while no node ran it goes there now. */
  private taken(held: Attempt, origin: Origin): void {
    held.origin = origin;
    held.stray = false;
    if (held.result !== null) origin.send(held.result);
  }

  /** ``origin``'s node took over the sessions of strays it answers for: each is ``origin``'s
   * from now on (its result, if any, goes there), or runs nowhere. */
  private onClaimed(claimed: p.Claimed, origin: Origin): void {
    for (const [id, status] of Object.entries(claimed.status)) {
      const held = this.attempts.get(id);
      if (held === undefined || !held.stray) continue;
      if (status === "ok") {
        this.taken(held, origin);
      } else if (held.result === null) {
        this.abandon(held, "the server no longer runs this attempt");
      } else {
        this.attempts.delete(id);
      }
    }
  }

  private onStep(step: p.StepMessage, origin: Origin): void {
    if (this.attempts.has(step.attempt_id)) return;
    const attempt: Attempt = {
      step,
      origin,
      history: [],
      abort: new AbortController(),
      result: null,
      abandoned: false,
      startDecided: null,
      startSeq: -1,
      startSentAt: 0,
      resume: origin.resume,
      stray: false,
    };
    this.attempts.set(step.attempt_id, attempt);
    try {
      if (step.step_type === "RunModel") {
        const base = step.history_base ?? 0;
        const view = origin.histories.view(step.session_id, base, step.history ?? []);
        if (view === null) {
          // we lack what it builds on: the server sends it whole next time
          this.log.info("worker.history_missing", "the hand-out builds on a view this Worker lacks", {
            attempt_id: step.attempt_id,
            session_id: step.session_id,
          });
          attempt.result = { t: "back", attempt_id: step.attempt_id, reason: "history" };
          origin.send(attempt.result);
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
      origin.send(attempt.result);
      return;
    }
    step.history = undefined; // kept once, in attempt.history
    if (this.running.size >= this.capacity) {
      // other nodes' Steps take the capacity (each node counts only its own): this one
      // goes back at once, to another Worker (its history view is kept, as the node assumes)
      this.handedBack++;
      this.log.debug("worker.handed_back", `capacity taken: handing back ${step.attempt_id}`, {
        attempt_id: step.attempt_id,
        address: origin.address,
      });
      attempt.result = { t: "back", attempt_id: step.attempt_id };
      origin.send(attempt.result);
      return;
    }
    this.running.add(attempt);
    void this.withSlot(attempt, () => this.runAttempt(attempt)).finally(() => this.running.delete(attempt));
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
    this.running.delete(attempt); // its code may run on, holding its slot (withSlot)
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
      worker_id: this.workerId,
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
      } else if (e instanceof RateLimitedError && isModelStep(step)) {
        // the provider refused the call, and nothing ran: the Step goes back, and is
        // handed out again after the wait (no attempt used)
        result = rateLimited(step, e);
        this.log.info("worker.rate_limited", e.message, {
          attempt_id: step.attempt_id,
          session_id: step.session_id,
          retry_after: result.retry_after,
        });
      } else if (e instanceof ToolError) {
        if (isModelStep(step)) {
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
    if (!attempt.stray) attempt.origin.send(result); // a stray's waits (``taken``)
  }

  private async runModel(agent: Agent, attempt: Attempt): Promise<p.ModelResponse> {
    const step = attempt.step;
    const tools = [...agent.tools.values()].map(({ options: o }) => ({
      name: o.name,
      description: o.description ?? "",
      parameters: o.parameters,
    }));
    const request = modelRequest(agent, attempt, tools);
    failpoints.hit("worker.run_model.before_output");
    let response: ModelResponse | null = null;
    for await (const event of agent.model.stream(request)) {
      if (attempt.abandoned) throw attempt.abort.signal.reason;
      if (typeof event === "string") {
        // to its origin now: a stray's may change
        attempt.origin.send({ t: "delta", attempt_id: step.attempt_id, text: event });
      } else {
        response = event;
      }
    }
    if (response === null) {
      throw new Error(`model ${JSON.stringify(agent.model.spec())} returned no response`);
    }
    const approvals: string[] = [];
    for (const call of response.toolCalls ?? []) {
      const approval = agent.tools.get(call.name)?.options.approval;
      if (typeof approval === "function" && needsApproval(this.log, approval, call.arguments ?? {})) {
        approvals.push(call.id);
      }
    }
    return wireResponse(response, approvals);
  }

  private async compact(agent: Agent, attempt: Attempt): Promise<p.Summary> {
    if (agent.model.summarize === undefined) {
      throw new ToolError(`the model of agent ${agent.name} cannot summarize`);
    }
    failpoints.hit("worker.compact_context.running");
    return wireSummary(await agent.model.summarize(modelRequest(agent, attempt, [])));
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
          if (!attempt.stray) attempt.origin.send(attempt.result); // a stray's waits (``taken``)
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
      heartbeat: () => attempt.origin.send({ t: "hb", attempts: [step.attempt_id] }),
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
      if (!attempt.stray) {
        // a stray asks its new origin, once a node claims it
        attempt.origin.send({ t: "hb", attempts: [attempt.step.attempt_id], seq: attempt.startSeq });
      }
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

/** What a model call of ``attempt`` is asked: its view of the history, and ``tools``. */
function modelRequest(agent: Agent, attempt: Attempt, tools: ModelTool[]): ModelRequest {
  const step = attempt.step;
  return {
    sessionId: step.session_id,
    agent: agent.name,
    instructions: agent.instructions,
    history: attempt.history,
    tools,
    attempt: step.attempt,
    signal: attempt.abort.signal,
    traceparent: step.traceparent ?? null,
  };
}

/** Whether ``step`` runs the agent's model (a rate limit hands it back) rather than a tool. */
function isModelStep(step: p.StepMessage): boolean {
  return step.step_type === "RunModel" || step.step_type === "CompactContext";
}

/** The ``back`` of a model Step the provider refused: its wait, if any, within 0..3600 s
 * (one that is no number is left out, and the server's backoff applies). */
function rateLimited(step: p.StepMessage, e: RateLimitedError): p.Back {
  const back: p.Back = { t: "back", attempt_id: step.attempt_id, reason: "rate_limited" };
  const wait = e.retryAfter;
  if (typeof wait === "number" && !Number.isNaN(wait)) {
    back.retry_after = Math.min(Math.max(wait, 0), MAX_RETRY_AFTER);
  }
  return back;
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
