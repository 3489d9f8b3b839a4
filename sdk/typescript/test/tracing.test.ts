/** The Worker's OpenTelemetry spans as a trace viewer shows them, the Python Worker's: one
 * per attempt, under the hand-out's traceparent, with the tool's own spans nested in it; and
 * none from a Worker with tracing off. */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { SpanKind, SpanStatusCode, context, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  ReadableSpan,
  SimpleSpanProcessor,
} from "@opentelemetry/sdk-trace-base";

import { defineAgent, ModelRequest, ModelResponse, ToolError, Worker } from "../src";
import type * as p from "../src/protocol";
import { FakeNode, heldTool, logged, readTool, until } from "./fake-node";

// what an application does (NodeSDK does both): before the Worker starts
const exporter = new InMemorySpanExporter();
const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
trace.setGlobalTracerProvider(provider);
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());

const TRACE_ID = "0af7651916cd43dd8448eb211c80319c";
const PARENT_ID = "b7ad6b7169203331";
const TRACEPARENT = `00-${TRACE_ID}-${PARENT_ID}-01`;

const model = {
  spec: () => ({ provider: "scripted", name: "m-1" }),
  async *stream(_request: ModelRequest): AsyncIterable<string | ModelResponse> {
    yield { text: "hi" };
  },
};

const hold = heldTool("hold", "held"); // its span ends when it returns
const tools = [
  readTool("lookup", () =>
    trace.getTracer("user code").startActiveSpan("query the table", (span) => {
      span.end();
      return "value";
    }),
  ),
  readTool("refuse", () => {
    throw new ToolError("no such key");
  }),
  readTool("crash", () => {
    throw new Error("boom");
  }),
  readTool("ask", (_args, ctx) => ctx.ask("which one?")),
  hold.tool,
];
const agent = defineAgent({ name: "a", model, tools });

const traced = new FakeNode();
const untraced = new FakeNode();
const workers: Worker[] = [];
const runs: Promise<void>[] = [];

before(async () => {
  for (const [node, tracing] of [
    [traced, true],
    [untraced, false],
  ] as const) {
    await node.listening();
    const worker = new Worker({
      address: node.address,
      agents: [agent],
      handleSignals: false,
      workerId: tracing ? "w-traced" : "w-untraced",
      tracing,
    });
    workers.push(worker);
    runs.push(worker.run());
    await node.frameWith((m) => m.t === "hello");
  }
});

after(async () => {
  hold.release();
  await Promise.all(workers.map((w) => w.shutdown(5)));
  await Promise.all(runs);
  for (const node of [traced, untraced]) node.server.close();
  await provider.shutdown();
});

function callTool(id: string, tool: string, traceparent?: string): p.StepMessage {
  const step = { t: "step", session_id: "s1", step_id: `step-${id}`, attempt_id: id, attempt: 2 };
  const call = { step_type: "CallTool", agent: "a", tool, call_id: `c-${id}`, arguments: {} };
  return { ...step, ...call, ...(traceparent ? { traceparent } : {}) } as p.StepMessage;
}

/** The Worker's span of attempt ``id``, once it ended. */
async function spanOf(id: string): Promise<ReadableSpan> {
  const find = (): ReadableSpan | undefined =>
    exporter.getFinishedSpans().find((s) => s.attributes["dex.attempt_id"] === id);
  await until(`the span of attempt ${id}`, () => find() !== undefined);
  return find() as ReadableSpan;
}

