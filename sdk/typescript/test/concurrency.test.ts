/** A tool's concurrency key reaches the server in its spec (src/agent.ts defineTool). */
import { test } from "node:test";
import assert from "node:assert/strict";

import { defineTool } from "../src";

const base = { kind: "write" as const, parameters: { type: "object" }, run: () => "ok" };

test("a concurrency key goes with its limit, 1 by default; a tool without one sends neither", () => {
  const book = defineTool({ ...base, name: "book", concurrencyKey: "{customer}" }).spec();
  assert.equal(book.concurrency_key, "{customer}");
  assert.equal(book.concurrency_limit, 1);
  const deploy = defineTool({ ...base, name: "deploy", concurrencyKey: "", concurrencyLimit: 3 });
  assert.equal(deploy.spec().concurrency_key, "");
  assert.equal(deploy.spec().concurrency_limit, 3);
  const plain = defineTool({ ...base, name: "plain" }).spec();
  assert.equal("concurrency_key" in plain, false);
  assert.equal("concurrency_limit" in plain, false);
});
