/** The public types are camelCase; the Worker writes them as the protocol's snake_case,
 * and refuses a field spelt the wire's way rather than dropping it. */
import { test } from "node:test";
import assert from "node:assert/strict";

import { Scripted, defineAgent, defineTool, say } from "../src";
import { wireResponse, wireSummary } from "../src/agent";

const retry = { maxAttempts: 3, initialBackoffSeconds: 0.5, backoffMultiplier: 2, maxBackoffSeconds: 9, withinSeconds: 60 };
const wireRetry = {
  max_attempts: 3,
  initial_backoff_seconds: 0.5,
  backoff_multiplier: 2,
  max_backoff_seconds: 9,
  within_seconds: 60,
};

test("a tool's retry and an agent's modelRetry are written snake_case in the spec", () => {
  const tool = defineTool({ name: "t", kind: "read", parameters: {}, run: () => 1, retry });
  const agent = defineAgent({ name: "a", model: new Scripted(() => "x"), tools: [tool], modelRetry: retry });
  assert.deepEqual(tool.spec().retry, wireRetry);
  assert.deepEqual(agent.spec().model_retry, wireRetry);
  const old = { max_attempts: 3 } as unknown as typeof retry; // from JavaScript, say
  assert.throws(
    () => defineTool({ name: "t", kind: "read", parameters: {}, run: () => 1, retry: old }).spec(),
    /tool t: retry: no field max_attempts; did you mean maxAttempts\?/,
  );
});

test("an agent's onBusy is written on_busy in the spec, and left out when the default", () => {
  const model = new Scripted(() => "x");
  assert.equal(defineAgent({ name: "a", model, onBusy: "steer" }).spec().on_busy, "steer");
  assert.equal("on_busy" in defineAgent({ name: "a", model, onBusy: "enqueue" }).spec(), false);
  assert.equal("on_busy" in defineAgent({ name: "a", model }).spec(), false);
});

test("a model's response and summary are written snake_case, every field there", () => {
  const call = { id: "c1", name: "t" };
  const response = { toolCalls: [call], stopReason: "tool_use", usage: { inputTokens: 5, outputTokens: 7 }, approvalRequired: ["c1"], state: { k: 1 } };
  assert.deepEqual(wireResponse(response, ["c2"]), {
    text: "",
    tool_calls: [{ id: "c1", name: "t", arguments: {} }],
    stop_reason: "tool_use",
    usage: { input_tokens: 5, output_tokens: 7 },
    approval_required: ["c1", "c2"],
    state: { k: 1 },
  });
  assert.deepEqual(wireResponse(say("hi"), []), { text: "hi", tool_calls: [], stop_reason: "end_turn", approval_required: [] });
  assert.deepEqual(wireSummary({ text: "s", usage: { inputTokens: 1 } }), { text: "s", usage: { input_tokens: 1 } });
  assert.throws(() => wireResponse({ tool_calls: [call] } as never, []), /ModelResponse: no field tool_calls; did you mean toolCalls\?/);
});
