/** In a cluster an attempt outlives the node that handed it out: the Worker keeps running
 * it as a stray and claims it on every connection until the node that took its session
 * over answers, or its own node, back, says ok; only the reply to a connection's periodic
 * beat makes strays, and a stray's result waits for the node that takes it
 * (docs/worker-protocol.md, rule 14; Runner.beat, Runner.strays, Runner.lost). */
import { test } from "node:test";
import assert from "node:assert/strict";

import { defineAgent, defineTool, say, Scripted } from "../src";
import { HistoryCache } from "../src/history";
import { Log } from "../src/log";
import type * as p from "../src/protocol";
import { type Origin, Runner } from "../src/runner";
import { countedWrite, until } from "./fake-node";

const AID = "s/1.2/1";
const TOKEN = "the-token-of-the-dead-node-s-connection";

/** One of the Worker's connections: what the runner sends on it. */
class FakeOrigin implements Origin {
  readonly histories = new HistoryCache();
  readonly sent: p.WorkerMessage[] = [];
  constructor(
    readonly address: string,
    readonly resume: string | null,
  ) {}
  send(message: p.WorkerMessage): void {
    this.sent.push(message);
  }
}

const write = countedWrite();
const AGENT = defineAgent({ name: "a", model: new Scripted(() => say("x")), tools: [write.tool] });

function step(stepType: p.StepType, extra: Partial<p.StepMessage> = {}): p.StepMessage {
  const ids = { t: "step", attempt_id: AID, session_id: "s", step_id: "1.2", attempt: 1, agent: "a" } as const;
  return { ...ids, step_type: stepType, tool: "write", call_id: "c", arguments: {}, ...extra };
}

function runner(): Runner {
  return new Runner([AGENT], 4, "w", new Log("console", "error"), null);
}

/** A Worker connected to nodes a and b that holds attempt ``AID``, handed out by a under
 * ``TOKEN`` (``result``: it has its result, not yet acknowledged). */
function holding(result: boolean): { runner: Runner; a: FakeOrigin; b: FakeOrigin } {
  const held = runner();
  const a = new FakeOrigin("http://a", TOKEN);
  const b = new FakeOrigin("http://b", "b-token");
  held.attempts.set(AID, {
    step: step("CallTool"),
    origin: a,
    history: [],
    abort: new AbortController(),
    result: result ? { t: "done", attempt_id: AID, result: { status: "succeeded" } } : null,
    abandoned: false,
    startDecided: null,
    startSeq: -1,
    startSentAt: 0,
    resume: a.resume,
    stray: false,
  });
  return { runner: held, a, b };
}

test("an attempt whose connection dropped is claimed and moves to the node that says ok", () => {
  const { runner, a, b } = holding(true);
  assert.deepEqual(runner.strays(), {});

  runner.lost(a, true);
  assert.deepEqual(runner.strays(), { [AID]: TOKEN }); // with the token it was handed out under
  runner.onMessage({ t: "claimed", status: { [AID]: "ok" } }, b);

  assert.equal(runner.attempts.get(AID)?.origin, b);
  assert.deepEqual(runner.strays(), {});
  assert.deepEqual(b.sent.map((m) => m.t), ["done"]); // its result goes to its new node at once
  assert.deepEqual(runner.heldBy(b), [AID]);
  assert.deepEqual(runner.heldBy(a), []);
});

test("an attempt left out of the reply to its node's beat is a stray", () => {
  const { runner, a } = holding(false);

  const beat = runner.beat(a);
  assert.ok(beat !== null && beat.seq != null);
  assert.deepEqual(beat.attempts, [AID]);
  runner.onMessage({ t: "hb", status: {}, seq: beat.seq }, a); // a gave the session up
  assert.deepEqual(runner.strays(), { [AID]: TOKEN });
  runner.onMessage({ t: "hb", status: { [AID]: "ok" } }, a); // a (back) holds it again
  assert.deepEqual(runner.strays(), {});
  assert.equal(runner.attempts.get(AID)?.origin, a);
});

test("replies to other heartbeats that leave it out do not make a stray", () => {
  const { runner, a, b } = holding(false);
  const beat = runner.beat(a);
  assert.ok(beat !== null && beat.seq != null);

  runner.onMessage({ t: "hb", status: { "s/1.5/1": "ok" } }, a); // a tool's own beat
  runner.onMessage({ t: "hb", status: {} }, a); // one without seq, naming nothing
  runner.onMessage({ t: "hb", status: {}, seq: beat.seq + 1 }, a); // a start ask's
  runner.onMessage({ t: "hb", status: {}, seq: beat.seq }, b); // another connection's
  assert.deepEqual(runner.strays(), {});
});

test("a beat is forgotten when its connection drops: a late reply to it makes no stray", () => {
  const { runner, a } = holding(false);
  const beat = runner.beat(a);
  assert.ok(beat !== null);

  runner.lost(a, false); // a single node: the hello of the next connection re-claims
  runner.onMessage({ t: "hb", status: {}, seq: beat.seq }, a);

  assert.deepEqual(runner.strays(), {});
});

test("a single node's dropped connection makes no stray; its result is sent again", () => {
  const { runner, a } = holding(true);

  runner.lost(a, false);

  assert.deepEqual(runner.strays(), {});
  assert.deepEqual(runner.unacknowledged(a).map((m) => m.t), ["done"]);
});

