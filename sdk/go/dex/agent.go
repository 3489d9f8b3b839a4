package dex

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// ToolKind says what a tool does, and so how Dex retries it after a crash.
type ToolKind string

const (
	// Read tools change nothing: a crash runs them again.
	Read ToolKind = "read"
	// IdempotentWrite tools are keyed by ToolContext.IdempotencyKey: a crash runs them
	// again with the same key.
	IdempotentWrite ToolKind = "idempotent_write"
	// Write tools run at most once (a CallSingleAttemptTool Step): a crash records
	// outcome_unknown.
	Write ToolKind = "write"
	// Task tools start a long job and return its handle; Poll asks whether it is done.
	Task ToolKind = "task"
)

// Agent is what a Worker serves: a name, instructions, a model and tools.
type Agent struct {
	Name         string
	Instructions string
	Model        Model
	Tools        []Tool
	// ModelRetry bounds the attempts of this agent's model calls (nil: the server's default).
	ModelRetry *RetryPolicy
	// CompactThresholdChars (> 0) compacts the history once it is that long.
	CompactThresholdChars int
	// OnBusy is what a user message does while a turn of the session runs, unless its
	// send says otherwise (docs/mid-turn.md): "enqueue" (the default, also when empty),
	// "reject", "interrupt" or "steer".
	OnBusy string
}

// Tool is a function the model may call.
type Tool struct {
	Name        string
	Description string
	Kind        ToolKind
	// Parameters is the JSON Schema of the arguments object: the model sees it, and the
	// Worker checks every call against it before Func runs (an invalid call records
	// failed, naming what is wrong); Func gets the arguments with the parameters'
	// defaults filled in.
	Parameters map[string]any
	// Approval true: every call waits for a person's approval first.
	Approval bool
	// NeedsApproval (instead of Approval) decides per call, from the call's arguments,
	// whether it waits for a person's approval (hello: approval "predicate"). An error
	// or a panic counts as yes.
	NeedsApproval func(args json.RawMessage) (bool, error)
	Retry         *RetryPolicy
	// Func runs the call. Its arguments are the JSON object the model sent.
	Func func(ctx context.Context, call *ToolContext, args json.RawMessage) (any, error)
	// Poll (kind Task) asks whether the job with this handle is done: return ErrPending
	// while it runs.
	Poll func(ctx context.Context, call *ToolContext, handle json.RawMessage) (any, error)
	// PollIntervalSeconds is the gap between two polls (default 1).
	PollIntervalSeconds float64
	// Check (optional, kind Write) tells whether a call whose outcome is unknown happened.
	Check func(ctx context.Context, call *ToolContext, args json.RawMessage) (Checked, error)
	// ConcurrencyKey (optional) runs at most ConcurrencyLimit (default 1) calls under one
	// key at once, across every Worker: a template of the arguments, "{customer_id}" for
	// one at a time per customer, "" for one key for every call (docs/flow-control.md).
	ConcurrencyKey   *string
	ConcurrencyLimit int
}

// Checked is a Check's verdict: Happened nil means it cannot tell.
type Checked struct {
	Happened *bool
	Result   any
}

// ErrPending is what Poll returns while the task still runs (return nil, ErrPending; a
// wrapped ErrPending counts too): the server polls again after PollIntervalSeconds.
var ErrPending = errors.New("dex: the task is still running")

// Pending, returned by Poll as its value, says what ErrPending says.
//
// Deprecated: return ErrPending as the error, as io.EOF ends a read.
var Pending = &struct{ pending bool }{true}

// ToolContext describes the tool call being run.
type ToolContext struct {
	SessionID      string
	CallID         string
	Tool           string
	IdempotencyKey string
	// Attempt counts from 1; a crash runs a retryable call again with Attempt + 1.
	Attempt    int
	Answers    []string
	SleepsDone int
	// Traceparent is, with tracing on at the server, the W3C traceparent of the
	// attempt's span there: make your spans of the call children of it.
	Traceparent string
	asked       int
	slept       int
	beat        func()
}

// CallContext is the name ToolContext had before it took the name the Python and
// TypeScript SDKs give it.
//
// Deprecated: use ToolContext.
type CallContext = ToolContext

// ToolError is a definite failure: the call records failed, and the model sees Message.
type ToolError struct{ Message string }

func (e *ToolError) Error() string { return e.Message }

// errAsked and errSleep end a call that waits for Dex (a question, a durable sleep).
type waitError struct{ outcome toolOutcome }

func (e *waitError) Error() string { return "the tool waits for Dex: " + e.outcome.Status }

// Ask asks the user a question. The first time, it returns an error that the tool must
// return as is: Dex asks, and calls the tool again with the answer, which Ask then returns.
func (c *ToolContext) Ask(question string, choices ...string) (string, error) {
	if c.asked < len(c.Answers) {
		c.asked++
		return c.Answers[c.asked-1], nil
	}
	return "", &waitError{toolOutcome{Status: "asked", Question: &question, Choices: choices}}
}

// Sleep sleeps durably: the first time it returns an error that the tool must return as
// is; Dex runs the tool again once the timer fired, and Sleep then returns nil.
func (c *ToolContext) Sleep(seconds float64) error {
	if c.slept < c.SleepsDone {
		c.slept++
		return nil
	}
	return &waitError{toolOutcome{Status: "sleep", SleepSeconds: &seconds}}
}

