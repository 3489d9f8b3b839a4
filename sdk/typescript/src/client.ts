/**
 * The Dex Client for Node: talk to a Dex Server over its HTTP API (Node's own fetch), as
 * the Python Client (``dex.Client``) does, with the same reach and the same rules:
 *
 * - Several addresses (a list, or comma-separated): one try at each in a round, from the
 *   one that answered last; a connection error, a timeout or a 503 moves on to the next.
 * - A request that is safe to repeat (a read; a send with a ``messageId``; setting or
 *   removing a session's or a tenant's budget) is tried again in rounds with backoff (full jitter,
 *   0.05 s doubling to 1 s) until its timeout; anything else (a send without a
 *   ``messageId``, an approval, a denial, an answer, a reconcile, a cancel, a create, a
 *   fork, a change of a model group's limits) is one round and no more: it may have been
 *   committed when its connection broke.
 * - An error answer is thrown as it is: an ``ApiError`` with the HTTP status and the JSON
 *   error body's code, message and details; no answer at all is an ``UnavailableError``.
 *
 * The shapes it sends and gets are the API's, snake_case, as ``api.ts`` (generated from
 * ``sdk/openapi.json``) types them.
 */
import { setMaxListeners } from "node:events";

import type { components, operations } from "./api";
import {
  ApiError,
  NoAnswer,
  UnavailableError,
  addressesOf,
  broken,
  describe,
  errorOf,
  event,
  isStorageError,
  jitter,
  linked,
  notServing,
  now,
  parse,
  preview,
  seg,
  segs,
  sleep,
  timed,
  unix,
  within,
} from "./client-http";
import type {
  AgentSnapshot,
  Answered,
  Approved,
  BudgetOptions,
  BudgetSet,
  Cancelled,
  ClientOptions,
  ClusterView,
  ConnectedWorker,
  CreateSessionOptions,
  DexEvent,
  ForkedSession,
  GroupLimits,
  Inbox,
  ListSessionsOptions,
  ModelLimit,
  PendingApproval,
  SendMessageOptions,
  SentMessage,
  ServedAgent,
  Session,
  SessionList,
  StreamOptions,
  Tenant,
  TenantBudgetOptions,
  TurnResult,
  TurnToolCall,
} from "./client-types";

type Schemas = components["schemas"];
import { Decoder } from "./sse";

/** Seconds the server holds a request that waits for a turn before the client asks again. */
export const LONG_POLL = 2.0;
const LONG_POLL_SLACK = 2.0;
/** Backoff between rounds over the addresses: full jitter, 0.05 s doubling to 1 s. */
const RETRY_INITIAL = 0.05;
const RETRY_MAX = 1.0;
/** The same for opening an event stream again, up to 2 s. */
const STREAM_RETRY_MAX = 2.0;
/** An event stream quiet this long is dead: the server sends a keep-alive comment after
 * 15 s without an event. */
const SILENCE = 45.0;

interface RequestOptions {
  body?: unknown;
  params?: Record<string, string | number | undefined>;
  /** Seconds the call may take, its retries included (default: the client's timeout). */
  readTimeout?: number;
  /** Seconds one try may take (default: readTimeout). */
  perTry?: number;
  /** Tried again across the addresses until readTimeout (default: a GET is). */
  retry?: boolean;
}

/** An event stream that answered: its first bytes, and how to read on and close it. */
interface OpenStream {
  first: Uint8Array;
  /** The next bytes, or null at the end; throws when the connection breaks or is quiet
   * for SILENCE seconds. */
  read(): Promise<Uint8Array | null>;
  close(): void;
}

/** A client of one Dex Server (or several addresses of one cluster or HA pair). Calls may
 * run at once; ``close()`` stops the event streams and requests still open. */
export class Client {
  /** The addresses tried, in order. */
  readonly addresses: string[];
  /** Seconds a call may take by default. */
  readonly timeout: number;
  private readonly auth: Record<string, string>;
  private current = 0;
  private readonly closing = new AbortController();

