/**
 * The check of a tool call's arguments against the tool's JSON Schema, before its body
 * runs (an invalid call never runs, and records ``failed`` with what is wrong), as the
 * Python Worker validates them against the model of the tool's parameters.
 *
 * Ajv does the checking (JSON Schema 2020-12, what pydantic writes; ``format`` is not
 * checked). Types are JSON's: ``"3"`` is no integer.
 */
import { Ajv2020, type ErrorObject, type ValidateFunction } from "ajv/dist/2020";

import { ToolError } from "./agent";

type Schema = Record<string, unknown>;

const ajv = new Ajv2020({
  allErrors: true,
  useDefaults: true,
  strict: false,
  validateFormats: false,
  logger: false,
});
const compiled = new WeakMap<Schema, ValidateFunction>();

/**
 * The arguments the body runs with: ``args`` with the defaults of the parameters it left
 * out. Throws a ToolError naming every problem (``path: what is wrong``).
 */
export function checkArguments(
  tool: string,
  schema: Schema,
  args: unknown,
): Record<string, unknown> {
  let validate = compiled.get(schema);
  if (validate === undefined) {
    validate = ajv.compile(schema);
    compiled.set(schema, validate);
  }
  const given: unknown = structuredClone(args ?? {}); // defaults are filled in place
  if (!validate(given)) {
    const problems = (validate.errors ?? []).map(describe);
    throw new ToolError(`invalid arguments for tool '${tool}': ${problems.join("; ")}`);
  }
  return given as Record<string, unknown>;
}

/** One problem as ``path: what is wrong``, the path dotted (``when.day``, ``tags.1``). */
function describe(e: ErrorObject): string {
  const path = e.instancePath
    .split("/")
    .slice(1)
    .map((part) => part.replace(/~1/g, "/").replace(/~0/g, "~"));
  const params = e.params as Record<string, unknown>;
  if (e.keyword === "required") {
    return `${[...path, String(params.missingProperty)].join(".")}: missing`;
  }
  if (e.keyword === "additionalProperties") {
    return `${[...path, String(params.additionalProperty)].join(".")}: not a parameter`;
  }
  return `${path.length > 0 ? path.join(".") : "arguments"}: ${e.message ?? e.keyword}`;
}
