/** The Worker's log lines: the Python server's console and JSON formats, and one line per
 * change of its connection rather than one per try (as the Python and Go Workers). */
import { test } from "node:test";
import assert from "node:assert/strict";

import { ConnectionLog, Log, fieldText } from "../src/log";

const CONSOLE = /^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (\w+) dex\.worker (.*)$/;

function capture(format: "console" | "json", level: "debug" | "info" = "info") {
  const lines: string[] = [];
  return { lines, log: new Log(format, level, (line) => void lines.push(line)) };
}

test("a console line is the time, the level, the logger, the message, then the fields", () => {
  const { lines, log } = capture("console");
  log.warning("worker.connection_lost", "lost it", { address: "http://a", error: "cut off" });
  log.debug("worker.connect_failed", "below the level: not written");
  assert.equal(lines.length, 1);
  const [, level, rest] = CONSOLE.exec(lines[0].trimEnd()) ?? [];
  assert.equal(level, "WARNING");
  assert.equal(rest, 'lost it action=worker.connection_lost address=http://a error="cut off"');
  assert.equal(fieldText(["concierge", "triage"]), "concierge,triage");
  assert.equal(fieldText(30), "30");
  assert.equal(fieldText("a=b"), '"a=b"');
});

test("a JSON line is one object: time, level, logger, message, action, then the fields", () => {
  const { lines, log } = capture("json");
  log.info("worker.connected", "connected to http://a", { agents: ["x"], capacity: 16 });
  const entry = JSON.parse(lines[0]);
  assert.deepEqual(Object.keys(entry), ["time", "level", "logger", "message", "action", "agents", "capacity"]);
  assert.match(entry.time, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
  assert.deepEqual(
    { ...entry, time: undefined },
    { time: undefined, level: "info", logger: "dex.worker", message: "connected to http://a",
      action: "worker.connected", agents: ["x"], capacity: 16 },
  );
});

test("an outage is one lost line and one reconnected line, however many tries", () => {
  const { lines, log } = capture("json");
  let now = 100;
  const connection = new ConnectionLog(log, "w-1", ["concierge"], 16, () => now);
  connection.failed("http://a", "refused"); // started before its server: said once
  connection.failed("http://a", "refused");
  connection.connected("http://a");
  connection.lost("http://a", "the connection closed (1006)");
  for (let i = 0; i < 5; i++) {
    now += 0.5;
    connection.failed("http://a", "refused");
  }
  connection.connected("http://b");
  connection.stopped("SIGTERM");
  const seen = lines.map((l) => JSON.parse(l)).map((e) => [e.level, e.action, e.message]);
  assert.deepEqual(seen, [
    ["warning", "worker.connect_failed", "cannot reach http://a: refused; trying again until it answers"],
    ["info", "worker.connected", "connected to http://a"],
    ["warning", "worker.connection_lost", "lost the connection to http://a: the connection closed (1006); reconnecting"],
    ["info", "worker.reconnected", "reconnected to http://b after 2.5s and 6 tries"],
    ["info", "worker.stopped", "stopped: SIGTERM, drained"],
  ]);
  const back = JSON.parse(lines[3]);
  assert.deepEqual([back.address, back.tries, back.seconds], ["http://b", 6, 2.5]);
});
