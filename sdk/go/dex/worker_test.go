package dex

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"
)

// eventually waits for cond, up to a deadline.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// runInBackground runs w until stop, which ends Run's context and waits up to within for
// Run to return: it answers Run's error, or one saying that Run did not return in time.
func runInBackground(w *Worker) (stop func(within time.Duration) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	return func(within time.Duration) error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(within):
			return fmt.Errorf("Run did not return within %v of its context's end", within)
		}
	}
}

// result is the message the Worker keeps for an attempt until its ack (nil: none yet).
func (w *Worker) result(id string) message {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.results[id]
}

// lockedBuffer is a log sink the Worker's goroutines may write to while a test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *lockedBuffer) count(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Count(b.buf.String(), s)
}

// viewModel answers with the texts of the history it was asked with, and can be told
// which tool calls to ask for.
type viewModel struct{ calls []ModelToolCall }

func (viewModel) Spec() map[string]any { return map[string]any{"provider": "view"} }

func (m viewModel) Stream(ctx context.Context, req ModelRequest, emit func(string)) (ModelResponse, error) {
	return ModelResponse{Text: strings.Join(texts(req.History), "|"), ToolCalls: m.calls}, nil
}

func (viewModel) Summarize(ctx context.Context, req ModelRequest) (Summary, error) {
	return Summary{Text: strings.Join(texts(req.History), "|")}, nil
}

func modelText(t *testing.T, m message) string {
	t.Helper()
	return modelResponse(t, m).Text
}

func runModelStep(id, session string, base int, items ...Item) step {
	return step{AttemptID: id, SessionID: session, StepType: StepRunModel, Attempt: 1, Agent: "a", HistoryBase: base, History: items}
}

func TestRunModelHandOutsBuildOnTheHistoryTheWorkerKeeps(t *testing.T) {
	w := NewWorker(WorkerOptions{Address: "http://127.0.0.1:1", Agents: []Agent{{Name: "a", Model: viewModel{}}}})
	var hellos []hello
	if err := json.Unmarshal(w.helloFrame(), &hellos); err != nil || hellos[0].HistoryCache != historySessions {
		t.Fatalf("hello must announce the history cache: %+v %v", hellos, err)
	}
	w.handOut(runModelStep("m1", "s1", 0, Item{Type: "user", Text: "one"}))
	eventually(t, "the first model call", func() bool { return w.result("m1") != nil })
	w.handOut(runModelStep("m2", "s1", 1, Item{Type: "assistant", Text: "reply"}, Item{Type: "user", Text: "two"}))
	eventually(t, "the second model call", func() bool { return w.result("m2") != nil })
	if got := modelText(t, w.result("m2")); got != "user:one|assistant:reply|user:two" {
		t.Fatalf("the model must see the kept item then the delta, saw %q", got)
	}

	// a delta on a view this Worker does not hold goes back, never runs on a guess
	w.handOut(runModelStep("m3", "s2", 4, Item{Type: "user", Text: "five"}))
	if back := w.result("m3"); back != handBack("m3", "history") {
		t.Fatalf("want back with reason history, got %v", back)
	}
	// after a reconnect the server sends whole views first: nothing kept is built on
	w.welcome(welcomeMessage{Resume: "r"})
	w.handOut(runModelStep("m4", "s1", 3, Item{Type: "user", Text: "three"}))
	if r := w.result("m4"); r != handBack("m4", "history") {
		t.Fatalf("a new connection holds no views: %v", r)
	}
	w.handOut(runModelStep("m5", "s1", 0, Item{Type: "robot"}))
	if r, ok := w.result("m5").(failMessage); !ok || r.Error.Retryable || !strings.Contains(r.Error.Message, "history item 0") {
		t.Fatalf("a history item that does not fit fails the attempt for good: %v", r)
	}
}

