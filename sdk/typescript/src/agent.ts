/** Agents, tools and models: what a Worker serves, and the plain data it tells the server. */
import type * as p from "./protocol";
import type { Item, ModelToolCall, ToolKind } from "./protocol";

/** How a Step is tried again after a failed attempt (the server's defaults for a field
 * left out). */
export interface RetryPolicy {
  maxAttempts?: number;
  initialBackoffSeconds?: number;
  backoffMultiplier?: number;
  maxBackoffSeconds?: number;
  /** Give up once this long has passed since the first attempt. */
  withinSeconds?: number;
}

/** What a model call used, as its provider counts it. */
export interface Usage {
  inputTokens?: number;
  outputTokens?: number;
}

/** A model's answer: its text, and the tools it calls (each with its own ``id``). */
export interface ModelResponse {
  text?: string;
  toolCalls?: ModelToolCall[];
  stopReason?: string;
  usage?: Usage;
  /** The ids of the calls a person must approve first (besides the tools' own rules). */
  approvalRequired?: string[];
  /** The provider's own data to keep with the answer (plain JSON). */
  state?: unknown;
}

/** The summary a CompactContext Step asks the model for. */
export interface Summary {
  text: string;
  usage?: Usage;
}

/** A tool as the model is told of it. */
export interface ModelTool {
  name: string;
  description: string;
  /** JSON Schema of the arguments. */
  parameters: Record<string, unknown>;
}

/** What a model is asked: the session's history as the model sees it. */
export interface ModelRequest {
  sessionId: string;
  agent: string;
  instructions: string;
  history: Item[];
  tools: ModelTool[];
  attempt: number;
  signal: AbortSignal;
  /** With tracing on at the server: the W3C ``traceparent`` of the attempt's span there.
   * Make your spans of the call children of it (OpenTelemetry: propagation.extract). */
  traceparent: string | null;
}

/**
 * A model the Worker calls for RunModel (``stream``) and CompactContext (``summarize``).
 * ``stream`` yields text deltas as they arrive, then exactly one ModelResponse.
 */
export interface Model {
  /** Plain data naming the model and its settings (never a key): stored by the server. */
  spec(): Record<string, unknown>;
  stream(request: ModelRequest): AsyncIterable<string | ModelResponse>;
  summarize?(request: ModelRequest): Promise<Summary>;
}

/**
 * The start of the error of a tool call that never ran: it is safe to call again. Compare
 * a call's `error` with it (the same text in every Dex SDK).
 */
export const toolCallNotRunErrorPrefix = "the tool did not run, so it is safe to call again";

/** A known outcome: the tool failed and running it again will not help. */
export class ToolError extends Error {
  override name = "ToolError";
}

/** An error that fails its attempt and the Step for good: no retry, whatever the retry
 * policy (a model call the provider refused for a reason no retry cures, say). A tool's
 * known failure is a ``ToolError`` instead: the model sees it. */
export class NonRetryableError extends Error {
  override name = "NonRetryableError";
  readonly retryable = false;
}

/** An error that says whether the Step may be tried again (default: it may);
 * ``NonRetryableError`` says it may not by its name. */
export class RetryableError extends Error {
  override name = "RetryableError";
  constructor(
    message: string,
    readonly retryable: boolean = true,
  ) {
    super(message);
  }
}

/** The longest wait a ``RateLimitedError`` may ask for, in seconds (an hour), as the
 * protocol's ``back`` allows. */
export const MAX_RETRY_AFTER = 3600;

/**
 * Thrown by a model when its provider refused the call for its rate limit or its load
 * (HTTP 429, Anthropic's 529 overloaded): nothing ran. The Worker hands a RunModel or
 * CompactContext Step back, and the server queues it again without using an attempt,
 * after ``retryAfter`` seconds (the provider's ``Retry-After``; at most an hour) or else a
 * backoff that doubles with each refusal in a row. Thrown by a tool, it is an ordinary
 * failure: a tool's body may have run, and handing it back could run a write twice.
 */
export class RateLimitedError extends Error {
  override name = "RateLimitedError";
  /** Thrown by a tool, the failure may be retried (its retry policy decides). */
  readonly retryable = true;
  constructor(
    message: string,
    /** The wait the provider asked for, in seconds; left out when it named none. */
    readonly retryAfter?: number,
  ) {
    super(message);
  }
}

/** Returned by a task tool's ``poll`` while the task still runs. */
export const PENDING: unique symbol = Symbol("dex.PENDING");

