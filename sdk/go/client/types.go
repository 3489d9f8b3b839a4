package client

import "encoding/json"

// The shapes of the HTTP API, written by hand from sdk/openapi.json (the server's OpenAPI
// document): each struct names its schema, and TestTypesMatchTheOpenAPIDocument fails
// when a JSON field is not a property of that schema, a required property is missing, or
// a field's type does not fit. Times are Unix seconds. A property that may be null is a
// pointer, except a string, list or object, whose null reads as empty.

// A turn's status as answered (ShownTurnStatus): "waiting" is a running turn that
// waits for a person.
const (
	TurnRunning   = "running"
	TurnWaiting   = "waiting"
	TurnCompleted = "completed"
	TurnFailed    = "failed"
	TurnCancelled = "cancelled"
)

// A session's status (FleetStatus). ListSessionsOptions.Status also takes
// OutcomeUnknown: the sessions with an unreconciled outcome_unknown call.
const (
	SessionIdle    = "idle"
	SessionRunning = "running"
	SessionWaiting = "waiting"
	SessionFailed  = "failed"
	OutcomeUnknown = "outcome_unknown"
)

// A tool call's status (ToolCallStatus).
const (
	CallPending        = "pending"
	CallRunning        = "running"
	CallSucceeded      = "succeeded"
	CallFailed         = "failed"
	CallOutcomeUnknown = "outcome_unknown"
	CallDenied         = "denied"
)

// What a person is asked (PersonWait.Kind): approve or deny a call, answer it, or raise
// the session's budget (PUT /v1/sessions/{id}/budget; CallID, Tool and ArgumentsHash are
// empty then).
const (
	KindApproval = "approval"
	KindQuestion = "question"
	KindBudget   = "budget"
)

// Where a model group's limits come from (GroupLimits.Source): the server's config, or
// SetLimit at run time (they win). A group with calls but no limits has none ("").
const (
	LimitFromConfig = "config"
	LimitFromAPI    = "api"
)

// The events of a session's stream (Event.Type), and the stream's own notices.
const (
	EventHistoryItem    = "history.item"
	EventTurnStarted    = "turn.started"
	EventTurnCompleted  = "turn.completed"
	EventTurnFailed     = "turn.failed"
	EventTurnCancelled  = "turn.cancelled"
	EventWaitStarted    = "wait.started"
	EventWaitEnded      = "wait.ended"     // a budget wait ended: the budget was raised or removed
	EventBudgetChanged  = "budget.changed" // the session's budget changed
	EventMessageQueued  = "message.queued"
	EventMessageSteered = "message.steered" // a message joined the running turn (docs/mid-turn.md)
	EventModelDelta     = "model.delta"
	EventModelDiscard   = "model.discard"
	EventStreamGap      = "stream.gap"
	EventStreamDropped  = "stream.dropped"
)

// Session is a session in the fleet view (schema Session).
type Session struct {
	ID        string  `json:"id"`
	Agent     string  `json:"agent"`
	Tenant    string  `json:"tenant,omitempty"` // whose session it is ("": none)
	Status    string  `json:"status"`           // SessionIdle, SessionRunning, SessionWaiting or SessionFailed
	CreatedAt float64 `json:"created_at"`
	UpdatedAt float64 `json:"updated_at"`
	// WaitingSince is when its turn started to wait for a person; nil if it does not.
	WaitingSince *float64 `json:"waiting_since"`
	// OutcomeUnknown counts its outcome_unknown tool calls not reconciled yet.
	OutcomeUnknown int `json:"outcome_unknown"`
	// Usage is the tokens and cost of its model calls so far.
	Usage *SessionUsage `json:"usage"`
}

// Budget is what a session may use in all (SessionBudget); a nil limit does not apply.
type Budget struct {
	// MaxTokens counts input and output tokens together.
	MaxTokens *int `json:"max_tokens,omitempty"`
	// MaxCostUSD is in US dollars, at the server's prices.
	MaxCostUSD *float64 `json:"max_cost_usd,omitempty"`
}

// SessionUsage is the tokens and cost of a session's model calls whose results
// committed (SessionUsage).
type SessionUsage struct {
	InputTokens  int     `json:"input_tokens"`
	OutputTokens int     `json:"output_tokens"`
	CostUSD      float64 `json:"cost_usd"`
}

