/**
 * Named points in the Worker where a test can stop or crash it, armed only through the
 * environment, as in the Python Worker:
 *
 *   DEX_FAILPOINTS="worker.before_first_heartbeat=pause"   DEX_FAILPOINT_DIR=/tmp/fp
 *
 * Every hit first writes NAME.hit. `crash` SIGKILLs the process; `pause` blocks the whole
 * process (no heartbeat leaves it) until NAME.release exists. `NAME=crash@3` acts on the
 * third hit only. Unarmed, `hit` is one map lookup.
 */
import * as fs from "node:fs";
import * as path from "node:path";

const armed = new Map<string, { action: string; nth: number }>();
const counts = new Map<string, number>();
const dir = process.env.DEX_FAILPOINT_DIR ?? ".";

for (const part of (process.env.DEX_FAILPOINTS ?? "").split(",")) {
  if (!part.trim()) continue;
  const [name, spec = ""] = part.trim().split("=", 2);
  const [action, nth] = spec.split("@", 2);
  if (!["crash", "pause"].includes(action)) {
    throw new Error(`failpoint ${name}: unknown action ${JSON.stringify(action)} (crash or pause)`);
  }
  armed.set(name, { action, nth: Number(nth ?? "1") });
}

const blocker = new Int32Array(new SharedArrayBuffer(4));

export function hit(name: string): void {
  if (armed.size === 0) return;
  const point = armed.get(name);
  if (point === undefined) return;
  const count = (counts.get(name) ?? 0) + 1;
  counts.set(name, count);
  if (count !== point.nth) return;
  fs.writeFileSync(path.join(dir, `${name}.hit`), String(process.pid));
  if (point.action === "crash") process.kill(process.pid, "SIGKILL");
  const release = path.join(dir, `${name}.release`);
  while (!fs.existsSync(release)) Atomics.wait(blocker, 0, 0, 5); // blocks the event loop
}
