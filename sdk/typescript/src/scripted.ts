/**
 * A stand-in model whose response is a function of the history alone, as Python's
 * dex.models.Scripted: for a first program, a demo or a test, with no provider and no
 * key. A model call that runs again after a crash gets the same response.
 */
import type { Model, ModelRequest, ModelResponse, Summary } from "./agent";
import type { Item, ModelToolCall } from "./protocol";

/** The model's response to a history: a ModelResponse, or its text alone. */
export type Script = (
  history: Item[],
) => ModelResponse | string | Promise<ModelResponse | string>;

/** A final answer: the model's text, and no tool call. */
export function say(text: string): ModelResponse {
  return { text };
}

/** One tool call, for a ModelResponse's ``toolCalls`` (give each of several calls in
 * one response its own ``id``). */
export function call(name: string, args: Record<string, unknown> = {}, id = "call_1"): ModelToolCall {
  return { id, name, arguments: args };
}

export class Scripted implements Model {
  /** ``new Scripted(script)``: ``script(history)`` returns the model's response. */
  constructor(private readonly script: Script) {
    if (typeof script !== "function") {
      throw new TypeError(`Scripted needs a function of the history, not ${typeof script}`);
    }
  }

  spec(): Record<string, unknown> {
    return { provider: "scripted", name: "scripted" };
  }

  /** The script's response, its text sent first as one delta. */
  async *stream(request: ModelRequest): AsyncIterable<string | ModelResponse> {
    const answer = await this.script(request.history);
    const response = typeof answer === "string" ? say(answer) : answer;
    if (response.text) yield response.text;
    yield response;
  }

  /** A deterministic summary, Python's Scripted's: how many items there were, the
   * summary before them, and what the user said. */
  async summarize(request: ModelRequest): Promise<Summary> {
    const asked: string[] = [];
    const earlier: string[] = [];
    for (const item of request.history) {
      if (item.type === "user") asked.push(item.text);
      if (item.type === "summary") earlier.push(item.text);
    }
    const parts = [`Summary of ${request.history.length} items.`];
    if (earlier.length > 0) parts.push(`Before that: ${earlier[earlier.length - 1]}`);
    if (asked.length > 0) parts.push(`The user said: ${asked.join(" | ")}`);
    return { text: parts.join(" ") };
  }
}
