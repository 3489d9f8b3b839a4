/** A Worker in a cluster, against two fake nodes: seeded with one, it connects to every
 * member the welcome lists, runs at most its capacity over both (a Step beyond it goes
 * back at once), keeps each attempt's messages on the connection that handed it out, and
 * lets a node go that no connected node lists any more once its connection is down; the
 * attempts that node handed out are strays, claimed on the other connections until a node
 * answers for them. */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";

import { defineAgent, say, Scripted, Worker } from "../src";
import type * as p from "../src/protocol";
import { countedWrite, FakeNode, heldTool, logged, until } from "./fake-node";

const gate = heldTool("wait", "waited");

const write = countedWrite();

const a = new FakeNode();
const b = new FakeNode();
let worker: Worker;
let running: Promise<void>;

before(async () => {
  await Promise.all([a.listening(), b.listening()]);
  a.members = b.members = [a.address, b.address];
  b.resume = "rb";
  worker = new Worker({
    address: a.address,
    agents: [defineAgent({ name: "c", model: new Scripted(() => say("hi")), tools: [gate.tool, write.tool] })],
    handleSignals: false,
    capacity: 1,
    reconnectInitial: 0.01,
    reconnectMax: 0.05,
    logLevel: "debug", // every try
  });
  running = worker.run();
});

after(async () => {
  await worker.shutdown(5);
  await running;
  a.server.close();
});

function call(id: string): p.StepMessage {
  const step = { t: "step", attempt_id: id, session_id: id, step_id: id, attempt: 1, agent: "c" };
  return { ...step, step_type: "CallTool", tool: "wait", call_id: id, arguments: {} } as p.StepMessage;
}

test("seeded with one node, the Worker connects to every member; one capacity over both", async () => {
  await b.frameWith((m) => m.t === "hello"); // B was learnt from A's welcome
  await until("both connected", () => a.connected && b.connected);
  a.send([call("a1")]);
  await until("A's call running", () => gate.running === 1);
  b.send([call("b1")]);
  assert.deepEqual(await b.result("b1"), { t: "back", attempt_id: "b1" }); // at once, on B
  const beat = await a.frameWith((m) => m.t === "hb");
  const hb = beat.find((m) => m.t === "hb") as p.Heartbeat;
  assert.deepEqual(hb.attempts, ["a1"]);
  assert.equal(typeof hb.seq, "number"); // the periodic beat has a seq of its own
  gate.release();
  assert.deepEqual(await a.result("a1"), {
    t: "done",
    attempt_id: "a1",
    result: { status: "succeeded", result: "waited" },
  });
  for (const frame of b.frames) {
    for (const m of frame) assert.ok(!("attempt_id" in m && m.attempt_id === "a1"), "A's attempt on B");
    for (const m of frame) if (m.t === "hb") assert.ok(!m.attempts.includes("a1"), "A's attempt beat on B");
  }
  const connected = logged.filter((l) => l.includes("action=worker.connected"));
  assert.ok(connected.some((l) => l.includes(`address=${a.address}`)));
  assert.ok(connected.some((l) => l.includes(`address=${b.address}`)));
});

test("a node let go once its connection is down; its attempts are claimed on the others", async () => {
  // B hands out a single-attempt write, which waits for its start acknowledgement
  const single = { ...call("b2"), step_type: "CallSingleAttemptTool", tool: "write", needs_start_ack: true };
  const frames = b.frames.length;
  b.send([single]);
  const asks = (m: p.WorkerMessage): boolean => m.t === "hb" && m.seq != null && m.attempts.includes("b2");
  await b.frameWith(asks, frames);
  // B goes down, and the Worker tries it again; its write is a stray, claimed on A with the
  // token of B's welcome, and asks no node whether to start
  const gone = b.address;
  b.stop();
  const failed = (l: string): boolean => l.includes("action=worker.connect_failed") && l.includes(gone);
  await until("B tried again", () => logged.some(failed));
  const claims = (m: p.WorkerMessage): boolean => m.t === "claim";
  const claim = await a.frameWith(claims);
  assert.deepEqual(claim.find(claims), { t: "claim", attempts: { b2: "rb" } });
  // then A says B left: no more tries, and the write is still claimed (A may own its session)
  a.send([{ t: "members", members: [a.address] }]);
  await until("B let go", () => logged.some((l) => l.includes("action=worker.node_left") && l.includes(gone)));
  await a.frameWith(claims, a.frames.length);
  assert.ok(a.frames.every((f) => !f.some(asks)), "the stray asked A whether to start");
  // the node that took B's sessions failed the write: it never starts here
  a.send([{ t: "claimed", status: { b2: "stop" } }]);
  const abandoned = (l: string): boolean =>
    l.includes("the server no longer runs this attempt") &&
    l.includes("action=worker.attempt_abandoned") &&
    l.includes("attempt_id=b2");
  await until("B's write abandoned", () => logged.some(abandoned));
  const tries = (): number =>
    logged.filter((l) => l.includes("action=worker.connect_failed") && l.includes(gone)).length;
  const before = tries();
  // meanwhile A keeps serving: a Step on it runs (a Worker still trying B would log each try)
  let settled = 0;
  for (const id of ["a2", "a3", "a4"]) {
    a.send([call(id)]);
    assert.equal(((await a.result(id)) as p.Done).t, "done");
    settled ||= a.frames.length; // a claim sent before the answer came is in by now
  }
  await new Promise((resolve) => setTimeout(resolve, 1100)); // a heartbeat's time
  assert.equal(tries(), before);
  assert.equal(write.runs, 0, "the abandoned write ran");
  assert.ok(a.frames.slice(settled).every((f) => !f.some(claims)), "a claim after the answer");
});