  constructor(options: ClientOptions = {}) {
    this.addresses = addressesOf(options.address);
    this.timeout = options.timeout ?? 30.0;
    if (!(typeof this.timeout === "number" && this.timeout > 0)) {
      throw new Error(`ClientOptions.timeout=${JSON.stringify(options.timeout)}: want seconds above 0`);
    }
    const token = options.token || process.env.DEX_CLIENT_TOKEN;
    this.auth = token ? { authorization: `Bearer ${token}` } : {};
    setMaxListeners(0, this.closing.signal); // every request and stream in flight listens
  }

  /** Stop every event stream (its iteration ends) and abort the requests still open. */
  close(): void {
    this.closing.abort(new Error("the Dex client was closed"));
  }

  // --- sessions ------------------------------------------------------------------------

  /** A new session of ``agent`` (an agent a Worker registered), with ``sessionId`` or one
   * the server makes; ``tenant``, ``priority`` and ``budget`` as ``CreateSessionOptions``
   * says. */
  createSession(agent: string, options: CreateSessionOptions = {}): Promise<Session> {
    const body: Record<string, unknown> = { agent };
    if (options.sessionId !== undefined) body.session_id = options.sessionId;
    if (options.tenant !== undefined) body.tenant = options.tenant;
    if (options.priority) body.priority = options.priority;
    if (options.budget !== undefined) {
      body.budget = {
        max_tokens: options.budget.maxTokens ?? null,
        max_cost_usd: options.budget.maxCostUsd ?? null,
      } satisfies Schemas["Budget"];
    }
    return this.request("POST", "/v1/sessions", { body });
  }

  /** Set the session's budget (one limit or both; neither is a 422). A turn that waits
   * for its budget goes on if the new one is not used up. Answers the budget, the usage
   * and the session's status; tried again until the timeout, as setting it twice is
   * setting it once. */
  setBudget(sessionId: string, options: BudgetOptions): Promise<BudgetSet> {
    const body = {
      max_tokens: options.maxTokens ?? null,
      max_cost_usd: options.maxCostUsd ?? null,
      by: options.by ?? null,
    } satisfies Schemas["SetBudget"];
    return this.request("PUT", `/v1/sessions/${seg(sessionId)}/budget`, { body, retry: true });
  }

  /** Remove the session's budget: no limit; a turn that waits for its budget goes on. */
  removeBudget(sessionId: string, options: { by?: string } = {}): Promise<BudgetSet> {
    const path = `/v1/sessions/${seg(sessionId)}/budget`;
    return this.request("DELETE", path, { params: { by: options.by }, retry: true });
  }

  /** A new session whose history is ``sessionId``'s before turn ``turn`` (its next message
   * is its turn ``turn``; one past the last turn copies the whole history). The original
   * does not change; a session in a turn is a 409 ``conflict``. */
  forkSession(
    sessionId: string,
    turn: number,
    options: { newSessionId?: string } = {},
  ): Promise<ForkedSession> {
    const body: Record<string, unknown> = { turn };
    if (options.newSessionId !== undefined) body.session_id = options.newSessionId;
    return this.request("POST", `/v1/sessions/${seg(sessionId)}/fork`, { body });
  }

  /** One page of sessions, newest first by ``order``: ``{sessions, next_cursor}``; pass
   * ``next_cursor`` as ``cursor`` (with the same filters) for the next page, until it is
   * null. */
  listSessions(options: ListSessionsOptions = {}): Promise<SessionList> {
    const params = {
      agent: options.agent,
      tenant: options.tenant,
      status: options.status,
      created_since: unix(options.createdSince),
      created_before: unix(options.createdBefore),
      updated_since: unix(options.updatedSince),
      updated_before: unix(options.updatedBefore),
      order: options.order ?? "created",
      limit: options.limit ?? 100,
      cursor: options.cursor,
    } satisfies Record<keyof NonNullable<operations["list_sessions"]["parameters"]["query"]>, unknown>;
    return this.request("GET", "/v1/sessions", { params });
  }

