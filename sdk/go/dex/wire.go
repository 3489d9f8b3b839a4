package dex

import (
	"encoding/json"
	"fmt"
)

// ProtocolVersion is the Worker protocol version sent in hello.
const ProtocolVersion = 1

// ToolCallNotRunErrorPrefix starts the error of a tool call that never ran.
const ToolCallNotRunErrorPrefix = "the tool did not run, so it is safe to call again"

// Close codes of the Worker protocol.
const (
	closeBadFrame     = 4400
	closeUnauthorized = 4401
	closeIDInUse      = 4409
	closeNotReady     = 4503
)

// StepKind is the kind of Step a hand-out runs: what it asks of the Worker.
type StepKind string

// The kinds of Step a Worker runs.
const (
	StepRunModel              StepKind = "RunModel"              // a model call
	StepCallTool              StepKind = "CallTool"              // a Read, IdempotentWrite or Task tool's call
	StepCallSingleAttemptTool StepKind = "CallSingleAttemptTool" // a Write tool's one attempt
	StepPollToolTask          StepKind = "PollToolTask"          // a poll of a Task tool's job
	StepCheckToolCall         StepKind = "CheckToolCall"         // a Write tool's Check
	StepCompactContext        StepKind = "CompactContext"        // a summary of the history
)

// ModelToolCall is one tool call as the model asked for it.
type ModelToolCall struct {
	ID        string         `json:"id"`
	Name      string         `json:"name"`
	Arguments map[string]any `json:"arguments"`
}

// Item is one entry of a session's history; Type says which fields are set:
// "user", "assistant", "tool_result", "note" or "summary".
type Item struct {
	Type      string          `json:"type"`
	Text      string          `json:"text,omitempty"`
	ToolCalls []ModelToolCall `json:"tool_calls,omitempty"`
	State     json.RawMessage `json:"state,omitempty"`
	CallID    string          `json:"call_id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Status    string          `json:"status,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	Error     *string         `json:"error,omitempty"`
}

// Usage counts a model call's tokens.
type Usage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

// ModelResponse is what a RunModel attempt produces.
type ModelResponse struct {
	Text             string          `json:"text"`
	ToolCalls        []ModelToolCall `json:"tool_calls"`
	StopReason       string          `json:"stop_reason"`
	Usage            Usage           `json:"usage"`
	ApprovalRequired []string        `json:"approval_required"`
}

// Summary is what a CompactContext attempt produces.
type Summary struct {
	Text  string `json:"text"`
	Usage Usage  `json:"usage"`
}

// toolOutcome is what a tool Step produces.
type toolOutcome struct {
	Status       string   `json:"status"`
	Result       any      `json:"result"`
	Error        *string  `json:"error"`
	Question     *string  `json:"question"`
	Choices      []string `json:"choices"`
	SleepSeconds *float64 `json:"sleep_seconds"`
	Happened     *bool    `json:"happened"`
}

// recoveryError says why an attempt failed, and how far it got.
type recoveryError struct {
	Message         string `json:"message"`
	AttemptProgress string `json:"attempt_progress"`
	Retryable       bool   `json:"retryable"`
}

// RetryPolicy says how often a Step may be handed out before it fails for good.
// Zero fields take the server's defaults.
type RetryPolicy struct {
	MaxAttempts           int     `json:"max_attempts,omitempty"`
	InitialBackoffSeconds float64 `json:"initial_backoff_seconds,omitempty"`
	BackoffMultiplier     float64 `json:"backoff_multiplier,omitempty"`
	MaxBackoffSeconds     float64 `json:"max_backoff_seconds,omitempty"`
	WithinSeconds         float64 `json:"within_seconds,omitempty"`
}

type toolSpec struct {
	Name                string         `json:"name"`
	Description         string         `json:"description"`
	Kind                ToolKind       `json:"kind"`
	Parameters          map[string]any `json:"parameters"`
	Approval            string         `json:"approval"`
	HasCheck            bool           `json:"has_check"`
	PollIntervalSeconds float64        `json:"poll_interval_seconds,omitempty"`
	Retry               *RetryPolicy   `json:"retry,omitempty"`
	ConcurrencyKey      *string        `json:"concurrency_key,omitempty"`
	ConcurrencyLimit    int            `json:"concurrency_limit,omitempty"`
}

type agentSpec struct {
	Name                  string         `json:"name"`
	Instructions          string         `json:"instructions"`
	Model                 map[string]any `json:"model"`
	Tools                 []toolSpec     `json:"tools"`
	ModelRetry            *RetryPolicy   `json:"model_retry,omitempty"`
	CompactThresholdChars *int           `json:"compact_threshold_chars,omitempty"`
	OnBusy                string         `json:"on_busy,omitempty"`
}