/** Thrown by ``ctx.ask`` and ``ctx.sleep``: the call ends now and runs again later. */
export class Interrupt extends Error {
  override name = "Interrupt";
  constructor(readonly outcome: p.ToolOutcome) {
    super(`tool interrupted: ${outcome.status}`);
  }
}

export interface ToolContext {
  sessionId: string;
  callId: string;
  tool: string;
  /** The same on every attempt of one tool call: key your writes by it. */
  idempotencyKey: string;
  /** 1 on the first attempt, 2 on the next, ... */
  attempt: number;
  /** Aborted when the server stops or cancels the attempt, or the Worker stops. */
  signal: AbortSignal;
  /** With tracing on at the server: the W3C ``traceparent`` of the attempt's span there. */
  traceparent: string | null;
  answers: string[];
  sleepsDone: number;
  /** Ask the user; the call runs again with the answer (let the Interrupt through). */
  ask(question: string, choices?: string[]): string;
  /** Sleep durably; the call runs again when the timer fires. */
  sleep(seconds: number): void;
  /** Tell the server the attempt is alive (the Worker heartbeats on its own too). */
  heartbeat(): void;
}

export interface Checked {
  happened: boolean | null;
  result?: unknown;
}

export type Args = Record<string, unknown>;

export interface ToolOptions<A extends Args = Args> {
  name: string;
  description?: string;
  /**
   * ``read``: no side effects, run again after a crash. ``idempotent_write``: run again
   * with the same idempotency key. ``write``: at most once (outcome_unknown after a
   * crash). ``task``: starts a job, polled with ``poll``.
   */
  kind: ToolKind;
  /** JSON Schema of the arguments. */
  parameters: Record<string, unknown>;
  run: (args: A, ctx: ToolContext) => unknown;
  retry?: RetryPolicy;
  /** Ask a person before running: always, or when the predicate says so (one that
   * throws says yes). */
  approval?: boolean | ((args: A) => boolean);
  /** A task's poll: the result, or PENDING. */
  poll?: (ctx: ToolContext, handle: unknown) => unknown;
  pollIntervalSeconds?: number;
  /** A write's probe: did the call happen? Run after a crash instead of outcome_unknown. */
  check?: (ctx: ToolContext, args: A) => Checked | Promise<Checked>;
  /** At most ``concurrencyLimit`` (default 1) calls under one key at once, across every
   * Worker: a template of the arguments, ``"{customer_id}"`` for one at a time per
   * customer, ``""`` for one key for every call (docs/flow-control.md). */
  concurrencyKey?: string;
  concurrencyLimit?: number;
}

export interface Tool {
  readonly options: ToolOptions;
  /** The tool as the Worker's ``hello`` describes it to the server. */
  spec(): p.ToolSpec;
}

export function defineTool<A extends Args = Args>(options: ToolOptions<A>): Tool {
  if (options.kind === "task" && options.poll === undefined) {
    throw new Error(`tool ${options.name}: a task tool needs a poll function`);
  }
  const opts = options as unknown as ToolOptions;
  return {
    options: opts,
    spec(): p.ToolSpec {
      const spec: p.ToolSpec = {
        name: opts.name,
        description: opts.description ?? "",
        kind: opts.kind,
        parameters: opts.parameters,
        approval:
          opts.approval === undefined || opts.approval === false
            ? "never"
            : opts.approval === true
              ? "always"
              : "predicate",
        has_check: opts.check !== undefined,
      };
      if (opts.retry !== undefined) spec.retry = wireRetry(`tool ${opts.name}: retry`, opts.retry);
      if (opts.pollIntervalSeconds !== undefined) {
        spec.poll_interval_seconds = opts.pollIntervalSeconds;
      }
      if (opts.concurrencyKey !== undefined) {
        spec.concurrency_key = opts.concurrencyKey;
        spec.concurrency_limit = opts.concurrencyLimit ?? 1;
      }
      return spec;
    },
  };
}

export interface AgentOptions {
  name: string;
  instructions?: string;
  model: Model;
  tools?: Tool[];
  modelRetry?: RetryPolicy;
  compactThresholdChars?: number;
  /** What a user message does while a turn of the session runs, unless its send says
   * otherwise (docs/mid-turn.md): ``enqueue`` (the default), ``reject``, ``interrupt``,
   * ``steer``. */
  onBusy?: p.OnBusy;
}