test("a tool's attempt is a span under the hand-out's traceparent, the tool's own inside", async () => {
  traced.send([callTool("t1", "lookup", TRACEPARENT)]);
  assert.equal(((await traced.result("t1")) as p.Done).t, "done");
  const span = await spanOf("t1");
  assert.equal(span.name, "dex.tool lookup");
  assert.equal(span.kind, SpanKind.CONSUMER);
  assert.equal(span.instrumentationScope.name, "dex.worker");
  assert.equal(span.spanContext().traceId, TRACE_ID);
  assert.equal(span.parentSpanContext?.spanId, PARENT_ID);
  assert.equal(span.parentSpanContext?.isRemote, true);
  assert.deepEqual(span.attributes, {
    "dex.session_id": "s1",
    "dex.step_id": "step-t1",
    "dex.step_type": "CallTool",
    "dex.attempt_id": "t1",
    "dex.attempt": 2,
    "dex.agent": "a",
    "dex.worker_id": "w-traced",
    "dex.tool": "lookup",
    "dex.call_id": "c-t1",
  });
  assert.equal(span.status.code, SpanStatusCode.UNSET);
  const own = exporter.getFinishedSpans().filter((s) => s.name === "query the table");
  assert.equal(own.length, 1);
  assert.equal(own[0].spanContext().traceId, TRACE_ID);
  assert.equal(own[0].parentSpanContext?.spanId, span.spanContext().spanId);
});

test("a model's attempt names the model; a malformed traceparent starts a new trace", async () => {
  const step = { t: "step", session_id: "s1", step_id: "m", attempt_id: "m1", attempt: 1 };
  const bad = `00-${TRACE_ID}-${PARENT_ID}-01-extra`; // version 00 has four fields
  traced.send([{ ...step, step_type: "RunModel", agent: "a", history: [], traceparent: bad }]);
  assert.equal(((await traced.result("m1")) as p.Done).t, "done");
  const span = await spanOf("m1");
  assert.equal(span.name, "dex.model a");
  assert.equal(span.attributes["gen_ai.system"], "scripted");
  assert.equal(span.attributes["gen_ai.request.model"], "m-1");
  assert.equal(span.attributes["dex.tool"], undefined);
  assert.equal(span.parentSpanContext, undefined);
  assert.notEqual(span.spanContext().traceId, TRACE_ID);
});

test("a ToolError or a crash sets the status to error, the crash recorded", async () => {
  traced.send([callTool("t2", "refuse", TRACEPARENT), callTool("t3", "crash", TRACEPARENT)]);
  const refused = await spanOf("t2");
  assert.deepEqual(refused.status, { code: SpanStatusCode.ERROR, message: "no such key" });
  assert.deepEqual(refused.events, []);
  const crashed = await spanOf("t3");
  assert.deepEqual(crashed.status, { code: SpanStatusCode.ERROR, message: "Error: boom" });
  assert.deepEqual(
    crashed.events.map((e) => [e.name, e.attributes?.["exception.message"]]),
    [["exception", "boom"]],
  );
});

test("a question pauses the span, a cancellation marks it, neither an error", async () => {
  traced.send([callTool("t4", "ask", TRACEPARENT), callTool("t5", "hold", TRACEPARENT)]);
  const asked = await spanOf("t4");
  assert.equal(asked.attributes["dex.paused"], true);
  assert.equal(asked.status.code, SpanStatusCode.UNSET);
  await until("the hold tool running", () => hold.running === 1);
  traced.send([{ t: "cancel", attempt_id: "t5" }]);
  await until("the attempt abandoned", () =>
    logged.some((l) => l.includes("action=worker.attempt_abandoned") && l.includes("attempt_id=t5")),
  );
  hold.release();
  const cancelled = await spanOf("t5");
  assert.equal(cancelled.attributes["dex.cancelled"], true);
  assert.equal(cancelled.status.code, SpanStatusCode.UNSET);
});

test("a Worker with tracing off makes no spans; the tool's own are roots", async () => {
  untraced.send([{ ...callTool("u1", "lookup", TRACEPARENT), session_id: "s-off" }]);
  assert.equal(((await untraced.result("u1")) as p.Done).t, "done");
  const mine = (): ReadableSpan[] =>
    exporter.getFinishedSpans().filter((s) => s.name === "query the table" && !s.parentSpanContext);
  await until("the tool's own span", () => mine().length === 1);
  const workerIds = exporter.getFinishedSpans().map((s) => s.attributes["dex.worker_id"]);
  assert.ok(!workerIds.includes("w-untraced"));
});