// BudgetSet answers SetBudget and RemoveBudget (BudgetSet).
type BudgetSet struct {
	SessionID string `json:"session_id"`
	// Budget is the budget now; nil: no limit.
	Budget *Budget      `json:"budget"`
	Usage  SessionUsage `json:"usage"`
	// Status is the session's after the change: a turn that waited for its budget and
	// may go on is SessionRunning again.
	Status string `json:"status"`
}

// Limit is a model group's limits (Limit); a nil limit does not apply.
type Limit struct {
	// Concurrency is the model calls running at once.
	Concurrency *int `json:"concurrency"`
	// RPM is the model calls started per minute.
	RPM *float64 `json:"rpm"`
	// TPM is the input plus output tokens per minute (input estimated).
	TPM *float64 `json:"tpm"`
}

// GroupLimits is a model group with limits or calls (GroupLimits), as the node that
// answered sees it.
type GroupLimits struct {
	// Group is an agent's model group, or the provider and the model
	// ("anthropic/claude-sonnet-4-5").
	Group string `json:"group"`
	// Limit is its limits; nil: none.
	Limit *Limit `json:"limit"`
	// Source is LimitFromConfig or LimitFromAPI ("": no limits).
	Source string `json:"source"`
	// Running is its model calls running, handed out by this node.
	Running int `json:"running"`
	// Waiting is its Steps this node holds queued for a limit.
	Waiting int `json:"waiting"`
	// LoweredTo is the part of its limits it admits after the provider refused calls (1:
	// all); it grows back as calls succeed.
	LoweredTo float64 `json:"lowered_to"`
}

// Tenant is a tenant's budget and what its sessions' model calls used (Tenant), as
// ListTenants, GetTenant, SetTenantBudget and RemoveTenantBudget answer it and as a
// snapshot's session shows it (SnapshotSession.TenantUsage).
type Tenant struct {
	Tenant string `json:"tenant"`
	// Budget is its budget; nil: none.
	Budget *TenantBudget `json:"budget"`
	// Day is today (UTC), as "2026-12-08": the day Today counts.
	Day   string      `json:"day"`
	Today TenantUsage `json:"today"`
	// ThisMonth is this UTC month, today included.
	ThisMonth TenantUsage `json:"this_month"`
	// Reached says how its budget is used up, in words: its sessions' next model calls
	// wait (KindBudget) until it is raised or the day or month ends. "": it is not.
	Reached string `json:"reached"`
}

// TenantBudget is what all of a tenant's sessions may use in a UTC day and month
// (TenantBudgetView); a nil limit does not apply.
type TenantBudget struct {
	// MaxTokensPerDay and MaxTokensPerMonth count input and output tokens together.
	MaxTokensPerDay *int `json:"max_tokens_per_day"`
	// MaxCostUSDPerDay and MaxCostUSDPerMonth are in US dollars, at the server's prices.
	MaxCostUSDPerDay   *float64 `json:"max_cost_usd_per_day"`
	MaxTokensPerMonth  *int     `json:"max_tokens_per_month"`
	MaxCostUSDPerMonth *float64 `json:"max_cost_usd_per_month"`
}

// TenantUsage is what a tenant's model calls whose results committed used in a period
// (TenantUsage).
type TenantUsage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
	// Tokens is input and output tokens together.
	Tokens  int     `json:"tokens"`
	CostUSD float64 `json:"cost_usd"`
	Calls   int     `json:"calls"`
}

// SessionList is one page of sessions (SessionList); NextCursor is empty on the last.
type SessionList struct {
	Sessions   []Session `json:"sessions"`
	NextCursor string    `json:"next_cursor"`
}

// ForkedFrom names the session a fork was made from, and the first of its turns the
// fork does not have (ForkedFrom).
type ForkedFrom struct {
	SessionID string `json:"session_id"`
	Turn      int    `json:"turn"`
}

// Forked is the session a fork made (Forked).
type Forked struct {
	Session
	ForkedFrom ForkedFrom `json:"forked_from"`
	// MessagesReceived is how many messages it has: its next one starts turn this + 1.
	MessagesReceived int `json:"messages_received"`
}

