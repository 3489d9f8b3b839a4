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
  ModelResponse,
  ModelTool,
  RetryPolicy,
  Summary,
  Tool,
  ToolContext,
  ToolOptions,
  Usage,
} from "./agent";
export { Scripted, call, say } from "./scripted";
export type { Script } from "./scripted";
export { Worker, WorkerRefusedError } from "./worker";
export type { WorkerOptions } from "./worker";
/** The session's history as the server keeps it (the HTTP API's items, snake_case), and
 * the names a tool's definition uses; the rest of the Worker protocol's frames stay
 * internal. */
export type { Item, ModelToolCall, ToolCallStatus, ToolKind } from "./protocol";
export { ApiError, Client, LONG_POLL, UnavailableError } from "./client";
export type {
  AgentSnapshot,
  Answered,
  Approved,
  Budget,
  BudgetOptions,
  BudgetSet,
  Cancelled,
  ClientOptions,
  ClusterMember,
  ClusterView,
  ConnectedWorker,
  CreateSessionOptions,
  DexEvent,
  ErrorBody,
  ForkedSession,
  GroupLimits,
  Inbox,
  ListSessionsOptions,
  ModelLimit,
  PendingApproval,
  PersonWait,
  SendMessageOptions,
  SentMessage,
  ServedAgent,
  Session,
  SessionBudget,
  SessionList,
  SessionStatus,
  StreamOptions,
  Tenant,
  TenantBudget,
  TenantBudgetOptions,
  TenantUsage,
  Time,
  TurnResult,
  TurnStatus,
  TurnToolCall,
} from "./client";
/** The HTTP API's shapes, generated from sdk/openapi.json (npm run gen:api). */
export type { components as ApiComponents, operations as ApiOperations, paths as ApiPaths } from "./api";
