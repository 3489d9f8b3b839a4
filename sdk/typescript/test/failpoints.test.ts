/** Failpoints: a spec the Worker cannot read is refused by name, as the Python and Go
 * Workers refuse it, and the Worker does not start with it. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import * as path from "node:path";

import { parse } from "../src/failpoints";

test("a spec it cannot read is refused, naming the part", () => {
  const bad: [string, string][] = [
    [
      "worker.tool_running=pasue",
      'DEX_FAILPOINTS: "worker.tool_running=pasue": unknown action "pasue" (crash or pause)',
    ],
    ["a=crash,worker.tool_running=Pause", '"worker.tool_running=Pause": unknown action "Pause"'],
    ["worker.tool_running=stop", 'unknown action "stop"'],
    ["worker.tool_running", '"worker.tool_running": not NAME=ACTION'],
    ["=crash", '"=crash": not NAME=ACTION'],
    ["worker.tool_running=pause@0", 'the hit number "0" is not a positive integer'],
    ["worker.tool_running=pause@two", 'the hit number "two" is not a positive integer'],
    ["worker.tool_running=pause@arm", 'the hit number "arm" is not a positive integer'],
  ];
  for (const [spec, message] of bad) {
    assert.throws(() => parse(spec), (e: Error) => e.message.includes(message), spec);
  }
});

test("a well-formed spec arms its points", () => {
  assert.deepEqual(
    parse(" a=crash, b=pause@3 ,"),
    new Map([
      ["a", { action: "crash", nth: 1 }],
      ["b", { action: "pause", nth: 3 }],
    ]),
  );
  assert.equal(parse("").size, 0);
});

test("the Worker does not load with a spec it cannot read", () => {
  const sdk = path.join(__dirname, "..", "src", "index.js");
  const child = spawnSync(process.execPath, ["-e", `require(${JSON.stringify(sdk)})`], {
    env: { ...process.env, DEX_FAILPOINTS: "worker.tool_running=pasue" },
    encoding: "utf8",
    timeout: 30_000,
  });
  assert.notEqual(child.status, 0);
  assert.match(child.stderr, /DEX_FAILPOINTS: "worker.tool_running=pasue": unknown action "pasue"/);
});