// PersonWait is an approval or a question that waits for a person (PersonWait): an item
// of the inbox, and of a turn's WaitingFor.
type PersonWait struct {
	SessionID string         `json:"session_id"`
	Agent     string         `json:"agent"`
	Turn      int            `json:"turn"`
	CallID    string         `json:"call_id"`
	StepID    string         `json:"step_id"`
	Kind      string         `json:"kind"` // KindApproval, KindQuestion or KindBudget
	Tool      string         `json:"tool"`
	Arguments map[string]any `json:"arguments"`
	// ArgumentsHash is what an approval is bound to: pass it to Approve.
	ArgumentsHash string   `json:"arguments_hash"`
	Question      string   `json:"question"`
	Choices       []string `json:"choices"`
	Since         float64  `json:"since"`
	// Budget and Usage are, for KindBudget, the session's budget and what it used.
	Budget *Budget       `json:"budget"`
	Usage  *SessionUsage `json:"usage"`
	// Tenant is, for KindBudget, the tenant whose budget the turn waits for; "" for a
	// wait on the session's own budget.
	Tenant string `json:"tenant"`
}

// Inbox is one page of what waits for a person across sessions (Inbox).
type Inbox struct {
	Items      []PersonWait `json:"items"`
	NextCursor string       `json:"next_cursor"`
}

// TurnResult is a turn as a wait answers it (TurnResult).
type TurnResult struct {
	SessionID string   `json:"session_id"`
	Turn      int      `json:"turn"`
	Status    string   `json:"status"` // TurnRunning, TurnWaiting, TurnCompleted, ...
	StartedAt *float64 `json:"started_at"`
	EndedAt   *float64 `json:"ended_at"`
	// Text is the final answer of a completed turn.
	Text      string     `json:"text"`
	Error     string     `json:"error"`
	ToolCalls []ToolCall `json:"tool_calls"`
	Steps     []Step     `json:"steps"`
	// WaitingFor lists, with TurnWaiting, each approval or answer the turn waits for.
	WaitingFor []PersonWait `json:"waiting_for"`
}

// SentMessage is what a message did, and the turn that answers it (SentMessage).
type SentMessage struct {
	TurnResult
	// Created is false when this message id was sent before: the first send's turn
	// and outcome.
	Created bool `json:"created"`
	// Outcome is what the message did (docs/mid-turn.md): "started" its turn (the
	// session was idle), "queued" (its turn starts once the running one ends),
	// "interrupted" the running turn (cancelled; its turn started at once), or
	// "steered" into the running turn (Turn is that turn, which answers it).
	Outcome string `json:"outcome"`
	// Interrupted is, with "interrupted", the turn the message cancelled.
	Interrupted *int `json:"interrupted"`
}

// Step is one durable unit of work of a turn, with its attempts (Step).
type Step struct {
	ID          string         `json:"id"`
	Type        string         `json:"type"` // RunModel, CallTool, AwaitToolApproval, ...
	Status      string         `json:"status"`
	Queue       string         `json:"queue"`
	Retry       Retry          `json:"retry"`
	CreatedAt   float64        `json:"created_at"`
	EndedAt     *float64       `json:"ended_at"`
	NotBefore   *float64       `json:"not_before"`
	Attempts    []Attempt      `json:"attempts"`
	Error       *AttemptError  `json:"error"`
	ToolCallID  string         `json:"tool_call_id"`
	StopReason  string         `json:"stop_reason"`
	Usage       map[string]int `json:"usage"`
	Wait        *Wait          `json:"wait"`
	HandedBack  int            `json:"handed_back"`
	PollStart   int            `json:"poll_start"`
	Polls       int            `json:"polls"`
	RateLimited int            `json:"rate_limited"`
}

// Retry is a retry policy (Retry on a Step, RetryPolicy on an agent or a tool).
type Retry struct {
	MaxAttempts           int     `json:"max_attempts"`
	InitialBackoffSeconds float64 `json:"initial_backoff_seconds"`
	BackoffMultiplier     float64 `json:"backoff_multiplier"`
	MaxBackoffSeconds     float64 `json:"max_backoff_seconds"`
	WithinSeconds         float64 `json:"within_seconds"`
}

