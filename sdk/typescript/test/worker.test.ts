/** The Worker against a fake node (a WebSocket server in this process): what it says in
 * hello, how it batches a frame and joins deltas, how it builds on the history it kept,
 * checks arguments, asks for approval and passes the traceparent on. */
import { test } from "node:test";
import assert from "node:assert/strict";

import { defineAgent, defineTool, ModelRequest, ModelResponse } from "../src";
import { backoff } from "../src/connection";
import type * as p from "../src/protocol";
import { FakeNode, heldTool, logged, runModelStep, until } from "./fake-node";

/** Answers with the texts of the history it saw, streamed in three pieces. */
const viewer = {
  spec: () => ({ provider: "viewer" }),
  async *stream(request: ModelRequest): AsyncIterable<string | ModelResponse> {
    const text = request.history.map((i) => `${i.type}:${"text" in i ? i.text : ""}`).join("|");
    yield "str";
    yield "eam";
    yield "ed";
    const calls = request.history.some((i) => "text" in i && i.text === "pay")
      ? [
          { id: "c1", name: "pay", arguments: { amount: 5 } },
          { id: "c2", name: "pay", arguments: { amount: 500 } },
          { id: "c3", name: "pay", arguments: { amount: "lots" } },
        ]
      : [];
    yield { text, toolCalls: calls, stopReason: "end_turn" };
  },
};

const pay = defineTool<{ amount: number }>({
  name: "pay",
  kind: "write",
  parameters: {
    type: "object",
    properties: { amount: { type: "integer", minimum: 1 }, memo: { type: "string", default: "" } },
    required: ["amount"],
    additionalProperties: false,
  },
  approval: (args) => {
    if (typeof args.amount !== "number") throw new Error("not a number");
    return args.amount > 100;
  },
  run: (args, ctx) => ({ args, traceparent: ctx.traceparent }),
});

const hold = heldTool("hold", "held");
const gate = heldTool("gate", "opened");
const keep = heldTool("keep", "kept");

/** Returns what JSON cannot carry. */
const hugeTool = defineTool({
  name: "huge",
  kind: "read",
  parameters: { type: "object", properties: {} },
  run: () => ({ n: 10n ** 30n }),
});

const node = new FakeNode();
node.serveWorker({
  agents: [defineAgent({ name: "a", model: viewer, tools: [pay, hold.tool, gate.tool, keep.tool, hugeTool] })],
  capacity: 3,
});

/** A RunModel hand-out of agent ``a``. */
function runModel(id: string, session: string, base: number, history: unknown[]): p.StepMessage {
  return runModelStep("a", session, id, base, history);
}

test("hello announces the agents, the capacity and the history cache", async () => {
  const [hello] = (await node.frameWith((m) => m.t === "hello")) as p.Hello[];
  assert.equal(hello.capacity, 3);
  assert.equal(hello.history_cache, 1024);
  assert.equal(hello.agents[0].tools?.[0].approval, "predicate");
  assert.deepEqual(hello.attempts, []);
});

test("what is ready in one tick leaves in one frame, the deltas of an attempt joined", async () => {
  await node.frameWith((m) => m.t === "hello");
  node.send([runModel("m1", "s1", 0, [{ type: "user", text: "one" }])]);
  const frame = (await node.frameWith((m) => m.t === "done" && m.attempt_id === "m1")).filter(
    (m) => m.t !== "hb",
  );
  assert.deepEqual(
    frame.map((m) => m.t),
    ["delta", "done"],
  );
  assert.equal((frame[0] as p.Delta).text, "streamed");
});