  /** What waits for a person across sessions, the latest first: ``{items, next_cursor}``.
   * A page holds the waits of up to ``limit`` sessions. */
  listInbox(options: { limit?: number; cursor?: string; tenant?: string } = {}): Promise<Inbox> {
    const params = { limit: options.limit ?? 100, cursor: options.cursor, tenant: options.tenant };
    return this.request("GET", "/v1/inbox", { params });
  }

  /** Send a user message. Its turn starts now, or after the running turn ends.
   *
   * With ``wait``, return once the turn has ended, or as soon as it waits for a person
   * (``status`` ``waiting``: ``waiting_for`` lists each call to approve or question to
   * answer), or when ``timeout`` passed (``running``). Sending again with the same
   * ``messageId`` returns the first send's turn (``created`` false) and changes nothing. */
  async sendMessage(sessionId: string, text: string, options: SendMessageOptions = {}): Promise<SentMessage> {
    const timeout = options.timeout ?? this.timeout;
    const deadline = now() + timeout;
    const body: Record<string, unknown> = { text };
    if (options.messageId !== undefined) body.message_id = options.messageId;
    if (options.onBusy !== undefined) body.on_busy = options.onBusy;
    if (options.wait) body.wait_seconds = Math.min(timeout, LONG_POLL);
    const result = await this.request<SentMessage>("POST", `/v1/sessions/${seg(sessionId)}/messages`, {
      body,
      readTimeout: timeout + LONG_POLL_SLACK,
      perTry: (options.wait ? Math.min(timeout, LONG_POLL) : 0) + LONG_POLL_SLACK,
      retry: options.messageId !== undefined, // the same id again returns the first send's turn
    });
    if (options.wait && result.status === "running") {
      // the server holds a request only so long: wait out the rest of the timeout
      const ended = await this.waitTurn(sessionId, result.turn, {
        timeout: Math.max(0, deadline - now()),
      });
      return { ...ended, created: result.created, outcome: result.outcome, interrupted: result.interrupted };
    }
    return result;
  }

  /** The turn once it has ended or waits for a person (``waiting``, with
   * ``waiting_for``); if ``timeout`` passes first, its current record (``running``). Asks
   * in long polls of at most LONG_POLL seconds, again until the deadline. */
  async waitTurn(sessionId: string, turn: number, options: { timeout?: number } = {}): Promise<TurnResult> {
    const deadline = now() + (options.timeout ?? this.timeout);
    for (;;) {
      const remaining = Math.max(0, deadline - now());
      const chunk = Math.min(remaining, LONG_POLL);
      const result = await this.request<TurnResult>("GET", `/v1/sessions/${seg(sessionId)}/turns/${turn}`, {
        params: { wait_seconds: chunk },
        readTimeout: remaining + LONG_POLL_SLACK,
        perTry: chunk + LONG_POLL_SLACK,
      });
      if (result.status !== "running" || now() >= deadline) return result;
    }
  }

  /** History, state, the current turn with its Steps and attempts, and tool calls. */
  getAgentSnapshot(sessionId: string): Promise<AgentSnapshot> {
    return this.request("GET", `/v1/sessions/${seg(sessionId)}`);
  }

  /** The agents Workers registered. */
  async listAgents(): Promise<ServedAgent[]> {
    return (await this.request<Schemas["AgentList"]>("GET", "/v1/agents")).agents;
  }

  /** The Workers connected to the server: their agents and tools, capacity, and the
   * attempts they run; in a cluster, those of every node that answered, each with its
   * ``node``. */
  async listWorkers(): Promise<ConnectedWorker[]> {
    return (await this.request<Schemas["WorkerList"]>("GET", "/v1/workers")).workers;
  }

  /** The nodes of the cluster (``members``) and the ``node_id`` of the node that
   * answered; no members on a node alone. */
  getCluster(): Promise<ClusterView> {
    return this.request("GET", "/v1/cluster");
  }