// Attempt is one try at a Step (Attempt).
type Attempt struct {
	Number    int           `json:"number"`
	WorkerID  string        `json:"worker_id"`
	StartedAt float64       `json:"started_at"`
	EndedAt   *float64      `json:"ended_at"`
	Outcome   string        `json:"outcome"` // running, succeeded, failed or cancelled
	Error     *AttemptError `json:"error"`
	Proof     string        `json:"proof"`
}

// AttemptError is why an attempt or a Step failed (AttemptError).
type AttemptError struct {
	Message         string `json:"message"`
	Retryable       bool   `json:"retryable"`
	AttemptProgress string `json:"attempt_progress"`
}

// Wait is what a waiting Step waits for (Wait).
type Wait struct {
	Since      float64        `json:"since"`
	Deadline   *float64       `json:"deadline"`
	Question   string         `json:"question"`
	Choices    []string       `json:"choices"`
	Resolution map[string]any `json:"resolution"`
	ResolvedAt *float64       `json:"resolved_at"`
}

// ToolCall is a tool call of a turn (ToolCall).
type ToolCall struct {
	ID             string           `json:"id"`
	ModelCallID    string           `json:"model_call_id"`
	Name           string           `json:"name"`
	Arguments      map[string]any   `json:"arguments"`
	Kind           string           `json:"kind"` // read, idempotent_write, write or task
	IdempotencyKey string           `json:"idempotency_key"`
	Status         string           `json:"status"` // CallPending, CallSucceeded, ...
	StepID         string           `json:"step_id"`
	Result         json.RawMessage  `json:"result"`
	Error          string           `json:"error"`
	Started        bool             `json:"started"`
	Checking       bool             `json:"checking"`
	Approval       map[string]any   `json:"approval"`
	ArgumentsHash  string           `json:"arguments_hash"`
	Answers        []string         `json:"answers"`
	Questions      []map[string]any `json:"questions"`
	SleepsDone     int              `json:"sleeps_done"`
	TaskHandle     json.RawMessage  `json:"task_handle"`
	Reconciled     map[string]any   `json:"reconciled"`
}

// SessionToolCall is a tool call of any turn of a session, in its snapshot
// (SessionToolCall).
type SessionToolCall struct {
	ToolCall
	Turn int `json:"turn"`
}

// Snapshot is a session's agent snapshot (Snapshot).
type Snapshot struct {
	Session SnapshotSession `json:"session"`
	// CurrentTurn is the running turn, with its Steps and attempts; nil when none runs.
	CurrentTurn *Turn `json:"current_turn"`
	// Waiting lists the queued Steps and what each waits for.
	Waiting []QueuedStep `json:"waiting"`
	// Waits lists every wait of the current turn.
	Waits     []WaitInfo        `json:"waits"`
	Approvals []PendingApproval `json:"approvals"`
	// Running lists the attempts Workers hold now.
	Running   []RunningAttempt  `json:"running"`
	History   []HistoryItem     `json:"history"`
	ToolCalls []SessionToolCall `json:"tool_calls"`
}

// SnapshotSession is the session of a snapshot (SnapshotSession).
type SnapshotSession struct {
	Session
	// LastTurnStatus is how the latest ended turn ended (empty before one did).
	LastTurnStatus   string          `json:"last_turn_status"`
	MessagesReceived int             `json:"messages_received"`
	QueuedMessages   []QueuedMessage `json:"queued_messages"`
	// ForkedFrom is, for a fork, the session it was made from.
	ForkedFrom *ForkedFrom `json:"forked_from"`
	// Priority is its place among its tenant's sessions in the queues (higher first).
	Priority int `json:"priority"`
	// Budget is what it may use in all; nil: no limit.
	Budget *Budget `json:"budget"`
	// TenantUsage is its tenant's budget and usage today and this month; nil for a
	// session without a tenant.
	TenantUsage *Tenant `json:"tenant_usage"`
}

// QueuedMessage is a message that waits for the running turn to end (QueuedMessage).
type QueuedMessage struct {
	Number    int    `json:"number"`
	Text      string `json:"text"`
	MessageID string `json:"message_id"`
}