type hello struct {
	T            string      `json:"t"`
	WorkerID     string      `json:"worker_id"`
	Agents       []agentSpec `json:"agents"`
	Capacity     int         `json:"capacity"`
	Attempts     []string    `json:"attempts"`
	Resume       *string     `json:"resume"`
	Protocol     int         `json:"protocol"`
	HistoryCache int         `json:"history_cache"`
}

// step is a hand-out: a Step attempt given to this Worker.
type step struct {
	AttemptID      string          `json:"attempt_id"`
	SessionID      string          `json:"session_id"`
	StepID         string          `json:"step_id"`
	StepType       StepKind        `json:"step_type"`
	Attempt        int             `json:"attempt"`
	Agent          string          `json:"agent"`
	History        []Item          `json:"history"`
	HistoryBase    int             `json:"history_base"`
	Tool           *string         `json:"tool"`
	CallID         *string         `json:"call_id"`
	Arguments      json.RawMessage `json:"arguments"`
	IdempotencyKey *string         `json:"idempotency_key"`
	NeedsStartAck  bool            `json:"needs_start_ack"`
	Answers        []string        `json:"answers"`
	SleepsDone     int             `json:"sleeps_done"`
	TaskHandle     json.RawMessage `json:"task_handle"`
	Traceparent    *string         `json:"traceparent"`
}

// serverMessage is one server → Worker message, typed by its t (docs/worker-protocol.md,
// "Server → Worker"; src/dex/wire/server_frames.py): a welcomeMessage, step,
// heartbeatReplyMessage, ackMessage, cancelMessage, membersMessage or claimedMessage;
// an unknownMessage is one of a t this Worker does not know, which it ignores.
type serverMessage interface {
	serverMessage()
}

// welcomeMessage is the answer to hello.
type welcomeMessage struct {
	WorkerID         string   `json:"worker_id"`
	HeartbeatTimeout float64  `json:"heartbeat_timeout"`
	ReconnectGrace   float64  `json:"reconnect_grace"`
	Resume           string   `json:"resume"`
	Stop             []string `json:"stop"`
	// Members: the nodes of a cluster to be connected to (none: a single node)
	Members []string `json:"members"`
}

// heartbeatReplyMessage is the answer to an hb (t "hb"): per attempt "ok" or "stop",
// and the seq of a start acknowledgement's ask.
type heartbeatReplyMessage struct {
	Status map[string]string `json:"status"`
	Seq    *int64            `json:"seq"`
}

// ackMessage says a done, fail or back was committed (OK) or refused.
type ackMessage struct {
	AttemptID string  `json:"attempt_id"`
	OK        bool    `json:"ok"`
	Error     *string `json:"error"`
}

// cancelMessage asks to stop running an attempt: no result is wanted.
type cancelMessage struct {
	AttemptID string `json:"attempt_id"`
}

// membersMessage says the cluster's nodes changed.
type membersMessage struct {
	Members []string `json:"members"`
}

// claimedMessage is the answer to claim: per attempt "ok" (it is this connection's now)
// or "stop".
type claimedMessage struct {
	Status map[string]string `json:"status"`
}

// unknownMessage is a message of a t the Worker does not know: it is ignored.
type unknownMessage struct {
	T string
}

func (welcomeMessage) serverMessage()        {}
func (step) serverMessage()                  {}
func (heartbeatReplyMessage) serverMessage() {}
func (ackMessage) serverMessage()            {}
func (cancelMessage) serverMessage()         {}
func (membersMessage) serverMessage()        {}
func (claimedMessage) serverMessage()        {}
func (unknownMessage) serverMessage()        {}

// serverMessages decodes each server → Worker message by its t.
var serverMessages = map[string]func(json.RawMessage) (serverMessage, error){
	"welcome": decodeAs[welcomeMessage],
	"step":    decodeAs[step],
	"hb":      decodeAs[heartbeatReplyMessage],
	"ack":     decodeAs[ackMessage],
	"cancel":  decodeAs[cancelMessage],
	"members": decodeAs[membersMessage],
	"claimed": decodeAs[claimedMessage],
}

func decodeAs[M serverMessage](raw json.RawMessage) (serverMessage, error) {
	var m M
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	return m, nil
}

// message is one Worker → server message (docs/worker-protocol.md): a drainMessage,
// heartbeatMessage, deltaMessage, doneMessage, failMessage, backMessage or claimMessage.
type message interface {
	// attempt is the attempt the message is about ("" for drain, hb and claim).
	attempt() string
}

type drainMessage struct {
	T string `json:"t"` // "drain"
}

type heartbeatMessage struct {
	T        string   `json:"t"` // "hb"
	Attempts []string `json:"attempts"`
	Seq      *int64   `json:"seq,omitempty"` // asks for the start acknowledgement
}

type deltaMessage struct {
	T         string `json:"t"` // "delta"
	AttemptID string `json:"attempt_id"`
	Text      string `json:"text"`
}

