/**
 * The messages of the Dex Worker protocol (docs/worker-protocol.md), as TypeScript types.
 * Only plain data: every frame is a JSON array of these.
 */

export type ToolKind = "read" | "idempotent_write" | "write" | "task";
export type Approval = "never" | "always" | "predicate";

export interface RetryPolicy {
  max_attempts?: number;
  initial_backoff_seconds?: number;
  backoff_multiplier?: number;
  max_backoff_seconds?: number;
  within_seconds?: number;
}

export interface ToolSpec {
  name: string;
  description?: string;
  kind?: ToolKind;
  parameters?: Record<string, unknown>;
  approval?: Approval;
  has_check?: boolean;
  poll_interval_seconds?: number;
  retry?: RetryPolicy;
  concurrency_key?: string;
  concurrency_limit?: number;
}

export interface AgentSpec {
  name: string;
  instructions?: string;
  model?: Record<string, unknown>;
  tools?: ToolSpec[];
  model_retry?: RetryPolicy;
  compact_threshold_chars?: number | null;
  on_busy?: OnBusy;
}

/** What a user message does while a turn runs (docs/mid-turn.md). */
export type OnBusy = "enqueue" | "reject" | "interrupt" | "steer";

export type ToolCallStatus =
  | "pending"
  | "running"
  | "succeeded"
  | "failed"
  | "outcome_unknown"
  | "denied";

export interface ModelToolCall {
  id: string;
  name: string;
  arguments?: Record<string, unknown>;
}

export type Item =
  | { type: "user"; text: string }
  | { type: "assistant"; text?: string; tool_calls?: ModelToolCall[]; state?: unknown }
  | {
      type: "tool_result";
      call_id: string;
      name: string;
      status: ToolCallStatus;
      result?: unknown;
      error?: string | null;
    }
  | { type: "note"; text: string }
  | { type: "summary"; text: string };

export interface Usage {
  input_tokens?: number;
  output_tokens?: number;
}

/** The result of a RunModel attempt. */
export interface ModelResponse {
  text?: string;
  tool_calls?: ModelToolCall[];
  stop_reason?: string;
  usage?: Usage;
  approval_required?: string[];
  state?: unknown;
}

/** The result of a CompactContext attempt. */
export interface Summary {
  text: string;
  usage?: Usage;
}

/** The result of a tool Step (CallTool, CallSingleAttemptTool, PollToolTask, CheckToolCall). */
export interface ToolOutcome {
  status: "succeeded" | "failed" | "asked" | "sleep" | "pending" | "checked";
  result?: unknown;
  error?: string | null;
  question?: string | null;
  choices?: string[] | null;
  sleep_seconds?: number | null;
  happened?: boolean | null;
}

export type AttemptProgress = "UNSPECIFIED" | "NOT_STARTED" | "NOT_COMPLETED";

export interface RecoveryError {
  message: string;
  retryable?: boolean;
  attempt_progress?: AttemptProgress;
}

export type StepType =
  | "RunModel"
  | "CallTool"
  | "CallSingleAttemptTool"
  | "PollToolTask"
  | "CheckToolCall"
  | "CompactContext"
  | "AwaitToolApproval"
  | "AwaitQuestionAnswer"
  | "AwaitTimer"
  | "AwaitBudget";

// --- Worker → server --------------------------------------------------------------

export interface Hello {
  t: "hello";
  worker_id: string;
  agents: AgentSpec[];
  capacity: number;
  attempts: string[];
  resume: string | null;
  history_cache: number;
  protocol: number;
}
export interface Heartbeat {
  t: "hb";
  attempts: string[];
  seq?: number | null;
}
export interface Delta {
  t: "delta";
  attempt_id: string;
  text: string;
}
export interface Done {
  t: "done";
  attempt_id: string;
  result: ModelResponse | Summary | ToolOutcome;
}
export interface Fail {
  t: "fail";
  attempt_id: string;
  error: RecoveryError;
}
/** The Worker hands back an attempt it never started (or whose model the provider
 * refused): the Step queues again and the attempt is not counted. ``reason: "history"``:
 * the Worker lacks the history the hand-out builds on. ``reason: "rate_limited"``: the
 * model provider refused the call for its rate limit or its load (nothing ran); the Step
 * is handed out again after ``retry_after`` seconds (0 to 3600), or, without it, after a
 * backoff that doubles with each refusal in a row (1 s to 60 s). */
export interface Back {
  t: "back";
  attempt_id: string;
  reason?: "history" | "rate_limited" | null;
  /** With ``rate_limited``: the provider's ``Retry-After``, in seconds (0 to 3600). */
  retry_after?: number | null;
}
export interface Drain {
  t: "drain";
}
/** In a cluster: the Worker's strays, each with the ``resume`` token of the welcome of the
 * connection it was handed out on (docs/worker-protocol.md, rule 14). */
export interface Claim {
  t: "claim";
  attempts: Record<string, string>;
}
export type WorkerMessage = Hello | Heartbeat | Delta | Done | Fail | Back | Drain | Claim;
export type Result = Done | Fail | Back;

// --- server → Worker --------------------------------------------------------------

export interface Welcome {
  t: "welcome";
  worker_id: string;
  heartbeat_timeout: number;
  reconnect_grace: number;
  resume: string;
  stop?: string[];
  /** In a cluster: the base URLs of every node to be connected to, this one included. */
  members?: string[];
}
export interface StepMessage {
  t: "step";
  attempt_id: string;
  session_id: string;
  step_id: string;
  step_type: StepType;
  attempt: number;
  agent: string;
  history?: Item[];
  history_base?: number;
  tool?: string | null;
  call_id?: string | null;
  arguments?: Record<string, unknown>;
  idempotency_key?: string | null;
  needs_start_ack?: boolean;
  answers?: string[];
  sleeps_done?: number;
  task_handle?: unknown;
  traceparent?: string | null;
}
export interface HeartbeatReply {
  t: "hb";
  status: Record<string, "ok" | "stop">;
  seq?: number | null;
}
export interface Ack {
  t: "ack";
  attempt_id: string;
  ok: boolean;
  error?: string | null;
}
export interface Cancel {
  t: "cancel";
  attempt_id: string;
}
/** The cluster's nodes changed (docs/worker-protocol.md, rule 13). */
export interface Members {
  t: "members";
  members: string[];
}
/** The answer to ``claim``, about the attempts of sessions this node owns (rule 14): ``ok``,
 * it is this connection's now; ``stop``, it runs nowhere. Others are left out. */
export interface Claimed {
  t: "claimed";
  status: Record<string, "ok" | "stop">;
}
export type ServerMessage = Welcome | StepMessage | HeartbeatReply | Ack | Cancel | Members | Claimed;

export const PROTOCOL_VERSION = 1;
export const CLOSE_BAD_FRAME = 4400;
export const CLOSE_UNAUTHORIZED = 4401;
export const CLOSE_ID_IN_USE = 4409;
export const CLOSE_NOT_READY = 4503;