// Turn is a turn's record (Turn).
type Turn struct {
	Number       int        `json:"number"`
	Status       string     `json:"status"` // running, completed, failed or cancelled
	StartedAt    float64    `json:"started_at"`
	EndedAt      *float64   `json:"ended_at"`
	Text         string     `json:"text"`
	Error        string     `json:"error"`
	MessageID    string     `json:"message_id"`
	Batch        []string   `json:"batch"`
	Steps        []Step     `json:"steps"`
	ToolCalls    []ToolCall `json:"tool_calls"`
	HistoryStart int        `json:"history_start"`
	HistoryChars int        `json:"history_chars"`
	Trace        string     `json:"trace"`
}

// HistoryItem is one item of a session's history: Type "user", "assistant",
// "tool_result", "note" or "summary" (UserItem, AssistantItem, ToolResultItem, NoteItem,
// SummaryItem), each with its fields.
type HistoryItem struct {
	Type string `json:"type"`
	// Text of a user, assistant, note or summary item.
	Text string `json:"text"`
	// ToolCalls and State of an assistant item.
	ToolCalls []ModelToolCall `json:"tool_calls"`
	State     json.RawMessage `json:"state"`
	// CallID, Name, Status, Result and Error of a tool result.
	CallID string          `json:"call_id"`
	Name   string          `json:"name"`
	Status string          `json:"status"`
	Result json.RawMessage `json:"result"`
	Error  string          `json:"error"`
}

// ModelToolCall is a call the model asked for (ModelToolCall).
type ModelToolCall struct {
	ID        string         `json:"id"`
	Name      string         `json:"name"`
	Arguments map[string]any `json:"arguments"`
}

// QueuedStep is a Step that waits in its queue, and what for (QueuedStep).
type QueuedStep struct {
	StepID     string   `json:"step_id"`
	Queue      string   `json:"queue"`
	NotBefore  *float64 `json:"not_before"`
	WaitingFor string   `json:"waiting_for"`
}

// WaitInfo is a wait of the current turn: an approval, a question or a timer (WaitInfo).
type WaitInfo struct {
	StepID   string   `json:"step_id"`
	Type     string   `json:"type"`
	CallID   string   `json:"call_id"`
	Since    float64  `json:"since"`
	Deadline *float64 `json:"deadline"`
	Question string   `json:"question"`
	Choices  []string `json:"choices"`
	// ResolutionRecorded: its resolution is recorded but not applied yet.
	ResolutionRecorded bool `json:"resolution_recorded"`
}

// PendingApproval is a tool call that waits for approval (PendingApproval).
type PendingApproval struct {
	CallID        string         `json:"call_id"`
	Tool          string         `json:"tool"`
	Arguments     map[string]any `json:"arguments"`
	ArgumentsHash string         `json:"arguments_hash"`
	Since         float64        `json:"since"`
}

// RunningAttempt is an attempt a Worker holds now (RunningAttempt).
type RunningAttempt struct {
	AttemptID   string `json:"attempt_id"`
	WorkerID    string `json:"worker_id"`
	OutputChars int    `json:"output_chars"`
}

// Agent is an agent Workers registered (ServedAgent).
type Agent struct {
	Name                  string         `json:"name"`
	Instructions          string         `json:"instructions"`
	Model                 map[string]any `json:"model"`
	Tools                 []ToolSpec     `json:"tools"`
	ModelRetry            Retry          `json:"model_retry"`
	CompactThresholdChars *int           `json:"compact_threshold_chars"`
	// Workers counts the connected Workers that serve it now.
	Workers int `json:"workers"`
}

// ToolSpec is a tool of an agent (ToolSpec).
type ToolSpec struct {
	Name                string         `json:"name"`
	Description         string         `json:"description"`
	Kind                string         `json:"kind"`
	Parameters          map[string]any `json:"parameters"`
	Retry               Retry          `json:"retry"`
	Approval            string         `json:"approval"` // never, always or predicate
	HasCheck            bool           `json:"has_check"`
	PollIntervalSeconds float64        `json:"poll_interval_seconds"`
}

