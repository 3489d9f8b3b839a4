/** The argument check a tool call passes before its body runs (src/schema.ts, Ajv). */
import { test } from "node:test";
import assert from "node:assert/strict";

import { ToolError } from "../src/agent";
import { checkArguments } from "../src/schema";

const BOOKING = {
  type: "object",
  properties: {
    city: { type: "string", minLength: 2, maxLength: 20, pattern: "^[A-Z]" },
    guests: { type: "integer", minimum: 1, maximum: 12 },
    price: { type: "number", exclusiveMinimum: 0, multipleOf: 0.5 },
    kind: { enum: ["table", "room"] },
    note: { anyOf: [{ type: "string" }, { type: "null" }], default: null },
    tags: { type: "array", items: { type: "string" }, maxItems: 2, uniqueItems: true },
    when: { $ref: "#/$defs/When" },
    vip: { type: "boolean", default: false },
  },
  required: ["city", "guests"],
  additionalProperties: false,
  $defs: {
    When: {
      type: "object",
      properties: { day: { type: "string" }, hour: { type: "integer" } },
      required: ["day"],
      additionalProperties: false,
    },
  },
};

function problems(args: unknown): string {
  try {
    checkArguments("book", BOOKING, args);
  } catch (e) {
    assert.ok(e instanceof ToolError, `a ToolError, not ${String(e)}`);
    return e.message;
  }
  return "";
}

test("valid arguments pass, with the defaults of the parameters left out", () => {
  const args = checkArguments("book", BOOKING, {
    city: "Paris",
    guests: 2,
    price: 12.5,
    kind: "table",
    tags: ["a", "b"],
    when: { day: "mon", hour: 20 },
  });
  assert.equal(args.note, null);
  assert.equal(args.vip, false);
  assert.equal(args.city, "Paris");
});

test("a missing required parameter and an unknown one are both named", () => {
  const message = problems({ city: "Paris", extra: 1 });
  assert.match(message, /^invalid arguments for tool 'book': /);
  assert.match(message, /guests: missing/);
  assert.match(message, /extra: not a parameter/);
});

test("types are JSON's: a string is no integer, an integer is a number", () => {
  assert.match(problems({ city: "Paris", guests: "3" }), /guests: must be integer/);
  assert.match(problems({ city: "Paris", guests: 2.5 }), /guests: must be integer/);
  assert.equal(problems({ city: "Paris", guests: 2, price: 3 }), "");
  assert.match(problems([]), /arguments: must be object/);
});

test("bounds, lengths, patterns, enums and multiples are checked", () => {
  assert.match(problems({ city: "Paris", guests: 0 }), /guests: must be >= 1/);
  assert.match(problems({ city: "Paris", guests: 13 }), /guests: must be <= 12/);
  assert.match(problems({ city: "P", guests: 1 }), /city: must NOT have fewer than 2 characters/);
  assert.match(problems({ city: "paris", guests: 1 }), /city: must match pattern "\^\[A-Z\]"/);
  assert.match(problems({ city: "Paris", guests: 1, price: 0 }), /price: must be > 0/);
  assert.match(problems({ city: "Paris", guests: 1, price: 1.2 }), /price: must be multiple of 0.5/);
  const car = problems({ city: "Paris", guests: 1, kind: "car" });
  assert.match(car, /kind: must be equal to one of the allowed values/);
});

test("nested arrays, objects, references and alternatives are checked by path", () => {
  const with_ = (extra: Record<string, unknown>): string =>
    problems({ city: "Paris", guests: 1, ...extra });
  assert.match(with_({ tags: ["a", 2] }), /tags\.1: must be string/);
  assert.match(with_({ tags: ["a", "a"] }), /tags: must NOT have duplicate items/);
  assert.match(with_({ tags: ["a", "b", "c"] }), /tags: must NOT have more than 2 items/);
  assert.match(with_({ when: { hour: 1 } }), /when\.day: missing/);
  assert.match(with_({ note: 5 }), /note: must match a schema in anyOf/);
  assert.equal(with_({ note: null }), "");
});

test("a schema without additionalProperties: false lets other arguments through", () => {
  const open = { type: "object", properties: { a: { type: "string" } } };
  assert.deepEqual(checkArguments("t", open, { a: "x", b: 1 }), { a: "x", b: 1 });
  assert.deepEqual(checkArguments("t", open, undefined), {});
});

test("the caller's arguments are not changed by the defaults filled in", () => {
  const given = { city: "Paris", guests: 2 };
  const args = checkArguments("book", BOOKING, given);
  assert.equal(args.vip, false);
  assert.deepEqual(given, { city: "Paris", guests: 2 });
});
