/**
 * The TypeScript port of tests/support/agents.py, for the crash tests run against this
 * SDK: the same agents, tool names, ledger entries and gate files.
 *
 * The scripted model reads the last user message:
 *     "call: [[tool, {args}], ...]"  asks for those tool calls (all in one response),
 *     anything else                  answers "echo: <text>".
 * Once every call has a result, it answers "results: <json of statuses and results>".
 * It records every model call (``model``) and summary call (``summary``) in the ledger as
 * it starts, with ``session_id`` and ``attempt``, as the tools record their effects.
 *
 * Run: node dist/test/agents.js   (DEX_ADDRESS, DEX_TEST_LEDGER, DEX_TEST_GATES)
 */
import * as fs from "node:fs";
import * as path from "node:path";

import {
  Args,
  Item,
  PENDING,
  ModelRequest,
  ModelResponse,
  RetryPolicy,
  Script,
  Scripted,
  Summary,
  Tool,
  ToolContext,
  ToolError,
  ToolOptions,
  Worker,
  WorkerRefusedError,
  defineAgent,
  defineTool,
  say,
} from "../src/index";

const LEDGER = process.env.DEX_TEST_LEDGER ?? "ledger.jsonl";
const GATES = process.env.DEX_TEST_GATES ?? ".";

/** Python's json.dumps(..., sort_keys=True): the ledger reads the same from both Workers. */
function pyJson(value: unknown): string {
  if (Array.isArray(value)) return "[" + value.map(pyJson).join(", ") + "]";
  if (value !== null && typeof value === "object") {
    const entries = Object.entries(value as Record<string, unknown>)
      .filter(([, v]) => v !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return "{" + entries.map(([k, v]) => `${JSON.stringify(k)}: ${pyJson(v)}`).join(", ") + "}";
  }
  return JSON.stringify(value ?? null);
}

/** One durable line per side effect, as dex.testing.Ledger writes it. */
function record(effect: string, fields: Record<string, unknown>): void {
  const fd = fs.openSync(LEDGER, "a", 0o644);
  try {
    fs.writeSync(fd, pyJson({ effect, ...fields }) + "\n");
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
}

/** The entries of ``effect`` in the ledger, as dex.testing.Ledger.entries reads them. */
function entries(effect: string): Record<string, unknown>[] {
  if (!fs.existsSync(LEDGER)) return [];
  return fs
    .readFileSync(LEDGER, "utf8")
    .split("\n")
    .filter((line) => line.trim() !== "")
    .map((line) => JSON.parse(line) as Record<string, unknown>)
    .filter((entry) => entry.effect === effect);
}

/** A model or summary call, recorded as it starts: only in a ledger a test named (a
 * Worker some end-to-end test starts without one leaves no ledger.jsonl behind). */
function recordCall(effect: string, request: ModelRequest): void {
  if (process.env.DEX_TEST_LEDGER === undefined) return;
  record(effect, { session_id: request.sessionId, attempt: request.attempt });
}

/** dex.testing.Gates: write <gate>.<attempt>.entered, then wait for <gate>.open. */
async function gate(name: unknown, attempt: number, signal: AbortSignal): Promise<void> {
  if (typeof name !== "string" || name === "") return;
  fs.writeFileSync(path.join(GATES, `${name}.${attempt}.entered`), "");
  while (!fs.existsSync(path.join(GATES, `${name}.open`))) {
    signal.throwIfAborted();
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

function script(history: Item[]): ModelResponse {
  let lastUser = -1;
  history.forEach((item, i) => {
    if (item.type === "user") lastUser = i;
  });
  const user = history[lastUser];
  if (user === undefined || user.type !== "user") throw new Error("no user message");
  const after = history.slice(lastUser + 1);
  if (!user.text.startsWith("call:")) return say(`echo: ${user.text}`);
  if (after.some((item) => item.type === "assistant")) {
    const summary = after.flatMap((r) =>
      r.type === "tool_result"
        ? [{ name: r.name, status: r.status, result: r.result ?? null, error: r.error ?? null }]
        : [],
    );
    return say("results: " + pyJson(summary));
  }
  const calls = JSON.parse(user.text.slice("call:".length)) as [string, Args][];
  return {
    toolCalls: calls.map(([name, args], i) => ({ id: `c${i}`, name, arguments: args })),
    stopReason: "tool_use",
  };
}

/** The SDK's Scripted, which records each call in the ledger as it starts, and streams its
 * text in chunks of ``chunkChars``, ``delayPerChunk`` seconds apart (0: in one piece). */
class Recorded extends Scripted {
  constructor(
    script: Script,
    private readonly chunkChars = 0,
    private readonly delayPerChunk = 0,
  ) {
    super(script);
  }

  override async *stream(request: ModelRequest): AsyncIterable<string | ModelResponse> {
    recordCall("model", request);
    for await (const event of super.stream(request)) {
      if (typeof event !== "string" || this.chunkChars <= 0) {
        yield event;
        continue;
      }
      for (let i = 0; i < event.length; i += this.chunkChars) {
        if (this.delayPerChunk) {
          await new Promise((resolve) => setTimeout(resolve, this.delayPerChunk * 1000));
        }
        request.signal.throwIfAborted();
        yield event.slice(i, i + this.chunkChars);
      }
    }
  }

  override async summarize(request: ModelRequest): Promise<Summary> {
    recordCall("summary", request);
    await this.beforeSummary(request);
    return super.summarize(request);
  }

  /** What a summary call does once recorded, before it summarizes: nothing here. */
  protected async beforeSummary(_request: ModelRequest): Promise<void> {}
}

/** Recorded, whose summary call, once recorded in the ledger, waits behind the gate
 * ``summary``, so a test can interrupt a CompactContext while it runs. */
class GatedSummaries extends Recorded {
  protected override async beforeSummary(request: ModelRequest): Promise<void> {
    await gate("summary", request.attempt, request.signal);
  }
}

const FAST: RetryPolicy = { maxAttempts: 3, initialBackoffSeconds: 0.05 };

function keyed(extra: Record<string, unknown>): Record<string, unknown> {
  return {
    type: "object",
    properties: { ...extra, gate: { anyOf: [{ type: "string" }, { type: "null" }] } },
    required: Object.keys(extra),
    additionalProperties: false,
  };
}

/** A tool of agents.py's shape: it records its effect in the ledger (the fields ``effect``
 * gives, with the call's idempotency key and attempt), waits at the gate its call names,
 * then returns the value ``effect`` gives. */
function recorded(
  options: Omit<ToolOptions, "parameters" | "run">,
  parameter: Record<string, unknown>,
  effect: (args: Args) => { value: unknown; fields: Record<string, unknown> },
): Tool {
  return defineTool({
    ...options,
    parameters: keyed(parameter),
    async run(args: Args, ctx: ToolContext) {
      const { value, fields } = effect(args);
      record(options.name, { ...fields, idempotency_key: ctx.idempotencyKey, attempt: ctx.attempt });
      await gate(args.gate, ctx.attempt, ctx.signal);
      return value;
    },
  });
}

const lookup = recorded(
  { name: "lookup", description: "Read a value.", kind: "read", retry: FAST },
  { key: { type: "string" } },
  (args) => {
    const key = String(args.key);
    return { value: { key, value: key.toUpperCase() }, fields: { key } };
  },
);

const charge = recorded(
  {
    name: "charge",
    description: "Charge a card: not idempotent, so Dex runs it at most once.",
    kind: "write",
  },
  { amount: { type: "integer" } },
  (args) => ({ value: `charged ${String(args.amount)}`, fields: { amount: args.amount } }),
);

const upsert = recorded(
  {
    name: "upsert",
    description: "Write a record keyed by the idempotency key.",
    kind: "idempotent_write",
    retry: FAST,
  },
  { key: { type: "string" } },
  (args) => ({ value: `stored ${String(args.key)}`, fields: { key: args.key } }),
);

const refuse = defineTool({
  name: "refuse",
  description: "Fails with a known outcome.",
  kind: "read",
  parameters: keyed({ reason: { type: "string" } }),
  run(args: Args) {
    throw new ToolError(String(args.reason));
  },
});

const flaky = defineTool({
  name: "flaky",
  description: "Raises on every attempt: a failed attempt, not a known outcome.",
  kind: "read",
  retry: { maxAttempts: 2, initialBackoffSeconds: 0.05 },
  parameters: keyed({}),
  run(_args: Args, ctx: ToolContext) {
    record("flaky", { idempotency_key: ctx.idempotencyKey, attempt: ctx.attempt });
    throw new Error(`flaky failure on attempt ${ctx.attempt}`);
  },
});

/** Gate files of a task handle: its slashes made underscores. */
function handleGate(handle: unknown, suffix: string): string {
  return path.join(GATES, `${String(handle).replace(/\//g, "_")}.${suffix}`);
}

/** A task tool of agents.py's: its start records ``<name>.start`` (its ``param``, the
 * idempotency key and attempt) and returns the idempotency key as the handle; each poll
 * records ``<name>.poll`` (handle, attempt), then answers by ``poll``. */
function task(
  name: string,
  param: string,
  description: string,
  pollIntervalSeconds: number,
  poll: (ctx: ToolContext, handle: unknown) => unknown,
): Tool {
  return defineTool({
    name,
    description,
    kind: "task",
    retry: FAST,
    pollIntervalSeconds,
    parameters: keyed({ [param]: { type: "string" } }),
    run(args: Args, ctx: ToolContext) {
      record(`${name}.start`, {
        [param]: args[param],
        idempotency_key: ctx.idempotencyKey,
        attempt: ctx.attempt,
      });
      return ctx.idempotencyKey;
    },
    poll(ctx: ToolContext, handle: unknown) {
      record(`${name}.poll`, { handle, attempt: ctx.attempt });
      return poll(ctx, handle);
    },
  });
}

const render = task(
  "render",
  "scene",
  "Starts a render job; the handle is the idempotency key.",
  0.05,
  async (ctx, handle) => {
    if (fs.existsSync(handleGate(handle, "pause"))) {
      fs.writeFileSync(handleGate(handle, "polling"), "");
      while (!fs.existsSync(handleGate(handle, "open"))) {
        ctx.signal.throwIfAborted();
        await new Promise((resolve) => setTimeout(resolve, 5));
      }
    }
    return fs.existsSync(handleGate(handle, "done")) ? `rendered ${String(handle)}` : PENDING;
  },
);

const exportReport = task(
  "export",
  "report",
  "Starts an export job polled once a second; the handle is the idempotency key.",
  1.0,
  (_ctx, handle) => (fs.existsSync(handleGate(handle, "done")) ? `exported ${String(handle)}` : PENDING),
);

// --- waits: approvals, questions, timers ----------------------------------------------

const deleteAll = defineTool({
  name: "delete_all",
  description: "Always needs approval.",
  kind: "write",
  approval: true,
  parameters: keyed({}),
  run(_args: Args, ctx: ToolContext) {
    record("delete_all", { idempotency_key: ctx.idempotencyKey, attempt: ctx.attempt });
    return "deleted";
  },
});

const order = defineTool({
  name: "order",
  description: "Asks which size, then orders.",
  kind: "idempotent_write",
  retry: FAST,
  parameters: keyed({ item: { type: "string" } }),
  run(args: Args, ctx: ToolContext) {
    const item = String(args.item);
    record("order.before_ask", { attempt: ctx.attempt, answers: ctx.answers.length });
    const size = ctx.ask(`Which size of ${item}?`, ["S", "M", "L"]);
    record("order", { item, size, idempotency_key: ctx.idempotencyKey });
    return `ordered ${item} in ${size}`;
  },
});

const remind = defineTool({
  name: "remind",
  description: "Sleeps durably, then reminds.",
  kind: "read",
  retry: FAST,
  parameters: keyed({ seconds: { type: "number" } }),
  run(args: Args, ctx: ToolContext) {
    record("remind.before_sleep", { sleeps_done: ctx.sleepsDone });
    ctx.sleep(Number(args.seconds));
    record("remind", { idempotency_key: ctx.idempotencyKey });
    return "time is up";
  },
});

const publish = defineTool({
  name: "publish",
  description: "Needs approval; a keyed write, so it may run again after a crash.",
  kind: "idempotent_write",
  retry: FAST,
  approval: true,
  parameters: keyed({ post: { type: "string" } }),
  run(args: Args, ctx: ToolContext) {
    record("publish", {
      post: args.post,
      idempotency_key: ctx.idempotencyKey,
      attempt: ctx.attempt,
    });
    return `published ${String(args.post)}`;
  },
});

const pay = defineTool({
  name: "pay",
  description: "A write with a check probe: the bank can be asked whether the payment happened.",
  kind: "write",
  parameters: keyed({ amount: { type: "integer" } }),
  async run(args: Args, ctx: ToolContext) {
    record("pay", { amount: args.amount, idempotency_key: ctx.idempotencyKey });
    await gate(args.gate, ctx.attempt, ctx.signal);
    return `paid ${String(args.amount)}`;
  },
  check(ctx: ToolContext, args: Args) {
    const found = entries("pay").filter((e) => e.idempotency_key === ctx.idempotencyKey);
    record("pay.check", { found: found.length });
    return { happened: found.length > 0, result: `paid ${String(args.amount)} (found by check)` };
  },
});

export const assistant = defineAgent({
  name: "assistant",
  model: new Recorded(script),
  instructions: "You are a test agent.",
  tools: [lookup, charge, upsert, refuse, flaky],
  modelRetry: FAST,
});

export const streamer = defineAgent({
  name: "streamer",
  model: new Recorded(script, 4, 0.01),
  tools: [lookup],
  modelRetry: FAST,
});

/** agents.py's ``waiter``: its approvals, questions, timers, tasks and check probe (not
 * its predicate approval or timer tool). */
export const waiter = defineAgent({
  name: "waiter",
  model: new Recorded(script),
  tools: [deleteAll, order, remind, render, pay, lookup, charge, publish, exportReport],
  modelRetry: FAST,
});

export const compactor = defineAgent({
  name: "compactor",
  model: new Recorded(script),
  tools: [lookup],
  modelRetry: FAST,
  compactThresholdChars: 400,
});

export const slowSummaries = defineAgent({
  name: "slow_summaries",
  model: new GatedSummaries(script),
  tools: [lookup],
  modelRetry: FAST,
  compactThresholdChars: 400,
});

if (require.main === module) {
  const agents = [assistant, streamer, waiter, compactor, slowSummaries];
  new Worker({ agents }).run().then(
    () => process.exit(0),
    (e: unknown) => {
      process.stderr.write(`${e instanceof WorkerRefusedError ? e.message : String(e)}\n`);
      process.exit(1);
    },
  );
}
