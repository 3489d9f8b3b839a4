/**
 * The check of a tool call's arguments against the tool's JSON Schema, before its body
 * runs (an invalid call never runs, and records ``failed`` with what is wrong), as the
 * Python Worker validates them against the model of the tool's parameters.
 *
 * The keywords a parameters schema uses: ``type``, ``enum``, ``const``, ``properties``,
 * ``required``, ``additionalProperties``, ``items``, ``prefixItems``, ``minItems``,
 * ``maxItems``, ``uniqueItems``, ``minLength``, ``maxLength``, ``pattern``,
 * ``minimum``, ``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum``, ``multipleOf``,
 * ``anyOf``, ``oneOf``, ``allOf``, ``not`` and local ``$ref`` (``#/$defs/...``). Others
 * (``format``, ``description``...) are not checked. Types are JSON's: ``"3"`` is no
 * integer.
 */
import { ToolError } from "./agent";

type Schema = Record<string, unknown>;

/**
 * The arguments the body runs with: ``args`` with the defaults of the parameters it left
 * out. Throws a ToolError naming every problem (``path: what is wrong``).
 */
export function checkArguments(
  tool: string,
  schema: Schema,
  args: unknown,
): Record<string, unknown> {
  const given = args ?? {};
  const problems: string[] = [];
  check(schema, given, "", schema, problems);
  if (problems.length > 0) {
    throw new ToolError(`invalid arguments for tool '${tool}': ${problems.join("; ")}`);
  }
  const withDefaults = { ...(given as Record<string, unknown>) };
  const properties = (schema.properties ?? {}) as Record<string, Schema>;
  for (const [name, property] of Object.entries(properties)) {
    const hasDefault = property !== null && typeof property === "object" && "default" in property;
    if (!(name in withDefaults) && hasDefault) {
      withDefaults[name] = structuredClone(property.default);
    }
  }
  return withDefaults;
}

function typeOf(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  if (typeof value === "number") return Number.isInteger(value) ? "integer" : "number";
  return typeof value; // string, boolean, object
}

function fits(type: string, value: unknown): boolean {
  const actual = typeOf(value);
  return actual === type || (type === "number" && actual === "integer");
}

function at(path: string): string {
  return path === "" ? "arguments" : path;
}

function join(path: string, key: string | number): string {
  return path === "" ? String(key) : `${path}.${key}`;
}

function equal(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== "object" || typeof b !== "object" || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  const ka = Object.keys(a);
  const kb = Object.keys(b);
  return (
    ka.length === kb.length &&
    ka.every((k) => equal((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k]))
  );
}

function resolve(root: Schema, ref: string): Schema {
  const match = /^#\/(\$defs|definitions)\/(.+)$/.exec(ref);
  const defs = match === null ? undefined : (root[match[1]] as Record<string, Schema> | undefined);
  const target = match === null ? undefined : defs?.[decodeURIComponent(match[2])];
  if (target === undefined) throw new Error(`the parameters schema has no ${ref}`);
  return target;
}