  // --- model limits --------------------------------------------------------------------

  /** The model groups with limits or calls: each one's ``limit``, its ``source``
   * (``config``, or ``api`` when set at run time), and its calls ``running`` and Steps
   * ``waiting`` on the node that answered. Needs an admin token when the server has auth
   * on (docs/flow-control.md). */
  async getLimits(): Promise<GroupLimits[]> {
    return (await this.request<Schemas["LimitsView"]>("GET", "/admin/limits")).groups;
  }

  /** Set a model group's limits at run time (``anthropic/claude-sonnet-4-5``, or an agent's
   * ``group``): stored, and enforced by every node within seconds; a limit left out does
   * not apply (``{}`` lifts them all). Answers every group, as ``getLimits``. */
  async setLimit(group: string, limit: ModelLimit = {}): Promise<GroupLimits[]> {
    const body = {
      concurrency: limit.concurrency ?? null,
      rpm: limit.rpm ?? null,
      tpm: limit.tpm ?? null,
    } satisfies ModelLimit;
    const path = `/admin/limits/${segs(group)}`;
    return (await this.request<Schemas["LimitsView"]>("PUT", path, { body })).groups;
  }

  /** Drop the limits set at run time for a group: the server config's apply again. */
  async clearLimit(group: string): Promise<GroupLimits[]> {
    const path = `/admin/limits/${segs(group)}`;
    return (await this.request<Schemas["LimitsView"]>("DELETE", path)).groups;
  }

  // --- tenants -------------------------------------------------------------------------

  /** Each tenant with a budget or with usage this month: its ``budget``, what its
   * sessions' model calls used ``today`` and ``this_month`` (UTC), and ``reached`` (how
   * its budget is used up, or null). Needs an admin token when the server has auth on
   * (docs/flow-control.md). */
  async listTenants(): Promise<Tenant[]> {
    return (await this.request<Schemas["Tenants"]>("GET", "/admin/tenants")).tenants;
  }

  /** One tenant's budget and usage, as ``listTenants`` shows each (a tenant with neither:
   * no budget and zeros). */
  getTenant(tenant: string): Promise<Tenant> {
    return this.request("GET", `/admin/tenants/${seg(tenant)}`);
  }

  /** Set what all of a tenant's sessions may use in a UTC day and month (one limit or
   * more; none is a 422; one left out does not apply). Its sessions' turns that wait for
   * it go on if it allows them. Answers the tenant, as ``getTenant``; tried again until
   * the timeout, as setting it twice is setting it once. */
  setTenantBudget(tenant: string, options: TenantBudgetOptions): Promise<Tenant> {
    const body = {
      max_tokens_per_day: options.maxTokensPerDay ?? null,
      max_cost_usd_per_day: options.maxCostUsdPerDay ?? null,
      max_tokens_per_month: options.maxTokensPerMonth ?? null,
      max_cost_usd_per_month: options.maxCostUsdPerMonth ?? null,
      by: options.by ?? null,
    } satisfies Schemas["SetTenantBudget"];
    return this.request("PUT", `/admin/tenants/${seg(tenant)}/budget`, { body, retry: true });
  }

  /** Remove a tenant's budget: no limit; its sessions' turns that wait for it go on. */
  removeTenantBudget(tenant: string, options: { by?: string } = {}): Promise<Tenant> {
    const path = `/admin/tenants/${seg(tenant)}/budget`;
    return this.request("DELETE", path, { params: { by: options.by }, retry: true });
  }

  // --- waits, cancel, reconcile --------------------------------------------------------

  /** Tool calls waiting for approval: call id, tool, arguments, arguments_hash, since. */
  async listApprovals(sessionId: string): Promise<PendingApproval[]> {
    const path = `/v1/sessions/${seg(sessionId)}/approvals`;
    return (await this.request<Schemas["ApprovalList"]>("GET", path)).approvals;
  }