test("a stray's result waits for the node that takes it: its own, back, with an hb ok", () => {
  const { runner, a, b } = holding(true);
  runner.lost(a, true);
  assert.deepEqual(runner.unacknowledged(a), []); // not sent again on a's next connection

  runner.onMessage({ t: "hb", status: { [AID]: "ok" } }, b); // not b's: changes nothing
  assert.deepEqual(runner.strays(), { [AID]: TOKEN });
  assert.equal(a.sent.length + b.sent.length, 0);
  runner.onMessage({ t: "hb", status: { [AID]: "ok" } }, a); // a, back, runs it again

  assert.deepEqual(runner.strays(), {});
  assert.deepEqual(a.sent.map((m) => m.t), ["done"]);
  assert.deepEqual(b.sent, []);
});

test("an attempt that ends while a stray sends its result only once it is taken", async () => {
  const held = runner();
  const a = new FakeOrigin("http://a", TOKEN);
  const b = new FakeOrigin("http://b", "b-token");
  held.welcome({ t: "welcome", worker_id: "w", heartbeat_timeout: 10, reconnect_grace: 1, resume: TOKEN }, a);
  let open = (): void => undefined;
  const opened = new Promise<void>((resolve) => (open = resolve));
  const gated = defineTool({
    name: "gated",
    kind: "read",
    parameters: { type: "object", properties: {} },
    async run() {
      await opened;
      return "opened";
    },
  });
  const agent = defineAgent({ name: "g", model: new Scripted(() => say("x")), tools: [gated] });
  held.agents.set(agent.name, agent);
  held.onMessage(step("CallTool", { agent: "g", tool: "gated" }), a);
  await until("the call running", () => held.attempts.has(AID));

  const beat = held.beat(a);
  assert.ok(beat !== null);
  held.onMessage({ t: "hb", status: {}, seq: beat.seq }, a); // a gave the session up
  open();
  await until("its result kept", () => held.attempts.get(AID)?.result != null);
  await new Promise((resolve) => setTimeout(resolve, 20));
  assert.deepEqual(a.sent.filter((m) => m.t === "done"), []); // sent to no node
  assert.deepEqual(b.sent, []);

  held.onMessage({ t: "claimed", status: { [AID]: "ok" } }, b); // b took its session over
  assert.deepEqual(b.sent, [{ t: "done", attempt_id: AID, result: { status: "succeeded", result: "opened" } }]);
  assert.deepEqual(a.sent.filter((m) => m.t === "done"), []);
  assert.deepEqual(held.heldBy(b), [AID]);
});

test("a stray told to stop is dropped, and answers from others do not count", () => {
  const { runner, a, b } = holding(false);
  runner.lost(a, true);

  runner.onMessage({ t: "claimed", status: { "t/1.1/1": "ok" } }, b); // not one it holds
  runner.onMessage({ t: "hb", status: { [AID]: "stop" } }, b); // not b's attempt
  assert.ok(runner.attempts.has(AID));
  runner.onMessage({ t: "claimed", status: { [AID]: "stop" } }, b);

  assert.ok(!runner.attempts.has(AID));
  assert.deepEqual(b.sent, []);
});

test("a stray told to stop after its result is forgotten, its result not sent", () => {
  const { runner, a, b } = holding(true);
  runner.lost(a, true);

  runner.onMessage({ t: "claimed", status: { [AID]: "stop" } }, b);

  assert.ok(!runner.attempts.has(AID));
  assert.deepEqual(b.sent, []);
});

test("an attempt that is not a stray ignores a claim answer", () => {
  const { runner, a, b } = holding(false);

  runner.onMessage({ t: "claimed", status: { [AID]: "stop" } }, b);

  assert.equal(runner.attempts.get(AID)?.origin, a);
});

test("a welcome of the node back stops only what it lists", () => {
  const { runner, a } = holding(false);
  runner.lost(a, true);

  const welcome = { t: "welcome", worker_id: "w", heartbeat_timeout: 10, reconnect_grace: 1, resume: "x" } as const;
  runner.welcome(welcome, a);

  assert.deepEqual(runner.strays(), { [AID]: TOKEN }); // still claimed: another node may own it
});

test("a single-attempt tool asks to start only its attempt's origin, and no node while a stray", async () => {
  const held = runner();
  const a = new FakeOrigin("http://a", TOKEN);
  const b = new FakeOrigin("http://b", "b-token");
  // a start window of 0.1 s: the ask is sent again every 0.1 s until answered
  held.welcome({ t: "welcome", worker_id: "w", heartbeat_timeout: 0.2, reconnect_grace: 1, resume: TOKEN }, a);
  const asks = (o: FakeOrigin): p.Heartbeat[] =>
    o.sent.filter((m): m is p.Heartbeat => m.t === "hb" && m.seq != null);
  held.onMessage(step("CallSingleAttemptTool", { needs_start_ack: true }), a);
  await until("the start ask on a", () => asks(a).length > 0);

  held.lost(a, true); // a died before it answered
  const asked = asks(a).length;
  await new Promise((resolve) => setTimeout(resolve, 350));
  assert.equal(asks(a).length, asked, "a stray asked its dead node again");
  assert.deepEqual(asks(b), []);
  assert.equal(write.runs, 0);

  held.onMessage({ t: "claimed", status: { [AID]: "ok" } }, b);
  await until("the start ask on b", () => asks(b).length > 0);
  held.onMessage({ t: "hb", status: { [AID]: "ok" }, seq: asks(b).at(-1)?.seq }, b);
  await until("the write's result on b", () => b.sent.some((m) => m.t === "done"));

  assert.equal(write.runs, 1);
  assert.deepEqual(b.sent.find((m) => m.t === "done"), {
    t: "done",
    attempt_id: AID,
    result: { status: "succeeded", result: "written" },
  });
});
