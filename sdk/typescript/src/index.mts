/** The package's ES module entry (`import ... from "dex-runtime"`): the CommonJS build's
 * own exports, not a second copy of the SDK. With one copy, a program whose files both
 * `import` and `require` the SDK has one `Worker`, one `ToolError` (the Worker tells a
 * tool's errors apart with `instanceof`) and one `PENDING` symbol. */
export {
  ApiError,
  Client,
  Interrupt,
  LONG_POLL,
  NonRetryableError,
  PENDING,
  RateLimitedError,
  RetryableError,
  Scripted,
  ToolError,
  UnavailableError,
  Worker,
  WorkerRefusedError,
  call,
  defineAgent,
  defineTool,
  say,
  toolCallNotRunErrorPrefix,
} from "./index.js";
export type * from "./index.js";
