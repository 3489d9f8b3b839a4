/**
 * Validated history, kept between a session's hand-outs (docs/worker-protocol.md, rule 10).
 *
 * A RunModel hand-out carries only the items of the model's view that this connection
 * was not sent before (``history_base`` says how many it builds on), so a turn costs the
 * same in a long conversation as in a short one. The Worker keeps each session's view as
 * it was last handed out, least recently used sessions dropped first; the server keeps
 * the same bound (the Worker's ``hello`` tells it), so it knows what the Worker has.
 */
import type { Item } from "./protocol";

const TYPES = new Set(["user", "assistant", "tool_result", "note", "summary"]);

/** A history item that does not fit the protocol's Item union. */
export class HistoryError extends Error {
  override name = "HistoryError";
}

/** Each item has a known type and what that type requires (``first``: index of items[0]). */
export function checkItems(items: unknown, first = 0): Item[] {
  if (!Array.isArray(items)) throw new HistoryError("the history is not a list of items");
  items.forEach((item: unknown, i) => {
    const where = `history item ${first + i}`;
    if (item === null || typeof item !== "object") {
      throw new HistoryError(`${where} is not an object`);
    }
    const { type } = item as { type?: unknown };
    if (typeof type !== "string" || !TYPES.has(type)) {
      const want = "want user, assistant, tool_result, note or summary";
      throw new HistoryError(`${where} has type ${JSON.stringify(type)}: ${want}`);
    }
    const required =
      type === "tool_result" ? ["call_id", "name", "status"] : type === "assistant" ? [] : ["text"];
    for (const field of required) {
      if (typeof (item as Record<string, unknown>)[field] !== "string") {
        throw new HistoryError(`${where} (${type}) has no ${field}`);
      }
    }
  });
  return items as Item[];
}

export class HistoryCache {
  private readonly views = new Map<string, Item[]>();

  constructor(readonly sessions: number = 1024) {}

  /**
   * The model's view for this hand-out: the first ``base`` items of the view last handed
   * out, then ``items`` (checked here: only the new items are). Null if this Worker does
   * not hold those ``base`` items (it dropped the session, or reconnected). Throws a
   * HistoryError for an item that does not fit.
   */
  view(sessionId: string, base: number, items: unknown): Item[] | null {
    let checked: Item[];
    try {
      checked = checkItems(items, base);
    } catch (e) {
      this.views.delete(sessionId);
      throw e;
    }
    let view = checked;
    if (base > 0) {
      const kept = this.views.get(sessionId);
      if (kept === undefined || kept.length < base) return null;
      view = kept.slice(0, base).concat(checked); // a new array: a running call keeps its own
    }
    this.views.delete(sessionId); // re-inserted last: the most recently used
    this.views.set(sessionId, view);
    while (this.views.size > this.sessions) {
      this.views.delete(this.views.keys().next().value as string);
    }
    return view;
  }

  /** A new connection starts with no views: the server sends each whole first. */
  clear(): void {
    this.views.clear();
  }
}