test("a RunModel hand-out builds on the view the Worker kept, or goes back", async () => {
  await node.result("m1");
  const delta = [
    { type: "assistant", text: "reply" },
    { type: "user", text: "two" },
  ];
  node.send([runModel("m2", "s1", 1, delta), runModel("m3", "s-unknown", 4, delta)]);
  const m2 = (await node.result("m2")) as p.Done;
  assert.equal((m2.result as ModelResponse).text, "user:one|assistant:reply|user:two");
  assert.deepEqual(await node.result("m3"), { t: "back", attempt_id: "m3", reason: "history" });
  node.send([runModel("m4", "s2", 0, [{ type: "robot" }])]);
  const m4 = (await node.result("m4")) as p.Fail;
  assert.equal(m4.t, "fail");
  assert.equal(m4.error.retryable, false);
  assert.match(m4.error.message, /history item 0 has type "robot"/);
});

test("approval predicates list their calls; one that throws asks a person", async () => {
  node.send([runModel("m5", "s3", 0, [{ type: "user", text: "pay" }])]);
  const done = (await node.result("m5")) as p.Done;
  assert.deepEqual((done.result as p.ModelResponse).approval_required, ["c2", "c3"]);
});

test("arguments are checked before the body, which sees defaults and traceparent", async () => {
  const call = { t: "step", session_id: "s4", attempt: 1, agent: "a", tool: "pay" };
  const traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  node.send([
    { ...call, step_type: "CallTool", attempt_id: "t1", step_id: "t1", call_id: "c1",
      arguments: { amount: 0, x: 1 } },
    { ...call, step_type: "CallTool", attempt_id: "t2", step_id: "t2", call_id: "c2",
      arguments: { amount: 7 }, traceparent },
  ]);
  const refused = ((await node.result("t1")) as p.Done).result as p.ToolOutcome;
  assert.equal(refused.status, "failed");
  const why = "invalid arguments for tool 'pay': x: not a parameter; amount: must be >= 1";
  assert.equal(refused.error, why);
  const ran = ((await node.result("t2")) as p.Done).result as p.ToolOutcome;
  const result = { args: { amount: 7, memo: "" }, traceparent };
  assert.deepEqual(ran, { status: "succeeded", result });
});

test("a result JSON cannot carry fails its attempt; the Worker goes on", async () => {
  const call = { t: "step", session_id: "s6", attempt: 1, agent: "a", step_type: "CallTool" };
  node.send([
    { ...call, tool: "huge", attempt_id: "u1", step_id: "u1", call_id: "c1", arguments: {} },
    { ...call, tool: "pay", attempt_id: "u2", step_id: "u2", call_id: "c2",
      arguments: { amount: 3 } },
  ]);
  const failed = (await node.result("u1")) as p.Fail;
  assert.equal(failed.t, "fail");
  assert.match(failed.error.message, /^the result cannot be sent as JSON: .*BigInt/);
  assert.equal(failed.error.retryable, true);
  assert.equal(failed.error.attempt_progress, "NOT_COMPLETED");
  const ran = ((await node.result("u2")) as p.Done).result as p.ToolOutcome;
  assert.equal(ran.status, "succeeded");
});

test("no more attempts run at once than the capacity, a stopped one's code included", async () => {
  const call = { t: "step", session_id: "s5", attempt: 1, agent: "a", tool: "hold" };
  const holds = ["h1", "h2", "h3", "h4", "h5"].map((id) => ({
    ...call,
    step_type: "CallTool",
    attempt_id: id,
    step_id: id,
    call_id: id,
    arguments: {},
  }));
  const waiting = (): number => logged.filter((l) => l.includes("action=worker.at_capacity")).length;
  node.send(holds.slice(0, 4));
  await until("3 calls running", () => hold.running === 3);
  // a Step beyond the capacity (in a cluster, another node's took it) goes back at once
  assert.deepEqual(await node.result("h4"), { t: "back", attempt_id: "h4" });
  node.send([{ t: "cancel", attempt_id: "h1" }]); // its code runs on: its slot stays taken
  node.send(holds.slice(4));
  await until("a call waiting for the stopped one's slot", () => waiting() === 1);
  assert.equal(hold.running, 3);
  hold.release();
  for (const id of ["h2", "h3", "h5"]) {
    const done = (await node.result(id)) as p.Done;
    assert.deepEqual(done.result, { status: "succeeded", result: "held" });
  }
  assert.equal(hold.most, 3);
});