func TestAttemptsNeverRunBeyondTheCapacity(t *testing.T) {
	var mu sync.Mutex
	runningNow, most := 0, 0
	release := make(chan struct{})
	body := func(ctx context.Context, call *ToolContext, args json.RawMessage) (any, error) {
		mu.Lock()
		runningNow++
		if runningNow > most {
			most = runningNow
		}
		mu.Unlock()
		<-release // ignores ctx: a stopped attempt's code may run on
		mu.Lock()
		runningNow--
		mu.Unlock()
		return "ok", nil
	}
	logs := &lockedBuffer{}
	w := NewWorker(WorkerOptions{
		Address: "http://127.0.0.1:1", Capacity: 2, Logger: log.New(logs, "", 0),
		Agents: []Agent{{Name: "a", Model: viewModel{}, Tools: []Tool{{Name: "block", Kind: Read, Func: body}}}},
	})
	tool := "block"
	call := func(id string) step {
		return step{AttemptID: id, SessionID: "s", StepType: StepCallTool, Attempt: 1, Agent: "a", Tool: &tool, CallID: &id}
	}
	started := func() int {
		mu.Lock()
		defer mu.Unlock()
		return runningNow
	}
	for _, id := range []string{"t1", "t2", "t3"} {
		w.handOut(call(id))
	}
	eventually(t, "two bodies running", func() bool { return started() == 2 })
	// a Step beyond the capacity (in a cluster, another node's took it) goes back at once
	if back, ok := w.result("t3").(backMessage); !ok || back.Reason != "" {
		t.Fatalf("t3 must be handed back, got %#v", w.result("t3"))
	}
	// the server stops t1: its code runs on, so its slot stays taken
	w.mu.Lock()
	w.abandonLocked("t1", "the server no longer runs this attempt")
	w.mu.Unlock()
	w.handOut(call("t4"))
	eventually(t, "t4 waits for t1's slot", func() bool { return logs.count("action=worker.at_capacity") == 1 })
	close(release)
	eventually(t, "every attempt kept ran", func() bool {
		_, done := w.result("t4").(doneMessage)
		return w.result("t2") != nil && done
	})
	if most != 2 {
		t.Fatalf("at most 2 bodies may run at once, %d did", most)
	}
	if w.result("t1") != nil {
		t.Fatal("a stopped attempt's result is dropped")
	}
}

