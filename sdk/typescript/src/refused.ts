/** The one error of the Worker's own (a tool's and a model's are agent.ts'): kept apart from
 * the connection, so that the package's public types never reach the Worker's internals
 * (nor, through them, OpenTelemetry's types, an optional peer dependency). */

/** The server refused this Worker for good (a token, or a worker_id in use): do not retry. */
export class WorkerRefusedError extends Error {
  override name = "WorkerRefusedError";
}