type doneMessage struct {
	T         string          `json:"t"` // "done"
	AttemptID string          `json:"attempt_id"`
	Result    json.RawMessage `json:"result"`
}

type failMessage struct {
	T         string        `json:"t"` // "fail"
	AttemptID string        `json:"attempt_id"`
	Error     recoveryError `json:"error"`
}

type backMessage struct {
	T         string `json:"t"` // "back"
	AttemptID string `json:"attempt_id"`
	Reason    string `json:"reason,omitempty"` // "history", "rate_limited", or none
	// RetryAfter: with rate_limited, the wait the provider asked for, in seconds
	// (0..3600); left out when it named none
	RetryAfter *float64 `json:"retry_after,omitempty"`
	// why is what the model said, for the attempt's span (not sent)
	why string
}

// claimMessage names the Worker's strays, each with the resume token it was handed out
// under (docs/worker-protocol.md, rule 14).
type claimMessage struct {
	T        string            `json:"t"` // "claim"
	Attempts map[string]string `json:"attempts"`
}

func drain() drainMessage { return drainMessage{T: "drain"} }

func heartbeat(attempts []string, seq *int64) heartbeatMessage {
	return heartbeatMessage{T: "hb", Attempts: attempts, Seq: seq}
}

func delta(attemptID, text string) deltaMessage {
	return deltaMessage{T: "delta", AttemptID: attemptID, Text: text}
}

func claim(attempts map[string]string) claimMessage {
	return claimMessage{T: "claim", Attempts: attempts}
}

func handBack(attemptID, reason string) backMessage {
	return backMessage{T: "back", AttemptID: attemptID, Reason: reason}
}

// rateLimited hands back an attempt whose model the provider refused for its rate limit
// or its load: nothing ran, and the server hands the Step out again after the wait.
func rateLimited(attemptID string, e *RateLimitedError) backMessage {
	return backMessage{
		T: "back", AttemptID: attemptID, Reason: "rate_limited",
		RetryAfter: e.retryAfterSeconds(), why: e.Message,
	}
}

func (drainMessage) attempt() string     { return "" }
func (heartbeatMessage) attempt() string { return "" }
func (m deltaMessage) attempt() string   { return m.AttemptID }
func (m doneMessage) attempt() string    { return m.AttemptID }
func (m failMessage) attempt() string    { return m.AttemptID }
func (m backMessage) attempt() string    { return m.AttemptID }
func (claimMessage) attempt() string     { return "" }

// decodeFrame reads a frame: a JSON array of messages, each with a t, each decoded into
// the type of its t. A message that does not fit its type fails the whole frame, before
// any of it is applied.
func decodeFrame(data []byte) ([]serverMessage, error) {
	var raws []json.RawMessage
	if err := json.Unmarshal(data, &raws); err != nil {
		return nil, fmt.Errorf("a frame must be a JSON array of messages: %w", err)
	}
	out := make([]serverMessage, 0, len(raws))
	for i, raw := range raws {
		var tag struct {
			T string `json:"t"`
		}
		if err := json.Unmarshal(raw, &tag); err != nil {
			return nil, fmt.Errorf("message %d of the frame: %w", i, err)
		}
		if tag.T == "" {
			return nil, fmt.Errorf("message %d of the frame has no t", i)
		}
		decode, known := serverMessages[tag.T]
		if !known {
			out = append(out, unknownMessage{T: tag.T})
			continue
		}
		m, err := decode(raw)
		if err != nil {
			return nil, fmt.Errorf("message %d of the frame (%s): %w", i, tag.T, err)
		}
		out = append(out, m)
	}
	return out, nil
}

// outbox batches what is ready to send into one frame. Consecutive text of one
// attempt joins into one delta, as the protocol asks.
type outbox struct {
	pending []message
	deltas  map[string]int // attempt id → index of its delta in pending
}

func (o *outbox) add(m message) {
	if d, ok := m.(deltaMessage); ok {
		if i, ok := o.deltas[d.AttemptID]; ok {
			joined := o.pending[i].(deltaMessage)
			joined.Text += d.Text
			o.pending[i] = joined
			return
		}
		if o.deltas == nil {
			o.deltas = map[string]int{}
		}
		o.deltas[d.AttemptID] = len(o.pending)
	}
	o.pending = append(o.pending, m)
}

// take returns the frame of everything pending (nil when nothing is), and whether it
// carries a result (a done or a fail), and empties the box.
func (o *outbox) take() (data []byte, results bool) {
	if len(o.pending) == 0 {
		return nil, false
	}
	data, err := json.Marshal(o.pending)
	if err != nil {
		panic(fmt.Sprintf("dex: a Worker message does not encode: %v", err))
	}
	for _, m := range o.pending {
		switch m.(type) {
		case doneMessage, failMessage:
			results = true
		}
	}
	o.pending = nil
	o.deltas = nil
	return data, results
}