  /** Approve a tool call: it runs once. Pass the ``argumentsHash`` you reviewed to refuse
   * an approval of other arguments (409). */
  approve(
    sessionId: string,
    callId: string,
    options: { by?: string; argumentsHash?: string } = {},
  ): Promise<Approved> {
    const body = { by: options.by ?? null, arguments_hash: options.argumentsHash ?? null };
    return this.onCall(sessionId, callId, "approve", body);
  }

  /** Deny a tool call: it records ``denied`` and the model sees the reason. */
  deny(sessionId: string, callId: string, reason: string, options: { by?: string } = {}): Promise<Approved> {
    return this.onCall(sessionId, callId, "deny", { reason, by: options.by ?? null });
  }

  /** Answer the question a tool asked: the tool runs again with it. */
  answer(
    sessionId: string,
    callId: string,
    answer: string,
    options: { by?: string } = {},
  ): Promise<Answered> {
    return this.onCall(sessionId, callId, "answer", { answer, by: options.by ?? null });
  }

  /** Cancel the running turn: queued Steps fail as not started, running ones stop (409
   * when no turn runs). */
  cancelTurn(sessionId: string, reason = "cancelled by a client"): Promise<Cancelled> {
    return this.request("POST", `/v1/sessions/${seg(sessionId)}/cancel`, { body: { reason } });
  }

  /** Record what really happened to an ``outcome_unknown`` call (``succeeded`` with a
   * result, or ``failed`` with an error). The model sees it in the history. */
  reconcile(
    sessionId: string,
    callId: string,
    outcome: { status: "succeeded" | "failed"; result?: unknown; error?: string; by?: string },
  ): Promise<TurnToolCall> {
    const body = {
      status: outcome.status,
      result: outcome.result ?? null,
      error: outcome.error ?? null,
      by: outcome.by ?? null,
    };
    return this.onCall(sessionId, callId, "reconcile", body);
  }

  private onCall<T>(sessionId: string, callId: string, action: string, body: unknown): Promise<T> {
    const path = `/v1/sessions/${seg(sessionId)}/tool_calls/${seg(callId)}/${action}`;
    return this.request("POST", path, { body });
  }

  // --- the event stream ----------------------------------------------------------------

  /** The session's events as they happen (Server-Sent Events), each ``{id, type, data}``;
   * without ``lastEventId``, the events the server still keeps come first.
   *
   * With ``reconnect`` (the default), a stream that breaks or ends (a node restarting, a
   * standby taking over, a network error, a 5xx) is opened again with the last id seen as
   * ``Last-Event-ID``, over every address, with backoff (full jitter, 0.05 s doubling to
   * 2 s, and no sooner than the server's ``retry:``), until the client's timeout has passed
   * without one: then ``UnavailableError``. A 4xx throws at once (``not_found`` for an
   * unknown session). Without ``reconnect``, a break throws ``UnavailableError`` and the
   * end of the stream ends the iteration. Leaving the loop (``break``), the ``signal``
   * or ``close()`` closes the stream.
   *
   * The stream's own notices come as events with the last id seen: ``stream.gap``
   * (events after that id are no longer kept: the snapshot has what is durable),
   * ``stream.dropped`` (this reader fell too far behind; the stream goes on after the
   * last id seen). */
  async *streamEvents(
    sessionId: string,
    options: StreamOptions = {},
  ): AsyncGenerator<DexEvent, void, undefined> {
    const decoder = new Decoder(options.lastEventId ?? "");
    const reconnect = options.reconnect ?? true;
    const path = `/v1/sessions/${seg(sessionId)}/events`;
    const stopping = linked([this.closing.signal, options.signal]);
    const stop = stopping.signal;
    try {
      yield* this.events(sessionId, path, decoder, reconnect, stop);
    } finally {
      stopping.release();
    }
  }

