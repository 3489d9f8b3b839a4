/** The Worker's history cache builds each hand-out's view from what it kept and what the
 * hand-out adds, checking only the new items, and says when it lacks the base. */
import { test } from "node:test";
import assert from "node:assert/strict";

import { HistoryCache, HistoryError } from "../src/history";

const TURN_1 = [
  { type: "user", text: "hi" },
  { type: "assistant", text: "", tool_calls: [{ id: "c0", name: "t", arguments: {} }] },
  { type: "tool_result", call_id: "c0", name: "t", status: "succeeded", result: 1 },
];

test("a view built on a base is the kept items then the new ones", () => {
  const cache = new HistoryCache();
  assert.deepEqual(cache.view("s1", 0, TURN_1.slice(0, 1)), TURN_1.slice(0, 1));
  const longer = cache.view("s1", 1, TURN_1.slice(1));
  assert.deepEqual(longer, TURN_1);
  // a later hand-out of the session does not change a view a model call still reads
  cache.view("s1", 2, [{ type: "user", text: "other" }]);
  assert.deepEqual(longer, TURN_1);
});

test("a base of zero replaces the view", () => {
  const cache = new HistoryCache();
  cache.view("s1", 0, TURN_1);
  const compacted = [{ type: "summary", text: "earlier" }, ...TURN_1.slice(1)];
  assert.deepEqual(cache.view("s1", 0, compacted), compacted);
  assert.equal(cache.view("s1", 3, [{ type: "user", text: "more" }])?.[0].type, "summary");
});

test("a missing base is reported, not guessed", () => {
  const cache = new HistoryCache(2);
  assert.equal(cache.view("s1", 2, TURN_1.slice(2)), null); // never seen
  cache.view("s1", 0, TURN_1.slice(0, 1));
  assert.equal(cache.view("s1", 2, TURN_1.slice(2)), null); // holds 1 item, not 2
  cache.view("s1", 0, TURN_1.slice(0, 1));
  for (const sid of ["a", "b"]) cache.view(sid, 0, TURN_1.slice(0, 1));
  assert.equal(cache.view("s1", 1, TURN_1.slice(1)), null); // dropped: least recently used
  assert.deepEqual(cache.view("b", 1, TURN_1.slice(1)), TURN_1);
  cache.clear(); // a new connection
  assert.equal(cache.view("b", 1, TURN_1.slice(1)), null);
});

test("an item that does not fit the protocol is refused, and the session not built on", () => {
  const cache = new HistoryCache();
  cache.view("s1", 0, TURN_1.slice(0, 1));
  assert.throws(() => cache.view("s1", 1, [{ type: "robot" }]), HistoryError);
  assert.throws(
    () => cache.view("s1", 1, [{ type: "tool_result", name: "t", status: "failed" }]),
    /history item 1 \(tool_result\) has no call_id/,
  );
  assert.equal(cache.view("s1", 1, TURN_1.slice(1)), null);
});
