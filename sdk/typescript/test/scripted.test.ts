/** The scripted stand-in model: served by a Worker to a fake node, it answers what its
 * script says of the history (a tool call, then a final answer), streams its text, and
 * summarizes as Python's Scripted does. */
import { test } from "node:test";
import assert from "node:assert/strict";

import { Item, ModelRequest, ModelResponse, Scripted, call, defineAgent, say } from "../src";
import type * as p from "../src/protocol";
import { FakeNode, runModelStep } from "./fake-node";

/** The TypeScript page's script: a tool call first, then an answer from its result. */
function script(history: Item[]): ModelResponse {
  const last = history[history.length - 1];
  if (last.type === "tool_result") return say(`Done: ${String(last.result)}`);
  return { toolCalls: [call("get_weather", { city: "Paris" })] };
}

const node = new FakeNode();
node.serveWorker({ agents: [defineAgent({ name: "concierge", model: new Scripted(script) })] });

function runModel(id: string, base: number, history: Item[]): p.StepMessage {
  return runModelStep("concierge", "s1", id, base, history);
}

test("a Worker serves the scripted model: a tool call, then an answer from its result", async () => {
  const [hello] = (await node.frameWith((m) => m.t === "hello")) as p.Hello[];
  assert.deepEqual(hello.agents[0].model, { provider: "scripted", name: "scripted" });

  node.send([runModel("m1", 0, [{ type: "user", text: "Weather in Paris?" }])]);
  const asked = (await node.result("m1")) as p.Done;
  const calls = [{ id: "call_1", name: "get_weather", arguments: { city: "Paris" } }];
  assert.deepEqual((asked.result as p.ModelResponse).tool_calls, calls);

  const result: Item = {
    ...{ type: "tool_result", call_id: "call_1", name: "get_weather" },
    ...{ status: "succeeded", result: "sunny in Paris" },
  };
  node.send([runModel("m2", 1, [{ type: "assistant", tool_calls: calls }, result])]);
  const frame = await node.frameWith((m) => m.t === "done" && m.attempt_id === "m2");
  const delta = frame.find((m) => m.t === "delta" && m.attempt_id === "m2") as p.Delta;
  const answer = frame.find((m) => m.t === "done" && m.attempt_id === "m2") as p.Done;
  assert.equal(delta.text, "Done: sunny in Paris"); // streamed, then the response
  assert.equal((answer.result as p.ModelResponse).text, "Done: sunny in Paris");
  assert.deepEqual((answer.result as p.ModelResponse).tool_calls, []);
});

const request = (history: Item[]): ModelRequest => ({
  ...{ sessionId: "s", agent: "a", instructions: "", history, tools: [], attempt: 1 },
  ...{ signal: new AbortController().signal, traceparent: null },
});

test("a script may answer with text alone, or asynchronously", async () => {
  for (const model of [new Scripted(() => "hello"), new Scripted(async () => say("hello"))]) {
    const events = [];
    for await (const event of model.stream(request([{ type: "user", text: "hi" }]))) {
      events.push(event);
    }
    assert.deepEqual(events, ["hello", { text: "hello" }]);
  }
});

test("the summary is Python's Scripted digest", async () => {
  const history: Item[] = [
    { type: "summary", text: "Earlier." },
    { type: "user", text: "one" },
    { type: "assistant", text: "reply" },
    { type: "user", text: "two" },
  ];
  const summary = await new Scripted(() => "").summarize(request(history));
  assert.equal(summary.text, "Summary of 4 items. Before that: Earlier. The user said: one | two");
});

test("call and say; a Scripted needs a function", () => {
  assert.deepEqual(call("ping"), { id: "call_1", name: "ping", arguments: {} });
  assert.deepEqual(call("ping", { n: 1 }, "call_2"), { id: "call_2", name: "ping", arguments: { n: 1 } });
  assert.deepEqual(say("done"), { text: "done" });
  assert.throws(
    () => new Scripted("hello" as never),
    /Scripted needs a function of the history, not string/,
  );
});