  private async *events(
    sessionId: string,
    path: string,
    decoder: Decoder,
    reconnect: boolean,
    stop: AbortSignal,
  ): AsyncGenerator<DexEvent, void, undefined> {
    for (;;) {
      let opened: OpenStream;
      try {
        opened = await this.openStream(path, decoder, reconnect, stop);
      } catch (e) {
        if (stop.aborted) return;
        if (e instanceof NoAnswer) throw broken(sessionId, e.last);
        throw e;
      }
      let broke: unknown = null;
      try {
        let chunk: Uint8Array | null = opened.first;
        while (chunk !== null) {
          for (const message of decoder.feed(chunk)) yield event(message);
          chunk = await opened.read();
        }
      } catch (e) {
        if (stop.aborted) return;
        if (e instanceof ApiError) throw e; // an event whose data is not JSON
        broke = e;
      } finally {
        opened.close();
      }
      if (!reconnect) {
        if (broke !== null) throw broken(sessionId, broke);
        return;
      }
      decoder.reset(); // an event the stream did not finish is not dispatched
      if (decoder.retry) {
        try {
          await sleep(decoder.retry, stop);
        } catch {
          return; // stopped
        }
      }
    }
  }

  // --- transport -----------------------------------------------------------------------

  /** One request to whichever node serves. A request that is safe to repeat (a GET, or
   * ``retry``: a send that carries a message id) is tried again across the addresses, with
   * backoff, until ``readTimeout``: a node restarting or a standby taking over is a gap,
   * not an error. Others try each address once. */
  private async request<T>(method: string, path: string, options: RequestOptions = {}): Promise<T> {
    const data = options.body === undefined ? undefined : JSON.stringify(options.body);
    const perTry = options.perTry || options.readTimeout || this.timeout;
    const safe = options.retry ?? method === "GET";
    const query = new URLSearchParams();
    for (const [name, value] of Object.entries(options.params ?? {})) {
      if (value !== undefined) query.set(name, String(value));
    }
    const target = query.toString() === "" ? path : `${path}?${query}`;
    const started = now();
    const send = () => this.round<T>(method, target, data, perTry);
    try {
      return await send();
    } catch (e) {
      if (!(e instanceof NoAnswer)) throw e;
      if (!safe) throw this.unavailable(e.last);
    }
    // a gap (a node restarting, a standby taking over): rounds with backoff
    const budget = Math.max(0, (options.readTimeout || this.timeout) - (now() - started));
    const retrying = now();
    for (let attempt = 1; ; attempt++) {
      let last: NoAnswer;
      try {
        return await send();
      } catch (e) {
        if (!(e instanceof NoAnswer)) throw e;
        last = e;
      }
      const wait = jitter(attempt, RETRY_INITIAL, RETRY_MAX);
      if (now() - retrying + wait >= budget) throw this.unavailable(last.last);
      await sleep(wait, this.closing.signal);
    }
  }

  /** One try at each address, from the one that answered last; NoAnswer if none did (an
   * error answer is thrown as it is). */
  private async round<T>(
    method: string,
    target: string,
    data: string | undefined,
    perTry: number,
  ): Promise<T> {
    let last: unknown = null;
    for (let i = 0; i < this.addresses.length; i++) {
      const base = this.addresses[this.current % this.addresses.length];
      const headers: Record<string, string> =
        data !== undefined ? { "content-type": "application/json", ...this.auth } : { ...this.auth };
      const tried = timed(perTry, this.closing.signal);
      let status: number;
      let payload: Buffer;
      try {
        const response = await fetch(base + target, { method, headers, body: data, signal: tried.signal });
        status = response.status;
        payload = Buffer.from(await response.arrayBuffer());
      } catch (e) {
        if (this.closing.signal.aborted) throw this.closing.signal.reason;
        last = tried.timedOut() ? new Error(`no answer from ${base} within ${perTry} s`) : e;
        this.current++;
        continue;
      } finally {
        tried.clear();
      }
      if (status === 503) {
        last = notServing(base, payload);
        if (!isStorageError(last)) this.current++; // a standby, or a node starting: the next one
        continue;
      }
      const decoded = parse(payload);
      if (status >= 400) throw errorOf(status, decoded);
      if (decoded === null || typeof decoded !== "object" || Array.isArray(decoded)) {
        throw new ApiError(status, "server_error", `unexpected answer from ${base}: ${preview(payload)}`);
      }
      return decoded as T;
    }
    throw new NoAnswer(last);
  }

