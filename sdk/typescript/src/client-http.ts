/** The Client's errors, and the small pieces its calls share: addresses, error answers,
 * event records, time and backoff. */
import type { DexEvent, Time } from "./client-types";
import type { Message } from "./sse";

const DEFAULT_ADDRESS = "http://127.0.0.1:7450";

const CODES: Record<number, string> = {
  401: "unauthorized",
  403: "unauthorized",
  404: "not_found",
  409: "conflict",
  422: "invalid_input",
};

/** An error answer of the server (``status``, and the error body's ``code``, ``message``
 * and ``details``), or no usable answer at all. ``retryable``: the same call may succeed
 * if made again (no node answered; the store could not commit). */
export class ApiError extends Error {
  readonly status: number;
  readonly code: string;
  readonly details: Record<string, unknown>;
  readonly retryable: boolean;

  constructor(
    status: number,
    code: string,
    message: string,
    details: Record<string, unknown> = {},
    retryable = false,
  ) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
    this.details = details;
    this.retryable = retryable;
  }
}

/** No node answered (each refused the connection, timed out, or answered 503 as a standby
 * or a node starting), or an event stream broke: ``status`` 503, ``code`` ``unavailable``. */
export class UnavailableError extends ApiError {
  constructor(message: string) {
    super(503, "unavailable", message, {}, true);
    this.name = "UnavailableError";
  }
}

/** No address answered in one round. */
export class NoAnswer extends Error {
  constructor(readonly last: unknown) {
    super(describe(last));
  }
}


/** The addresses of ``address`` (default: DEX_ADDRESS, else http://127.0.0.1:7450): a
 * list, or comma-separated; each http:// or https://, without a trailing slash. */
export function addressesOf(address?: string | string[]): string[] {
  const given = address ?? (process.env.DEX_ADDRESS || DEFAULT_ADDRESS);
  const parts = Array.isArray(given) ? given : given.split(",");
  const found = parts.map((p) => p.trim().replace(/\/+$/, "")).filter((p) => p !== "");
  if (found.length === 0) throw new Error("no Dex Server address given");
  for (const a of found) {
    if (!a.startsWith("http://") && !a.startsWith("https://")) {
      throw new Error(`a Dex Server address starts with http:// or https://, not ${JSON.stringify(a)}`);
    }
  }
  return found;
}

/** The error of an error answer: its status, and the body's code (by the status when it
 * has none), message and details. */
export function errorOf(status: number, body: unknown): ApiError {
  const error = isObject(body) && isObject(body.error) ? body.error : {};
  const message = typeof error.message === "string" ? error.message : `HTTP ${status}`;
  const code = typeof error.code === "string" ? error.code : (CODES[status] ?? "server_error");
  const details = isObject(error.details) ? error.details : {};
  return new ApiError(status, code, message, details);
}

/** A 503: the node does not serve (a standby, starting), or it serves but its store could
 * not commit (``storage_error``: nothing was written, retryable). */
export function notServing(base: string, payload: Buffer): ApiError {
  const decoded = parse(payload);
  const error = isObject(decoded) && isObject(decoded.error) ? decoded.error : null;
  if (error !== null && error.code === "storage_error") {
    const details = isObject(error.details) ? error.details : {};
    return new ApiError(503, "storage_error", String(error.message), details, true);
  }
  return new UnavailableError(`${base} is not serving: ${preview(payload)}`);
}

export function isStorageError(e: unknown): e is ApiError {
  return e instanceof ApiError && e.code === "storage_error";
}

export function broken(sessionId: string, last: unknown): UnavailableError {
  return new UnavailableError(`the event stream of ${sessionId} broke: ${describe(last)}`);
}

