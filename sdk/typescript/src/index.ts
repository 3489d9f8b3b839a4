/** The Dex SDK for Node: define agents and tools, then serve them (Worker); create
 * sessions, send messages, follow and approve them (Client). */
export {
  defineAgent,
  defineTool,
  Interrupt,
  NonRetryableError,
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
export { ApiError, Client, LONG_POLL, UnavailableError } from "./client";
export type {
  AgentSnapshot,
  Answered,
  Approved,
  Cancelled,
  ClientOptions,
  ClusterMember,
  ClusterView,
  ConnectedWorker,
  DexEvent,
  ErrorBody,
  ForkedSession,
  Inbox,
  ListSessionsOptions,
  PendingApproval,
  PersonWait,
  SendMessageOptions,
  SentMessage,
  ServedAgent,
  Session,
  SessionList,
  SessionStatus,
  StreamOptions,
  Time,
  TurnResult,
  TurnStatus,
  TurnToolCall,
} from "./client";
/** The HTTP API's shapes, generated from sdk/openapi.json (npm run gen:api). */
export type { components as ApiComponents, operations as ApiOperations, paths as ApiPaths } from "./api";
