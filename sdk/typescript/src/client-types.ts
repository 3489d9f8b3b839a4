/** The shapes the Client sends and gets: the API's (generated in ``api.ts`` from
 * ``sdk/openapi.json``), under the names a user needs, and the calls' options. */
import type { components } from "./api";

type Schemas = components["schemas"];

/** A session as the list and ``createSession`` give it. */
export type Session = Schemas["Session"];
/** One page of ``listSessions``: pass ``next_cursor`` back for the next. */
export type SessionList = Schemas["SessionList"];
/** ``idle``, ``running``, ``waiting`` (for a person) or ``failed``. */
export type SessionStatus = Schemas["FleetStatus"];
/** The session ``forkSession`` made. */
export type ForkedSession = Schemas["Forked"];
/** One page of ``listInbox``. */
export type Inbox = Schemas["Inbox"];
/** What waits for a person: an approval or a question (an inbox item, or a turn's
 * ``waiting_for``). */
export type PersonWait = Schemas["PersonWait"];
/** A turn as ``waitTurn`` gives it: ``status``, ``waiting_for``, ``text``, ``error``,
 * ``tool_calls``, ``steps``. */
export type TurnResult = Schemas["TurnResult"];
/** ``running``, ``waiting`` (for a person), ``completed``, ``failed`` or ``cancelled``. */
export type TurnStatus = Schemas["ShownTurnStatus"];
/** A sent message's turn: a ``TurnResult`` and ``created`` (false: a ``messageId`` sent
 * before). */
export type SentMessage = Schemas["SentMessage"];
/** The agent snapshot: ``session``, ``current_turn``, ``waiting``, ``running``,
 * ``history``, ``tool_calls``, ``approvals``, ``waits``. */
export type AgentSnapshot = Schemas["Snapshot"];
/** An agent a Worker registered, with its tools and how many Workers serve it. */
export type ServedAgent = Schemas["ServedAgent"];
/** A connected Worker: its agents, capacity and the attempts it runs. */
export type ConnectedWorker = Schemas["ConnectedWorker"];
/** The nodes of the cluster and the one that answered. */
export type ClusterView = Schemas["ClusterView"];
export type ClusterMember = Schemas["ClusterMember"];
/** A tool call waiting for approval. */
export type PendingApproval = Schemas["PendingApproval"];
export type Approved = Schemas["Approved"];
export type Answered = Schemas["Answered"];
export type Cancelled = Schemas["Cancelled"];
/** A turn's tool call record, as ``reconcile`` gives it back. */
export type TurnToolCall = Schemas["ToolCall"];
/** What a session may use in all (``max_tokens``, ``max_cost_usd``); a null limit does
 * not apply. */
export type SessionBudget = Schemas["SessionBudget"];
/** What ``setBudget`` and ``removeBudget`` answer: the session's ``budget`` now (null: no
 * limit), its ``usage`` and its ``status`` after the change. */
export type BudgetSet = Schemas["BudgetSet"];
/** A model group's limits: ``concurrency`` (calls at once), ``rpm`` (calls started per
 * minute), ``tpm`` (tokens per minute); one left out or null does not apply. */
export type ModelLimit = Schemas["Limit"];
/** A model group as ``getLimits`` gives it: its ``limit``, its ``source`` (``config``, or
 * ``api`` when set at run time), its calls ``running`` and Steps ``waiting`` on the node
 * that answered, and ``lowered_to`` (the part it admits after the provider refused
 * calls). */
export type GroupLimits = Schemas["GroupLimits"];
/** A tenant as ``listTenants``, ``getTenant`` and the tenant budget calls answer it (and
 * as the snapshot's ``session.tenant_usage`` shows it): its ``budget`` (null: none), the
 * UTC ``day``, what its sessions' model calls used ``today`` and ``this_month``, and
 * ``reached`` (how its budget is used up, in words; null if not). */
export type Tenant = Schemas["Tenant"];
/** What a tenant's model calls used in a period: ``input_tokens``, ``output_tokens``,
 * ``tokens`` (both together), ``cost_usd``, ``calls``. */
export type TenantUsage = Schemas["TenantUsage"];
/** A tenant's budget as answered: ``max_tokens_per_day``, ``max_cost_usd_per_day``,
 * ``max_tokens_per_month``, ``max_cost_usd_per_month``; a null limit does not apply. */
export type TenantBudget = Schemas["TenantBudgetView"];
/** The JSON body of every error answer: ``{"error": {"code", "message", "details"}}``. */
export type ErrorBody = Schemas["ErrorResponse"];

