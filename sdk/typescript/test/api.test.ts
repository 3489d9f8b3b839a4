/** src/api.ts is what openapi-typescript (the pinned devDependency) writes from
 * ../openapi.json, the document the server's own test keeps current: regenerate it with
 * ``npm run gen:api`` when this fails. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import * as path from "node:path";

const SDK = path.resolve(__dirname, "..", "..");

test("src/api.ts is the types openapi-typescript generates from sdk/openapi.json", () => {
  const cli = path.join(SDK, "node_modules", "openapi-typescript", "bin", "cli.js");
  const done = spawnSync(process.execPath, [cli, "../openapi.json", "-o", "src/api.ts", "--check"], {
    cwd: SDK,
    encoding: "utf8",
    env: { ...process.env, NO_COLOR: "1" },
  });
  assert.equal(done.status, 0, `src/api.ts is stale: run npm run gen:api\n${done.stdout}${done.stderr}`);
});