export interface Agent {
  readonly name: string;
  readonly instructions: string;
  readonly model: Model;
  readonly tools: ReadonlyMap<string, Tool>;
  /** The agent as the Worker's ``hello`` describes it to the server. */
  spec(): p.AgentSpec;
}

export function defineAgent(options: AgentOptions): Agent {
  const tools = new Map<string, Tool>();
  for (const tool of options.tools ?? []) {
    if (tools.has(tool.options.name)) {
      throw new Error(`agent ${options.name}: two tools named ${tool.options.name}`);
    }
    tools.set(tool.options.name, tool);
  }
  return {
    name: options.name,
    instructions: options.instructions ?? "",
    model: options.model,
    tools,
    spec(): p.AgentSpec {
      const spec: p.AgentSpec = {
        name: options.name,
        instructions: options.instructions ?? "",
        model: options.model.spec(),
        tools: [...tools.values()].map((t) => t.spec()),
      };
      if (options.modelRetry !== undefined) {
        spec.model_retry = wireRetry(`agent ${options.name}: modelRetry`, options.modelRetry);
      }
      if (options.compactThresholdChars !== undefined) {
        spec.compact_threshold_chars = options.compactThresholdChars;
      }
      if (options.onBusy !== undefined && options.onBusy !== "enqueue") {
        spec.on_busy = options.onBusy; // left out when the default, as the Python Worker does
      }
      return spec;
    },
  };
}

/** Throws when ``value`` has a field of the wire's snake_case spelling (``tool_calls``):
 * from JavaScript, such a field would otherwise be dropped without a word. */
function camelCaseOnly(what: string, value: object, fields: Record<string, string>): void {
  for (const [wire, field] of Object.entries(fields)) {
    if (wire in value) throw new TypeError(`${what}: no field ${wire}; did you mean ${field}?`);
  }
}

/** ``policy`` as the protocol writes it. */
export function wireRetry(what: string, policy: RetryPolicy): p.RetryPolicy {
  camelCaseOnly(what, policy, {
    max_attempts: "maxAttempts",
    initial_backoff_seconds: "initialBackoffSeconds",
    backoff_multiplier: "backoffMultiplier",
    max_backoff_seconds: "maxBackoffSeconds",
    within_seconds: "withinSeconds",
  });
  const wire: p.RetryPolicy = {};
  if (policy.maxAttempts !== undefined) wire.max_attempts = policy.maxAttempts;
  if (policy.initialBackoffSeconds !== undefined) {
    wire.initial_backoff_seconds = policy.initialBackoffSeconds;
  }
  if (policy.backoffMultiplier !== undefined) wire.backoff_multiplier = policy.backoffMultiplier;
  if (policy.maxBackoffSeconds !== undefined) wire.max_backoff_seconds = policy.maxBackoffSeconds;
  if (policy.withinSeconds !== undefined) wire.within_seconds = policy.withinSeconds;
  return wire;
}

function wireUsage(usage: Usage): p.Usage {
  const wire: p.Usage = {};
  if (usage.inputTokens !== undefined) wire.input_tokens = usage.inputTokens;
  if (usage.outputTokens !== undefined) wire.output_tokens = usage.outputTokens;
  return wire;
}

/** A model's ``response`` as the protocol writes it, every field there: a call without
 * arguments gets ``{}``, and ``approvalRequired`` joins ``approvals`` (the calls whose
 * tools' predicates said yes). */
export function wireResponse(response: ModelResponse, approvals: string[]): p.ModelResponse {
  camelCaseOnly("ModelResponse", response, {
    tool_calls: "toolCalls",
    stop_reason: "stopReason",
    approval_required: "approvalRequired",
  });
  const wire: p.ModelResponse = {
    text: response.text ?? "",
    tool_calls: (response.toolCalls ?? []).map((c) => ({ arguments: {}, ...c })),
    stop_reason: response.stopReason ?? "end_turn",
    approval_required: [...(response.approvalRequired ?? []), ...approvals],
  };
  if (response.usage !== undefined) wire.usage = wireUsage(response.usage);
  if (response.state !== undefined) wire.state = response.state;
  return wire;
}

/** A model's ``summary`` as the protocol writes it. */
export function wireSummary(summary: Summary): p.Summary {
  const wire: p.Summary = { text: summary.text };
  if (summary.usage !== undefined) wire.usage = wireUsage(summary.usage);
  return wire;
}
