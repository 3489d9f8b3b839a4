/** A model provider's rate limit (RateLimitedError): a RunModel or CompactContext Step goes
 * back (``back``, reason ``rate_limited``, its wait clamped to 0..3600 s), using no
 * attempt; a tool that throws it fails as any other error does. */
import { test } from "node:test";
import assert from "node:assert/strict";

import { defineAgent, ModelRequest, ModelResponse, NonRetryableError, RateLimitedError, Summary } from "../src";
import type * as p from "../src/protocol";
import { FakeNode, logged, readTool, runModelStep, until } from "./fake-node";

/** The wait the last user message names: ``wait:SECONDS`` (any JSON number, or ``none``);
 * any other text is answered. */
function refusal(request: ModelRequest): RateLimitedError | null {
  const last = request.history.filter((i) => i.type === "user").at(-1);
  const text = last !== undefined && "text" in last ? last.text : "";
  if (!text.startsWith("wait:")) return null;
  const wait = text.slice("wait:".length);
  const seconds = wait === "none" ? undefined : wait === "NaN" ? NaN : (JSON.parse(wait) as number);
  return new RateLimitedError(`fake: HTTP 429 (rate limited): ${text}`, seconds);
}

const provider = {
  spec: () => ({ provider: "limited" }),
  async *stream(request: ModelRequest): AsyncIterable<string | ModelResponse> {
    const refused = refusal(request);
    if (refused !== null) throw refused;
    yield { text: "answered", stopReason: "end_turn" };
  },
  async summarize(request: ModelRequest): Promise<Summary> {
    const refused = refusal(request);
    if (refused !== null) throw refused;
    return { text: "summary" };
  },
};

const limitedTool = readTool("limited", () => {
  throw new RateLimitedError("the service's own rate limit", 30);
});

const finalTool = readTool("final", () => {
  throw new NonRetryableError("the account is closed");
});

const node = new FakeNode();
node.serveWorker({
  agents: [defineAgent({ name: "r", model: provider, tools: [limitedTool, finalTool] })],
  capacity: 4,
});

function asking(id: string, text: string): p.StepMessage {
  return runModelStep("r", `s-${id}`, id, 0, [{ type: "user", text }]);
}

test("a RunModel whose model is rate limited goes back with the wait, clamped", async () => {
  await node.frameWith((m) => m.t === "hello");
  node.send([
    asking("m1", "wait:2.5"),
    asking("m2", "wait:5000"),
    asking("m3", "wait:-3"),
    asking("m4", "hello"),
  ]);
  assert.deepEqual(await node.result("m1"), {
    t: "back",
    attempt_id: "m1",
    reason: "rate_limited",
    retry_after: 2.5,
  });
  assert.deepEqual(await node.result("m2"), {
    t: "back",
    attempt_id: "m2",
    reason: "rate_limited",
    retry_after: 3600,
  });
  assert.deepEqual(await node.result("m3"), {
    t: "back",
    attempt_id: "m3",
    reason: "rate_limited",
    retry_after: 0,
  });
  const answered = (await node.result("m4")) as p.Done;
  assert.equal(answered.t, "done");
  assert.equal((answered.result as ModelResponse).text, "answered");
  // logged as the Python Worker logs it, and not as a failed attempt
  await until("the rate limit logged", () =>
    logged.some((l) => l.includes("action=worker.rate_limited") && l.includes("attempt_id=m2")),
  );
  const m2 = logged.find((l) => l.includes("action=worker.rate_limited") && l.includes("attempt_id=m2"));
  assert.match(m2 ?? "", / INFO dex\.worker fake: HTTP 429 \(rate limited\): wait:5000 .*retry_after=3600/);
  assert.ok(!logged.some((l) => l.includes("action=worker.attempt_failed")), "a rate limit logged as a failure");
});

test("without a wait, or with one that is no number, the back names none", async () => {
  node.send([asking("n1", "wait:none"), asking("n2", "wait:NaN")]);
  for (const id of ["n1", "n2"]) {
    const back = await node.result(id);
    assert.deepEqual(back, { t: "back", attempt_id: id, reason: "rate_limited" });
    assert.ok(!("retry_after" in back), "a retry_after for an unknown wait");
  }
});

test("a CompactContext whose summary is rate limited goes back too", async () => {
  const step = { t: "step", attempt_id: "c1", session_id: "s-c1", step_id: "c1", attempt: 2, agent: "r" };
  node.send([{ ...step, step_type: "CompactContext", history: [{ type: "user", text: "wait:7" }] }]);
  assert.deepEqual(await node.result("c1"), {
    t: "back",
    attempt_id: "c1",
    reason: "rate_limited",
    retry_after: 7,
  });
});

test("a tool that throws RateLimitedError fails as before: its body ran", async () => {
  const call = { t: "step", session_id: "s-t1", attempt: 1, agent: "r", tool: "limited", arguments: {} };
  node.send([{ ...call, step_type: "CallTool", attempt_id: "t1", step_id: "t1", call_id: "c1" }]);
  const failed = (await node.result("t1")) as p.Fail;
  assert.deepEqual(failed, {
    t: "fail",
    attempt_id: "t1",
    error: {
      message: "RateLimitedError: the service's own rate limit",
      retryable: true,
      attempt_progress: "NOT_COMPLETED",
    },
  });
  assert.ok(
    node.frames.every((f) => f.every((m) => !(m.t === "back" && m.attempt_id === "t1"))),
    "a tool's rate limit handed back",
  );
  assert.ok(logged.some((l) => l.includes("action=worker.attempt_failed") && l.includes("attempt_id=t1")));
});

test("RateLimitedError carries its message, its wait and its name", () => {
  const e = new RateLimitedError("slow down", 12);
  assert.ok(e instanceof Error);
  assert.equal(e.name, "RateLimitedError");
  assert.equal(e.message, "slow down");
  assert.equal(e.retryAfter, 12);
  assert.equal(new RateLimitedError("slow down").retryAfter, undefined);
});

test("a NonRetryableError fails the attempt for good", async () => {
  const call = { t: "step", session_id: "s-t2", attempt: 1, agent: "r", tool: "final", arguments: {} };
  node.send([{ ...call, step_type: "CallTool", attempt_id: "t2", step_id: "t2", call_id: "c2" }]);
  const failed = (await node.result("t2")) as p.Fail;
  assert.deepEqual(failed.error, {
    message: "NonRetryableError: the account is closed",
    retryable: false,
    attempt_progress: "NOT_COMPLETED",
  });
});