function check(
  schema: unknown,
  value: unknown,
  path: string,
  root: Schema,
  problems: string[],
): void {
  if (schema === true || schema === undefined) return;
  if (schema === false) {
    problems.push(`${at(path)}: not allowed`);
    return;
  }
  const s = schema as Schema;
  if (typeof s.$ref === "string") check(resolve(root, s.$ref), value, path, root, problems);

  if (s.type !== undefined) {
    const types = Array.isArray(s.type) ? (s.type as string[]) : [s.type as string];
    if (!types.some((t) => fits(t, value))) {
      problems.push(`${at(path)}: want ${types.join(" or ")}, got ${typeOf(value)}`);
      return; // the other keywords would only repeat it
    }
  }
  if (Array.isArray(s.enum) && !s.enum.some((e) => equal(e, value))) {
    problems.push(`${at(path)}: want one of ${s.enum.map((e) => JSON.stringify(e)).join(", ")}`);
  }
  if ("const" in s && !equal(s.const, value)) {
    problems.push(`${at(path)}: want ${JSON.stringify(s.const)}`);
  }

  const combined = [
    ["allOf", s.allOf],
    ["anyOf", s.anyOf],
    ["oneOf", s.oneOf],
  ] as const;
  for (const [keyword, sub] of combined) {
    if (!Array.isArray(sub)) continue;
    const results = sub.map((option) => {
      const found: string[] = [];
      check(option, value, path, root, found);
      return found;
    });
    const passed = results.filter((r) => r.length === 0).length;
    if (keyword === "allOf") results.forEach((r) => problems.push(...r));
    else if (keyword === "anyOf" && passed === 0) {
      const why = results.map((r) => r.join(", ")).join(" | ");
      problems.push(`${at(path)}: fits none of the allowed shapes (${why})`);
    } else if (keyword === "oneOf" && passed !== 1) {
      problems.push(`${at(path)}: must fit exactly one allowed shape, fits ${passed}`);
    }
  }
  if (s.not !== undefined) {
    const found: string[] = [];
    check(s.not, value, path, root, found);
    if (found.length === 0) problems.push(`${at(path)}: a value the schema excludes`);
  }

  if (typeof value === "string") {
    const length = [...value].length;
    if (typeof s.minLength === "number" && length < s.minLength) {
      problems.push(`${at(path)}: at least ${s.minLength} characters, got ${length}`);
    }
    if (typeof s.maxLength === "number" && length > s.maxLength) {
      problems.push(`${at(path)}: at most ${s.maxLength} characters, got ${length}`);
    }
    if (typeof s.pattern === "string" && !new RegExp(s.pattern, "u").test(value)) {
      problems.push(`${at(path)}: does not match ${s.pattern}`);
    }
  } else if (typeof value === "number") {
    if (typeof s.minimum === "number" && value < s.minimum) {
      problems.push(`${at(path)}: at least ${s.minimum}, got ${value}`);
    }
    if (typeof s.maximum === "number" && value > s.maximum) {
      problems.push(`${at(path)}: at most ${s.maximum}, got ${value}`);
    }
    if (typeof s.exclusiveMinimum === "number" && value <= s.exclusiveMinimum) {
      problems.push(`${at(path)}: more than ${s.exclusiveMinimum}, got ${value}`);
    }
    if (typeof s.exclusiveMaximum === "number" && value >= s.exclusiveMaximum) {
      problems.push(`${at(path)}: less than ${s.exclusiveMaximum}, got ${value}`);
    }
    if (typeof s.multipleOf === "number" && s.multipleOf > 0) {
      const ratio = value / s.multipleOf;
      if (Math.abs(ratio - Math.round(ratio)) > 1e-9) {
        problems.push(`${at(path)}: a multiple of ${s.multipleOf}, got ${value}`);
      }
    }
  } else if (Array.isArray(value)) {
    if (typeof s.minItems === "number" && value.length < s.minItems) {
      problems.push(`${at(path)}: at least ${s.minItems} items, got ${value.length}`);
    }
    if (typeof s.maxItems === "number" && value.length > s.maxItems) {
      problems.push(`${at(path)}: at most ${s.maxItems} items, got ${value.length}`);
    }
    if (s.uniqueItems === true && value.some((v, i) => value.findIndex((w) => equal(v, w)) !== i)) {
      problems.push(`${at(path)}: items must be unique`);
    }
    const prefix = Array.isArray(s.prefixItems) ? s.prefixItems : [];
    value.forEach((item, i) => {
      const itemSchema = i < prefix.length ? prefix[i] : s.items;
      check(itemSchema, item, join(path, i), root, problems);
    });
  } else if (typeof value === "object" && value !== null) {
    const object = value as Record<string, unknown>;
    const properties = (s.properties ?? {}) as Record<string, unknown>;
    if (Array.isArray(s.required)) {
      for (const name of s.required as string[]) {
        if (!(name in object)) problems.push(`${join(path, name)}: missing`);
      }
    }
    for (const [name, item] of Object.entries(object)) {
      if (name in properties) check(properties[name], item, join(path, name), root, problems);
      else if (s.additionalProperties === false) {
        problems.push(`${join(path, name)}: not a parameter`);
      } else check(s.additionalProperties, item, join(path, name), root, problems);
    }
  }
}