/** A Dex event as ``streamEvents`` yields it: the data is JSON. */
export function event(message: Message): DexEvent {
  let data: unknown;
  try {
    data = JSON.parse(message.data);
  } catch {
    throw new ApiError(
      500,
      "server_error",
      `an event whose data is not JSON: ${message.type} ${JSON.stringify(message.data.slice(0, 200))}`,
    );
  }
  return { id: message.id, type: message.type, data: data as Record<string, unknown> };
}

export function parse(payload: Buffer): unknown {
  if (payload.length === 0) return null;
  try {
    return JSON.parse(payload.toString("utf8"));
  } catch {
    return null;
  }
}

export function isObject(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

export function preview(payload: Buffer): string {
  return JSON.stringify(payload.subarray(0, 200).toString("utf8"));
}

/** What went wrong, for a message: a fetch error names its cause (ECONNREFUSED, ...). */
export function describe(e: unknown): string {
  if (!(e instanceof Error)) return String(e);
  return e.cause instanceof Error ? `${e.message} (${e.cause.message})` : e.message;
}

/** A path segment, escaped. */
export function seg(value: string): string {
  return encodeURIComponent(value);
}

/** A path of segments: ``value`` split at ``/``, each part escaped. A model group
 * (``anthropic/claude-sonnet-4-5``) goes so, as the Python Client sends it: the server's
 * route takes the rest of the path, slashes and all. */
export function segs(value: string): string {
  return value.split("/").map(seg).join("/");
}

export function unix(value: Time | undefined): number | undefined {
  return value instanceof Date ? value.getTime() / 1000 : value;
}

/** Monotonic seconds. */
export function now(): number {
  return performance.now() / 1000;
}

/** Full jitter: a random wait up to ``initial`` doubling per attempt, at most ``max``. */
export function jitter(attempt: number, initial: number, max: number): number {
  return Math.random() * Math.min(max, initial * 2 ** (attempt - 1));
}

export function sleep(seconds: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason);
    const done = () => {
      signal.removeEventListener("abort", aborted);
      resolve();
    };
    const aborted = () => {
      clearTimeout(timer);
      reject(signal.reason);
    };
    const timer = setTimeout(done, seconds * 1000);
    signal.addEventListener("abort", aborted, { once: true });
  });
}

/** A signal that aborts after ``seconds`` or with ``outer``; ``clear()`` when done. */
export function timed(
  seconds: number,
  outer: AbortSignal,
): { signal: AbortSignal; timedOut(): boolean; clear(): void } {
  const controller = new AbortController();
  let expired = false;
  const timer = setTimeout(() => {
    expired = true;
    controller.abort(new Error(`timed out after ${seconds} s`));
  }, seconds * 1000);
  const onOuter = () => controller.abort(outer.reason);
  if (outer.aborted) onOuter();
  else outer.addEventListener("abort", onOuter, { once: true });
  return {
    signal: controller.signal,
    timedOut: () => expired,
    clear: () => {
      clearTimeout(timer);
      outer.removeEventListener("abort", onOuter);
    },
  };
}

/** ``step()``, aborting ``controller`` when it takes more than ``seconds``. */
export async function within<T>(seconds: number, controller: AbortController, step: () => Promise<T>): Promise<T> {
  const timer = setTimeout(() => controller.abort(new Error(`nothing for ${seconds} s`)), seconds * 1000);
  try {
    return await step();
  } finally {
    clearTimeout(timer);
  }
}

/** A signal that aborts when any of ``signals`` does (AbortSignal.any is Node 20.3+);
 * ``release()`` stops listening to them. */
export function linked(signals: (AbortSignal | undefined)[]): { signal: AbortSignal; release(): void } {
  const controller = new AbortController();
  const undo: (() => void)[] = [];
  for (const signal of signals) {
    if (signal === undefined) continue;
    if (signal.aborted) {
      controller.abort(signal.reason);
      continue;
    }
    const onAbort = () => controller.abort(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    undo.push(() => signal.removeEventListener("abort", onAbort));
  }
  return { signal: controller.signal, release: () => undo.forEach((f) => f()) };
}
