/** The Dex Worker SDK for Node: define agents and tools, then serve them. */
export {
  defineAgent,
  defineTool,
  Interrupt,
  PENDING,
  RateLimitedError,
  RetryableError,
  ToolError,
  toolCallNotRunErrorPrefix,
} from "./agent";
export type {
  Agent,
  AgentOptions,
  Args,
  Checked,
  Model,
  ModelRequest,
  Tool,
  ToolContext,
  ToolOptions,
} from "./agent";
export { Scripted, call, say } from "./scripted";
export type { Script } from "./scripted";
export { Worker, WorkerRefusedError } from "./worker";
export type { WorkerOptions } from "./worker";
export type * from "./protocol";
