/** The package's two entries, `import` (src/index.mts) and `require` (src/index.ts): the
 * same names, bound to the same objects, so a program may use both. */
import { test } from "node:test";
import assert from "node:assert/strict";

import * as required from "../src";

test("the ES module entry exports the CommonJS entry's names, the very same objects", async () => {
  const imported: Record<string, unknown> = await import("../src/index.mjs");
  const names = (m: object): string[] => Object.keys(m).filter((n) => n !== "__esModule" && n !== "default").sort();
  assert.deepEqual(names(imported), names(required));
  for (const name of names(required)) {
    assert.equal(imported[name], (required as Record<string, unknown>)[name], name);
  }
});
