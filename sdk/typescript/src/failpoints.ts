/**
 * Named points in the Worker where a test can stop or crash it, armed only through the
 * environment, as in the Python Worker:
 *
 *   DEX_FAILPOINTS="worker.before_first_heartbeat=pause"   DEX_FAILPOINT_DIR=/tmp/fp
 *
 * Every hit first writes NAME.hit. `crash` SIGKILLs the process; `pause` blocks the whole
 * process (no heartbeat leaves it) until NAME.release exists. `NAME=crash@3` acts on the
 * third hit only. A spec it cannot read (an unknown action, a hit number that is not a
 * positive integer, a part without "=") is refused by name when the module loads, so the
 * Worker does not start, as the Python and Go Workers refuse it: a typo fails loudly
 * instead of doing nothing. Unarmed, `hit` is one size check.
 */
import * as fs from "node:fs";
import * as path from "node:path";

/** The actions a TypeScript Worker's failpoint takes. */
export const ACTIONS: readonly string[] = ["crash", "pause"];

export interface Point {
  action: string;
  nth: number;
}

/** The points a spec (DEX_FAILPOINTS' syntax) arms; throws, naming the part, on one it
 * cannot read. */
export function parse(spec: string): Map<string, Point> {
  const out = new Map<string, Point>();
  for (const raw of spec.split(",")) {
    const part = raw.trim();
    if (!part) continue;
    const bad = (why: string): Error =>
      new Error(`DEX_FAILPOINTS: ${JSON.stringify(part)}: ${why}`);
    const equals = part.indexOf("=");
    if (equals <= 0) throw bad("not NAME=ACTION");
    const [action, nth] = split(part.slice(equals + 1), "@");
    if (!ACTIONS.includes(action)) {
      const choices = `${ACTIONS.slice(0, -1).join(", ")} or ${ACTIONS[ACTIONS.length - 1]}`;
      throw bad(`unknown action ${JSON.stringify(action)} (${choices})`);
    }
    const n = nth === undefined ? 1 : /^[0-9]+$/.test(nth) ? Number(nth) : 0;
    if (n < 1) throw bad(`the hit number ${JSON.stringify(nth)} is not a positive integer`);
    out.set(part.slice(0, equals), { action, nth: n });
  }
  return out;
}

/** `text` cut at the first `separator`: before it, and after it (undefined without one). */
function split(text: string, separator: string): [string, string | undefined] {
  const at = text.indexOf(separator);
  return at < 0 ? [text, undefined] : [text.slice(0, at), text.slice(at + 1)];
}

const armed = parse(process.env.DEX_FAILPOINTS ?? "");
const counts = new Map<string, number>();
const dir = process.env.DEX_FAILPOINT_DIR ?? ".";

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
