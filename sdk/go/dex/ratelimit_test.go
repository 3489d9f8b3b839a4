package dex

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// limitedModel is a model whose provider refuses every call with err.
type limitedModel struct{ err error }

func (limitedModel) Spec() map[string]any { return map[string]any{"provider": "limited"} }

func (m limitedModel) Stream(ctx context.Context, req ModelRequest, emit func(string)) (ModelResponse, error) {
	return ModelResponse{}, m.err
}

func (m limitedModel) Summarize(ctx context.Context, req ModelRequest) (Summary, error) {
	return Summary{}, m.err
}

func limitedWorker(err error, logs *lockedBuffer, tools ...Tool) *Worker {
	return NewWorker(WorkerOptions{
		Address: "http://127.0.0.1:1", Logger: log.New(logs, "", 0),
		Agents: []Agent{{Name: "a", Model: limitedModel{err}, Tools: tools}},
	})
}

// encoded is the JSON the Worker sends for m.
func encoded(t *testing.T, m message) string {
	t.Helper()
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// A model's rate limit hands the RunModel Step back, with the provider's wait clamped to
// 0..3600 s, and without one when the provider named none; an error that wraps it counts.
func TestARunModelRateLimitedGoesBackWithTheProvidersWait(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"a wait", &RateLimitedError{Message: "429", RetryAfter: 1500 * time.Millisecond, HasRetryAfter: true},
			`{"t":"back","attempt_id":"m1","reason":"rate_limited","retry_after":1.5}`},
		{"a wait beyond an hour", &RateLimitedError{Message: "429", RetryAfter: 2 * time.Hour, HasRetryAfter: true},
			`{"t":"back","attempt_id":"m1","reason":"rate_limited","retry_after":3600}`},
		{"a wait before now", &RateLimitedError{Message: "429", RetryAfter: -time.Second, HasRetryAfter: true},
			`{"t":"back","attempt_id":"m1","reason":"rate_limited","retry_after":0}`},
		{"a wait of zero", &RateLimitedError{Message: "429", HasRetryAfter: true},
			`{"t":"back","attempt_id":"m1","reason":"rate_limited","retry_after":0}`},
		{"no wait", &RateLimitedError{Message: "529 overloaded", RetryAfter: time.Minute},
			`{"t":"back","attempt_id":"m1","reason":"rate_limited"}`},
		{"wrapped", fmt.Errorf("provider: %w", &RateLimitedError{Message: "429", RetryAfter: 30 * time.Second, HasRetryAfter: true}),
			`{"t":"back","attempt_id":"m1","reason":"rate_limited","retry_after":30}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			logs := &lockedBuffer{}
			w := limitedWorker(c.err, logs)
			w.handOut(runModelStep("m1", "s1", 0, Item{Type: "user", Text: "hi"}))
			eventually(t, "the model call", func() bool { return w.result("m1") != nil })
			if got := encoded(t, w.result("m1")); got != c.want {
				t.Fatalf("sent %s, want %s", got, c.want)
			}
			if logs.count("action=worker.rate_limited attempt_id=m1 session_id=s1") != 1 {
				t.Fatalf("a rate limit is logged: %s", logs)
			}
		})
	}
}

// A CompactContext Step goes back the same way, and the back is a result as any: kept
// until its ack, sent again after a reconnect.
func TestACompactContextRateLimitedGoesBackAndIsKeptUntilItsAck(t *testing.T) {
	w := limitedWorker(&RateLimitedError{Message: "slow down", RetryAfter: 12 * time.Second, HasRetryAfter: true}, &lockedBuffer{})
	w.welcome(welcomeMessage{Resume: "r1", HeartbeatTimeout: 2})
	w.handOut(step{AttemptID: "c1", SessionID: "s1", StepType: StepCompactContext, Attempt: 1, Agent: "a",
		History: []Item{{Type: "user", Text: "hi"}}})
	eventually(t, "the summary call", func() bool { return w.result("c1") != nil })
	want := `{"t":"back","attempt_id":"c1","reason":"rate_limited","retry_after":12}`
	if got := encoded(t, w.result("c1")); got != want {
		t.Fatalf("sent %s, want %s", got, want)
	}
	w.welcome(welcomeMessage{Resume: "r2", HeartbeatTimeout: 2})
	w.mu.Lock()
	data, _ := w.seed.box.take()
	w.mu.Unlock()
	var resent []json.RawMessage
	if err := json.Unmarshal(data, &resent); err != nil || len(resent) != 1 || string(resent[0]) != want {
		t.Fatalf("the unacked back must be sent again after a reconnect: %s %v", data, err)
	}
	if err := w.handle(context.Background(), []serverMessage{ackMessage{AttemptID: "c1", OK: true}}); err != nil {
		t.Fatal(err)
	}
	if w.result("c1") != nil {
		t.Fatal("an ack settles the back")
	}
}

// A tool that returns the rate-limit error fails its attempt as any error does: its body
// may have run, and handing it back could run a write twice.
func TestAToolRateLimitedFailsItsAttempt(t *testing.T) {
	limited := &RateLimitedError{Message: "the API said 429", RetryAfter: time.Second, HasRetryAfter: true}
	body := func(ctx context.Context, call *ToolContext, args json.RawMessage) (any, error) { return nil, limited }
	logs := &lockedBuffer{}
	w := limitedWorker(limited, logs, Tool{Name: "post", Kind: Write, Func: body})
	tool, call := "post", "c1"
	w.handOut(step{AttemptID: "t1", SessionID: "s1", StepType: StepCallTool, Attempt: 1, Agent: "a", Tool: &tool, CallID: &call})
	eventually(t, "the tool call", func() bool { return w.result("t1") != nil })
	want := `{"t":"fail","attempt_id":"t1","error":{"message":"the API said 429","attempt_progress":"NOT_COMPLETED","retryable":true}}`
	if got := encoded(t, w.result("t1")); got != want {
		t.Fatalf("sent %s, want %s", got, want)
	}
	if logs.count("worker.rate_limited") != 0 {
		t.Fatalf("a tool's error is no rate limit: %s", logs)
	}
}

// The span of a RunModel attempt handed back for a rate limit says so, as the Python
// Worker's records RateLimited: status error, one exception event.
func TestARateLimitedModelsSpanIsAnError(t *testing.T) {
	recorder := recordSpans(t)
	setEnv(t, nil)
	w := NewWorker(WorkerOptions{
		Address: "http://127.0.0.1:1", Tracing: true, Logger: log.New(&lockedBuffer{}, "", 0),
		Agents: []Agent{{Name: "a", Model: limitedModel{&RateLimitedError{Message: "429 too many"}}}},
	})
	w.handOut(runModelStep("m1", "s1", 0, Item{Type: "user", Text: "hi"}))
	span := spanOf(t, recorder, "m1")
	events := span.Events()
	if span.Status() != (sdktrace.Status{Code: codes.Error, Description: "429 too many"}) || len(events) != 1 ||
		eventAttribute(events[0], "exception.message") != "429 too many" {
		t.Fatalf("status %+v, events %v", span.Status(), events)
	}
}