/** One event of a session's stream. ``id`` is opaque: pass the last one you saw as
 * ``lastEventId`` to resume after it. ``data`` is the event's JSON (see docs/streams.md). */
export interface DexEvent {
  id: string;
  /** ``history.item``, ``turn.started``, ``turn.completed``, ``turn.failed``,
   * ``turn.cancelled``, ``wait.started``, ``wait.ended`` (a budget wait),
   * ``budget.changed``, ``message.queued``, ``message.steered``, ``model.delta``,
   * ``model.discard``; the
   * stream's own ``stream.gap`` and ``stream.dropped``. */
  type: string;
  data: Record<string, unknown>;
}

/** A moment: Unix seconds, or a Date. */
export type Time = number | Date;

export interface ClientOptions {
  /** One node's address, several comma-separated, or a list (default: DEX_ADDRESS, else
   * http://127.0.0.1:7450). */
  address?: string | string[];
  /** Seconds a call may take, its retries included (default 30). */
  timeout?: number;
  /** The client token, when the server has auth on (default: DEX_CLIENT_TOKEN). */
  token?: string;
}

/** What a session may use in all: give one limit or both. */
export interface Budget {
  /** Input and output tokens together. */
  maxTokens?: number;
  /** US dollars. */
  maxCostUsd?: number;
}

export interface CreateSessionOptions {
  /** The session's id (default: one the server makes); a taken one is a 409. */
  sessionId?: string;
  /** Whose session it is, for good (1-64 letters, digits or ``_.-``). With a
   * tenant-scoped token, its tenant by default; another one is a 403. */
  tenant?: string;
  /** Its Steps go ahead of those of its tenant's sessions of a lower one (-1000 to
   * 1000; default 0). */
  priority?: number;
  /** What it may use in all: a turn whose next model call would start at or over it
   * waits until the budget is raised (``setBudget``). */
  budget?: Budget;
}

export interface BudgetOptions extends Budget {
  /** Who changes it. */
  by?: string;
}

/** What all of a tenant's sessions may use in a UTC day and in a UTC month: give one
 * limit or more; one left out does not apply. */
export interface TenantBudgetOptions {
  /** Input and output tokens together, per UTC day. */
  maxTokensPerDay?: number;
  /** US dollars per UTC day. */
  maxCostUsdPerDay?: number;
  /** Input and output tokens together, per UTC month. */
  maxTokensPerMonth?: number;
  /** US dollars per UTC month. */
  maxCostUsdPerMonth?: number;
  /** Who changes it. */
  by?: string;
}

export interface ListSessionsOptions {
  agent?: string;
  /** Only this tenant's sessions (a tenant-scoped token sees only its own). */
  tenant?: string;
  /** A status, or ``outcome_unknown``: sessions with a call whose outcome is unknown and
   * not reconciled. */
  status?: SessionStatus | "outcome_unknown";
  /** A range is ``[since, before)``. */
  createdSince?: Time;
  createdBefore?: Time;
  updatedSince?: Time;
  updatedBefore?: Time;
  /** Newest first by ``created`` (the default) or ``updated``. */
  order?: "created" | "updated";
  /** Sessions per page, 1-1000 (100). */
  limit?: number;
  /** The previous page's ``next_cursor``, with the same filters. */
  cursor?: string;
}

export interface SendMessageOptions {
  /** Sending again with the same id returns the first send's turn and changes nothing:
   * such a send is retried, one without an id is not. */
  messageId?: string;
  /** What the message does if a turn runs (docs/mid-turn.md): ``enqueue`` (wait for it to
   * end), ``reject`` (a ``ConflictError`` naming the turn), ``interrupt`` (cancel it and
   * start a turn with this message), ``steer`` (join it). Absent: the agent's policy. The
   * answer's ``outcome`` says what it did. */
  onBusy?: "enqueue" | "reject" | "interrupt" | "steer";
  /** Return once the turn has ended, or as soon as it waits for a person (``waiting``),
   * or when ``timeout`` passed (``running``). */
  wait?: boolean;
  /** Seconds (default: the client's timeout). */
  timeout?: number;
}

export interface StreamOptions {
  /** Resume after this event id. */
  lastEventId?: string;
  /** Open the stream again when it breaks or ends (default true). */
  reconnect?: boolean;
  /** Ends the iteration when aborted. */
  signal?: AbortSignal;
}