  /** An event stream that answered (200 and its first bytes) at whichever node serves;
   * with ``retry``, rounds over the addresses with backoff (never sooner than the server's
   * ``retry:``) until the client's timeout. NoAnswer if none did. */
  private async openStream(
    path: string,
    decoder: Decoder,
    retry: boolean,
    stop: AbortSignal,
  ): Promise<OpenStream> {
    const headers: Record<string, string> = { accept: "text/event-stream", ...this.auth };
    if (decoder.lastEventId) headers["last-event-id"] = decoder.lastEventId;
    if (!retry) return this.streamRound(path, headers, stop);
    const started = now();
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.streamRound(path, headers, stop);
      } catch (e) {
        if (!(e instanceof NoAnswer)) throw e;
        const wait = Math.max(decoder.retry ?? 0, jitter(attempt, RETRY_INITIAL, STREAM_RETRY_MAX));
        if (now() - started + wait >= this.timeout) throw e;
        await sleep(wait, stop);
      }
    }
  }

  /** One try at each address, as ``round``: a 5xx or a stream that ends before its first
   * bytes is no answer; a 4xx is thrown as it is. */
  private async streamRound(
    path: string,
    headers: Record<string, string>,
    stop: AbortSignal,
  ): Promise<OpenStream> {
    let last: unknown = null;
    for (let i = 0; i < this.addresses.length; i++) {
      const base = this.addresses[this.current % this.addresses.length];
      const controller = new AbortController();
      const onStop = () => controller.abort(stop.reason);
      stop.addEventListener("abort", onStop);
      let opened: OpenStream | null = null;
      try {
        if (stop.aborted) throw stop.reason;
        const response = await within(this.timeout, controller, () =>
          fetch(base + path, { headers, signal: controller.signal }),
        );
        if (response.status === 200) {
          const body = response.body;
          if (body === null) throw new Error(`${base} answered the event stream with no body`);
          const reader = body.getReader();
          const read = async (): Promise<Uint8Array | null> => {
            for (;;) {
              const { done, value } = await within(SILENCE, controller, () => reader.read());
              if (done) return null;
              if (value.length > 0) return value;
            }
          };
          const first = await read();
          if (first !== null) {
            opened = {
              first,
              read,
              close: () => {
                stop.removeEventListener("abort", onStop);
                controller.abort();
              },
            };
            return opened;
          }
          last = new UnavailableError(`${base} ended the event stream before it began`);
        } else {
          const payload = Buffer.from(await within(this.timeout, controller, () => response.arrayBuffer()));
          if (response.status < 500) throw errorOf(response.status, parse(payload));
          last =
            response.status === 503
              ? notServing(base, payload)
              : new ApiError(
                  response.status,
                  "server_error",
                  `${base} answered ${response.status}: ${preview(payload)}`,
                );
        }
      } catch (e) {
        if (e instanceof ApiError || stop.aborted) throw e;
        last = e;
      } finally {
        if (opened === null) {
          stop.removeEventListener("abort", onStop);
          controller.abort();
        }
      }
      if (!isStorageError(last)) this.current++;
    }
    throw new NoAnswer(last);
  }

  private unavailable(last: unknown): ApiError {
    if (isStorageError(last)) return last; // the node serves, but its store cannot commit now
    return new UnavailableError(`no Dex Server answered at ${this.addresses.join(", ")}: ${describe(last)}`);
  }
}

export { ApiError, UnavailableError, addressesOf } from "./client-http";
export type * from "./client-types";
