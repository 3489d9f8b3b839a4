/** What a tool's context does on the wire, against a fake node: ``ctx.heartbeat()`` sends
 * an hb of its attempt alone, and a cancel from the node aborts the attempt's
 * ``ctx.signal``, after which the Worker sends nothing more for it, even when the tool
 * returns a value. */
import { test } from "node:test";
import assert from "node:assert/strict";

import { defineAgent, ModelResponse } from "../src";
import type * as p from "../src/protocol";
import { FakeNode, heldTool, readTool, until } from "./fake-node";

const silent = {
  spec: () => ({ provider: "silent" }),
  async *stream(): AsyncIterable<string | ModelResponse> {
    throw new Error("no model call in these tests");
  },
};

let beaten = (): void => undefined;
const beat = readTool("beat", async (_args, ctx) => {
  ctx.heartbeat();
  await new Promise<void>((resolve) => (beaten = resolve));
  return "beat";
});

/** Why the "obey" call's signal aborted (undefined: it has not). */
let stopped: unknown;
const obey = readTool("obey", async (_args, ctx) => {
  await new Promise<void>((resolve) => ctx.signal.addEventListener("abort", () => resolve()));
  stopped = ctx.signal.reason;
  return "finished anyway"; // dropped: the attempt was cancelled
});

const hold = heldTool("hold", "held");

const node = new FakeNode();
node.serveWorker({
  agents: [defineAgent({ name: "a", model: silent, tools: [beat, obey, hold.tool] })],
  heartbeatInterval: 0.05,
});

function call(id: string, tool: string): p.StepMessage {
  const step = { t: "step", session_id: `s-${id}`, attempt: 1, agent: "a", tool, arguments: {} };
  return { ...step, step_type: "CallTool", attempt_id: id, step_id: id, call_id: id } as p.StepMessage;
}

/** Whether ``m`` is about attempt ``id``: its attempt_id, or among an hb's attempts. */
function about(m: p.WorkerMessage, id: string): boolean {
  return ("attempt_id" in m && m.attempt_id === id) || (m.t === "hb" && m.attempts.includes(id));
}

test("a tool's ctx.heartbeat() sends an hb of its attempt alone, while it runs", async () => {
  await node.frameWith((m) => m.t === "hello");
  node.send([call("b1", "beat")]);
  // the Worker's own beats carry a seq: one without is the tool's
  const own = (m: p.WorkerMessage): boolean => m.t === "hb" && m.seq === undefined && about(m, "b1");
  const frame = await node.frameWith(own);
  assert.deepEqual(frame.find(own), { t: "hb", attempts: ["b1"] });
  assert.ok(node.frames.every((f) => !f.some((m) => m.t === "done" && about(m, "b1"))));
  beaten();
  assert.deepEqual(((await node.result("b1")) as p.Done).result, { status: "succeeded", result: "beat" });
});

test("a cancel aborts the attempt's ctx.signal, and the Worker sends nothing more for it", async () => {
  node.send([call("c1", "obey"), call("h1", "hold")]);
  await node.frameWith((m) => m.t === "hb" && about(m, "c1") && about(m, "h1"));
  const from = node.frames.length;
  node.send([{ t: "cancel", attempt_id: "c1" }]);
  await until("the cancelled tool's signal aborted", () => stopped !== undefined);
  assert.equal((stopped as Error).message, "cancelled by the server");
  // the Worker beats on for h1 (every 50 ms), leaving c1 out
  const beatsOfH1 = (): number =>
    node.frames.slice(from).filter((f) => f.some((m) => m.t === "hb" && about(m, "h1"))).length;
  await until("three more beats of h1", () => beatsOfH1() >= 3);
  hold.release();
  await node.result("h1");
  const sent = node.frames.slice(from).flat().filter((m) => about(m, "c1"));
  assert.deepEqual(sent, [], "the Worker sent something for the cancelled attempt");
});