func TestApprovalIsNeverAlwaysOrDecidedPerCall(t *testing.T) {
	noop := func(ctx context.Context, call *ToolContext, args json.RawMessage) (any, error) { return nil, nil }
	big := func(args json.RawMessage) (bool, error) {
		var a struct{ Amount int }
		if err := json.Unmarshal(args, &a); err != nil {
			return false, err
		}
		return a.Amount > 100, nil
	}
	broken := func(args json.RawMessage) (bool, error) { return false, errors.New("cannot tell") }
	panics := func(args json.RawMessage) (bool, error) { panic("boom") }
	tools := []Tool{
		{Name: "read", Kind: Read, Func: noop},
		{Name: "always", Kind: Write, Func: noop, Approval: true},
		{Name: "pay", Kind: Write, Func: noop, NeedsApproval: big},
		{Name: "broken", Kind: Write, Func: noop, NeedsApproval: broken},
		{Name: "panics", Kind: Write, Func: noop, NeedsApproval: panics},
	}
	calls := []ModelToolCall{
		{ID: "c1", Name: "read", Arguments: map[string]any{}},
		{ID: "c2", Name: "pay", Arguments: map[string]any{"amount": 5}},
		{ID: "c3", Name: "pay", Arguments: map[string]any{"amount": 500}},
		{ID: "c4", Name: "broken"},
		{ID: "c5", Name: "panics"},
		{ID: "c6", Name: "always"}, // the server asks for these itself, from the spec
	}
	agent := Agent{Name: "a", Model: viewModel{calls: calls}, Tools: tools}
	approvals := map[string]string{}
	for _, tool := range agent.spec().Tools {
		approvals[tool.Name] = tool.Approval
	}
	want := map[string]string{"read": "never", "always": "always", "pay": "predicate", "broken": "predicate", "panics": "predicate"}
	if !equalMaps(approvals, want) {
		t.Fatalf("hello.agents approvals: %v, want %v", approvals, want)
	}
	w := NewWorker(WorkerOptions{Address: "http://127.0.0.1:1", Agents: []Agent{agent}})
	w.handOut(runModelStep("m", "s", 0, Item{Type: "user", Text: "pay"}))
	eventually(t, "the model call", func() bool { return w.result("m") != nil })
	var r ModelResponse
	if err := json.Unmarshal(w.result("m").(doneMessage).Result, &r); err != nil {
		t.Fatal(err)
	}
	if strings.Join(r.ApprovalRequired, ",") != "c3,c4,c5" {
		t.Fatalf("approval_required lists the calls a predicate (or its failure) asks for: %v", r.ApprovalRequired)
	}
	both := Agent{Name: "b", Model: viewModel{}, Tools: []Tool{{Name: "x", Kind: Read, Func: noop, Approval: true, NeedsApproval: big}}}
	if err := both.validate(); err == nil || !strings.Contains(err.Error(), "not both") {
		t.Fatalf("Approval and NeedsApproval together are refused: %v", err)
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestAResultWithAnIntegerBeyond64BitsFailsItsAttemptInsteadOfTheConnection(t *testing.T) {
	s := step{AttemptID: "s1/1.2/1"}
	huge, _ := new(big.Int).SetString("18446744073709551616", 10) // 2^64
	for _, result := range []any{huge, map[string]any{"ids": []any{1, json.Number("-9223372036854775809")}}} {
		m, ok := done(s, result).(failMessage)
		if !ok {
			t.Fatalf("%v: want a fail, got %v", result, done(s, result))
		}
		e := m.Error
		if !e.Retryable || !strings.Contains(e.Message, "beyond what the protocol carries") {
			t.Fatalf("%v: %+v", result, e)
		}
	}
	// the ends of the range, long digits in a string, and floats go as they are
	for _, result := range []any{
		uint64(18446744073709551615), int64(-9223372036854775808),
		"123456789012345678901234567890", 1e300, json.Number("12345678901234567890.5"),
	} {
		if m, ok := done(s, result).(doneMessage); !ok {
			t.Fatalf("%v: want a done, got %v", result, m)
		}
	}
}

// A tool's concurrency key reaches the server in the hello, with its limit (1 by default),
// and a tool without one sends neither.
func TestConcurrencyKeyInTheToolSpec(t *testing.T) {
	noop := func(ctx context.Context, call *ToolContext, args json.RawMessage) (any, error) { return nil, nil }
	key := "{customer}"
	agent := Agent{Name: "a", Model: viewModel{}, Tools: []Tool{
		{Name: "book", Kind: Write, Func: noop, ConcurrencyKey: &key},
		{Name: "deploy", Kind: Write, Func: noop, ConcurrencyKey: &key, ConcurrencyLimit: 3},
		{Name: "read", Kind: Read, Func: noop},
	}}
	raw, err := json.Marshal(agent.spec().Tools)
	if err != nil {
		t.Fatal(err)
	}
	var got []map[string]any
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	if got[0]["concurrency_key"] != key || got[0]["concurrency_limit"] != 1.0 {
		t.Fatalf("book: %v", got[0])
	}
	if got[1]["concurrency_limit"] != 3.0 {
		t.Fatalf("deploy: %v", got[1])
	}
	if _, ok := got[2]["concurrency_key"]; ok {
		t.Fatalf("read: %v", got[2])
	}
}

func TestAnAgentsOnBusyIsInItsSpecUnlessTheDefault(t *testing.T) {
	for onBusy, want := range map[string]string{"steer": `"on_busy":"steer"`, "enqueue": "", "": ""} {
		agent := Agent{Name: "a", Model: viewModel{}, OnBusy: onBusy}
		raw, err := json.Marshal(agent.spec())
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(string(raw), "on_busy"); got != (want != "") || (want != "" && !strings.Contains(string(raw), want)) {
			t.Fatalf("OnBusy %q: %s", onBusy, raw)
		}
	}
}