function gateCall(id: string, tool: string): p.StepMessage {
  const call = { t: "step", session_id: `s-${id}`, attempt: 1, agent: "a", tool, arguments: {} };
  return { ...call, step_type: "CallTool", attempt_id: id, step_id: id, call_id: id } as p.StepMessage;
}

test("a single node: a tool's heartbeat reply and a dropped connection make no stray", async () => {
  node.send([gateCall("g1", "gate")]);
  await until("the call running", () => gate.running === 1);
  // the reply to a tool's own heartbeat (no seq) names only that attempt: it leaves g1 out
  node.send([{ t: "hb", status: {} }]);
  const from = node.frames.length;
  node.drop(); // after the reply: its close follows what was sent
  // a single node's dropped connection makes no stray: the hello re-claims g1
  const hello = await node.frameWith((m) => m.t === "hello", from);
  assert.deepEqual((hello.find((m) => m.t === "hello") as p.Hello).attempts, ["g1"]);
  // the welcome is answered at once with a beat (a seq of its own), not a heartbeat (1 s) later
  const welcomed = Date.now();
  const next = node.frames.indexOf(hello) + 1;
  const beat = await node.frameWith((m) => m.t === "hb", next);
  assert.ok(Date.now() - welcomed < 600, "no beat at once on the welcome");
  assert.equal(node.frames.indexOf(beat), next);
  assert.deepEqual(beat, [{ t: "hb", attempts: ["g1"], seq: (beat[0] as p.Heartbeat).seq }]);
  assert.equal(typeof (beat[0] as p.Heartbeat).seq, "number");
  gate.release();
  // not a stray: its result goes to its node at once
  assert.deepEqual(((await node.result("g1")) as p.Done).result, { status: "succeeded", result: "opened" });
  assert.ok(node.frames.every((f) => f.every((m) => m.t !== "claim")), "a claim to a single node");
});

test("the reply to the periodic beat makes a stray; its result waits until its node takes it", async () => {
  node.send([gateCall("k1", "keep")]);
  await until("the call running", () => keep.running === 1);
  // each heartbeat beats all it holds with a seq of its own, and no claim (no members)
  const beats = (m: p.WorkerMessage): boolean => m.t === "hb" && m.seq != null && m.attempts.includes("k1");
  const frame = await node.frameWith(beats, node.frames.length);
  assert.deepEqual(frame.map((m) => m.t), ["hb"]);
  const beat = frame.find(beats) as p.Heartbeat;
  assert.deepEqual(beat.attempts, ["k1"]);
  node.send([{ t: "hb", status: {}, seq: beat.seq }]); // the node gave k1's session up
  await new Promise((resolve) => setTimeout(resolve, 100));
  keep.release();
  await new Promise((resolve) => setTimeout(resolve, 300));
  const settles = (m: p.WorkerMessage): boolean => m.t === "done" && m.attempt_id === "k1";
  assert.ok(node.frames.every((f) => !f.some(settles)), "a stray's result was sent");
  node.send([{ t: "hb", status: { k1: "ok" } }]); // the node owns it again: it takes it
  assert.deepEqual(((await node.result("k1")) as p.Done).result, { status: "succeeded", result: "kept" });
  assert.ok(node.frames.every((f) => f.every((m) => m.t !== "claim")), "a claim to a single node");
});

test("the reconnect backoff grows exponentially to its cap, with full jitter", () => {
  assert.equal(backoff(0, 0.1, 1, () => 0.999999) < 0.1, true);
  assert.equal(backoff(3, 0.1, 1, () => 0.5), 0.4);
  assert.equal(backoff(20, 0.1, 1, () => 0.5), 0.5); // capped at 1 s
  assert.equal(backoff(20, 0.1, 1, () => 0), 0);
  for (let n = 0; n < 30; n++) {
    const pause = backoff(n, 0.1, 1);
    assert.ok(pause >= 0 && pause <= Math.min(1, 0.1 * 2 ** n), `backoff(${n}) = ${pause}`);
  }
});