// Worker is a connected Worker (ConnectedWorker); in a cluster, one per node it is
// connected to, with that Node.
type Worker struct {
	WorkerID    string        `json:"worker_id"`
	ConnectedAt float64       `json:"connected_at"`
	Capacity    int           `json:"capacity"`
	Draining    bool          `json:"draining"`
	Agents      []WorkerAgent `json:"agents"`
	// Running lists the ids of the attempts it holds.
	Running []string `json:"running"`
	Node    string   `json:"node"`
}

// WorkerAgent is an agent a Worker serves, with its tools' names (WorkerAgent).
type WorkerAgent struct {
	Name  string   `json:"name"`
	Tools []string `json:"tools"`
}

// ClusterView is the nodes of the cluster (ClusterView); on a node alone NodeID is
// empty, PartitionCount nil and Members empty.
type ClusterView struct {
	NodeID         string          `json:"node_id"`
	PartitionCount *int            `json:"partition_count"`
	Members        []ClusterMember `json:"members"`
}

// ClusterMember is a live node (ClusterMember).
type ClusterMember struct {
	NodeID     string `json:"node_id"`
	Address    string `json:"address"`
	Standby    bool   `json:"standby"`
	Partitions []int  `json:"partitions"`
	// Here: the node that answered.
	Here bool `json:"here"`
}

// Approved answers an approval or a denial (Approved).
type Approved struct {
	CallID   string `json:"call_id"`
	Approved bool   `json:"approved"`
}

// Answered answers an answer (Answered).
type Answered struct {
	CallID   string `json:"call_id"`
	Answered bool   `json:"answered"`
}

// Cancelled answers a cancel (Cancelled).
type Cancelled struct {
	SessionID string `json:"session_id"`
	Turn      int    `json:"turn"`
	Status    string `json:"status"`
}

// The lists the API wraps in an object.

type agentList struct {
	Agents []Agent `json:"agents"`
}

type workerList struct {
	Workers     []Worker `json:"workers"`
	Unreachable []string `json:"unreachable"`
}

type approvalList struct {
	Approvals []PendingApproval `json:"approvals"`
}

type limitsView struct {
	Groups []GroupLimits `json:"groups"`
}

type tenantsView struct {
	Tenants []Tenant `json:"tenants"`
}

// The error body (ErrorResponse, ErrorDetail).

type errorResponse struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    string         `json:"code"`
	Message string         `json:"message"`
	Details map[string]any `json:"details"`
}

// The request bodies.

type createSession struct {
	Agent     string  `json:"agent"`
	SessionID string  `json:"session_id,omitempty"`
	Tenant    string  `json:"tenant,omitempty"`
	Priority  int     `json:"priority,omitempty"`
	Budget    *Budget `json:"budget,omitempty"`
}

type setBudget struct {
	MaxTokens  *int     `json:"max_tokens,omitempty"`
	MaxCostUSD *float64 `json:"max_cost_usd,omitempty"`
	By         string   `json:"by,omitempty"`
}

type setTenantBudget struct {
	MaxTokensPerDay    *int     `json:"max_tokens_per_day,omitempty"`
	MaxCostUSDPerDay   *float64 `json:"max_cost_usd_per_day,omitempty"`
	MaxTokensPerMonth  *int     `json:"max_tokens_per_month,omitempty"`
	MaxCostUSDPerMonth *float64 `json:"max_cost_usd_per_month,omitempty"`
	By                 string   `json:"by,omitempty"`
}

type fork struct {
	Turn      int    `json:"turn"`
	SessionID string `json:"session_id,omitempty"`
}

type sendMessage struct {
	Text        string   `json:"text"`
	MessageID   string   `json:"message_id,omitempty"`
	OnBusy      string   `json:"on_busy,omitempty"`
	WaitSeconds *float64 `json:"wait_seconds,omitempty"`
}

type approve struct {
	By            string `json:"by,omitempty"`
	ArgumentsHash string `json:"arguments_hash,omitempty"`
}

type deny struct {
	Reason string `json:"reason"`
	By     string `json:"by,omitempty"`
}

type answer struct {
	Answer string `json:"answer"`
	By     string `json:"by,omitempty"`
}

type cancel struct {
	Reason string `json:"reason"`
}

type reconcile struct {
	Status string `json:"status"`
	Result any    `json:"result"`
	Error  string `json:"error,omitempty"`
	By     string `json:"by,omitempty"`
}