// Heartbeat tells Dex the attempt is alive now. Optional: the Worker beats every attempt
// it runs by itself, every HeartbeatInterval, whatever the tool does. Once the attempt is
// stopped or cancelled (ctx is done), or its result is sent, it sends nothing.
func (c *ToolContext) Heartbeat() {
	if c.beat != nil {
		c.beat()
	}
}

// Model is a pluggable model: Stream calls it, emitting text as it arrives.
type Model interface {
	// Spec is plain data naming the model and its settings (never a key).
	Spec() map[string]any
	// Stream answers a request; emit sends streamed text to Dex as it comes.
	Stream(ctx context.Context, req ModelRequest, emit func(text string)) (ModelResponse, error)
	// Summarize writes the summary of a CompactContext Step.
	Summarize(ctx context.Context, req ModelRequest) (Summary, error)
}

// ModelRequest is what a model is asked.
type ModelRequest struct {
	SessionID    string
	Agent        string
	Instructions string
	History      []Item
	Tools        []Tool
	Attempt      int
	// Traceparent is, with tracing on at the server, the W3C traceparent of the
	// attempt's span there.
	Traceparent string
}

// ModelError is a model call's failure; Retryable false fails the Step for good.
type ModelError struct {
	Message   string
	Retryable bool
}

func (e *ModelError) Error() string { return e.Message }

// RateLimitedError is a model provider's refusal of a call for its rate limit or its
// load (HTTP 429, Anthropic's 529 overloaded): nothing ran. A model returns it (or an
// error that wraps it) from Stream or Summarize, and the Worker hands the RunModel or
// CompactContext Step back: the server queues it again without using an attempt, and
// hands it out once the wait is over. A tool that returns it fails its attempt as any
// other error does (its body may have run). As Python's dex.models.RateLimited.
type RateLimitedError struct {
	Message string
	// RetryAfter is the wait the provider asked for (its Retry-After), when HasRetryAfter
	// is set; sent clamped to 0..1 hour. Without one the server waits 1 s, doubling with
	// each refusal of the same Step in a row, at most 60 s.
	RetryAfter    time.Duration
	HasRetryAfter bool
}

func (e *RateLimitedError) Error() string { return e.Message }

// maxRetryAfter is the longest wait a back frame names (the protocol's bound).
const maxRetryAfter = time.Hour

// retryAfterSeconds is the wait to send in the back frame, in seconds, clamped to
// 0..3600 (nil: the provider named none).
func (e *RateLimitedError) retryAfterSeconds() *float64 {
	if !e.HasRetryAfter {
		return nil
	}
	wait := e.RetryAfter
	if wait < 0 {
		wait = 0
	} else if wait > maxRetryAfter {
		wait = maxRetryAfter
	}
	seconds := wait.Seconds()
	return &seconds
}

func (a *Agent) tool(name string) *Tool {
	for i := range a.Tools {
		if a.Tools[i].Name == name {
			return &a.Tools[i]
		}
	}
	return nil
}

// needsApproval runs the tool's NeedsApproval on one call's arguments: a predicate that
// fails says yes, as in the Python Worker.
func (t *Tool) needsApproval(args map[string]any) (yes bool) {
	defer func() {
		if r := recover(); r != nil {
			yes = true
		}
	}()
	raw, err := json.Marshal(args)
	if err != nil {
		return true
	}
	yes, err = t.NeedsApproval(raw)
	return yes || err != nil
}

func (a *Agent) validate() error {
	if a.Name == "" || a.Model == nil {
		return errors.New("dex: an agent needs a Name and a Model")
	}
	for _, t := range a.Tools {
		if t.Name == "" || t.Func == nil {
			return fmt.Errorf("dex: agent %s: a tool needs a Name and a Func", a.Name)
		}
		if t.Approval && t.NeedsApproval != nil {
			return fmt.Errorf("dex: tool %s: set Approval or NeedsApproval, not both", t.Name)
		}
		switch t.Kind {
		case Read, IdempotentWrite, Write:
		case Task:
			if t.Poll == nil {
				return fmt.Errorf("dex: tool %s: a task tool needs a Poll", t.Name)
			}
		default:
			return fmt.Errorf("dex: tool %s: kind %q is not read, idempotent_write, write or task", t.Name, t.Kind)
		}
	}
	return nil
}

func (a *Agent) spec() agentSpec {
	tools := make([]toolSpec, 0, len(a.Tools))
	for _, t := range a.Tools {
		params := t.Parameters
		if params == nil {
			params = map[string]any{"type": "object", "properties": map[string]any{}}
		}
		approval := "never"
		switch {
		case t.NeedsApproval != nil:
			approval = "predicate"
		case t.Approval:
			approval = "always"
		}
		limit := 0
		if t.ConcurrencyKey != nil {
			limit = 1
			if t.ConcurrencyLimit > 1 {
				limit = t.ConcurrencyLimit
			}
		}
		tools = append(tools, toolSpec{
			Name: t.Name, Description: t.Description, Kind: t.Kind, Parameters: params,
			Approval: approval, HasCheck: t.Check != nil, PollIntervalSeconds: t.PollIntervalSeconds,
			Retry: t.Retry, ConcurrencyKey: t.ConcurrencyKey, ConcurrencyLimit: limit,
		})
	}
	s := agentSpec{Name: a.Name, Instructions: a.Instructions, Model: a.Model.Spec(), Tools: tools, ModelRetry: a.ModelRetry}
	if a.CompactThresholdChars > 0 {
		n := a.CompactThresholdChars
		s.CompactThresholdChars = &n
	}
	if a.OnBusy != "enqueue" {
		s.OnBusy = a.OnBusy // left out when the default, as the Python Worker does
	}
	return s
}
