package dex

import (
	"context"
	"encoding/json"
	"errors"
	"log"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

const (
	testTraceID     = "0af7651916cd43dd8448eb211c80319c"
	testParentID    = "b7ad6b7169203331"
	testTraceparent = "00-" + testTraceID + "-" + testParentID + "-01"
)

// recordSpans makes a recorder the global tracer provider's, as a program sets its own.
func recordSpans(t *testing.T) *tracetest.SpanRecorder {
	t.Helper()
	recorder := tracetest.NewSpanRecorder()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	otel.SetTracerProvider(provider)
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	return recorder
}

// spanOf is the ended span of attempt id.
func spanOf(t *testing.T, recorder *tracetest.SpanRecorder, id string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found sdktrace.ReadOnlySpan
	eventually(t, "the span of attempt "+id, func() bool {
		for _, span := range recorder.Ended() {
			if attributesOf(span)["dex.attempt_id"] == id {
				found = span
				return true
			}
		}
		return false
	})
	return found
}

func attributesOf(span sdktrace.ReadOnlySpan) map[string]any {
	values := map[string]any{}
	for _, kv := range span.Attributes() {
		values[string(kv.Key)] = kv.Value.AsInterface()
	}
	return values
}

// modelSpec is a model with a name, for the gen_ai attributes.
type modelSpec struct{ viewModel }

func (modelSpec) Spec() map[string]any { return map[string]any{"provider": "scripted", "name": "m-1"} }

func tracedWorker(t *testing.T, tracing bool, tools ...Tool) *Worker {
	t.Helper()
	setEnv(t, nil)
	return NewWorker(WorkerOptions{
		Address: "http://127.0.0.1:1", WorkerID: "w-1", Tracing: tracing, Logger: log.New(&lockedBuffer{}, "", 0),
		Agents: []Agent{{Name: "a", Model: modelSpec{}, Tools: tools}},
	})
}

func callStep(id, tool, traceparent string) step {
	call := "c-" + id
	s := step{AttemptID: id, SessionID: "s1", StepID: "step-" + id, StepType: StepCallTool, Attempt: 2, Agent: "a", Tool: &tool, CallID: &call}
	if traceparent != "" {
		s.Traceparent = &traceparent
	}
	return s
}

func TestAToolsAttemptIsASpanUnderTheHandOutsTraceparentWithTheToolsOwnInside(t *testing.T) {
	recorder := recordSpans(t)
	w := tracedWorker(t, true, Tool{Name: "lookup", Kind: Read, Func: lookupWithASpan})
	w.handOut(callStep("t1", "lookup", testTraceparent))
	span := spanOf(t, recorder, "t1")
	if span.Name() != "dex.tool lookup" || span.SpanKind() != trace.SpanKindConsumer || span.InstrumentationLibrary().Name != "dex.worker" {
		t.Fatalf("name %q, kind %v, scope %q", span.Name(), span.SpanKind(), span.InstrumentationLibrary().Name)
	}
	if span.SpanContext().TraceID().String() != testTraceID || span.Parent().SpanID().String() != testParentID || !span.Parent().IsRemote() {
		t.Fatalf("the span must be the remote traceparent's child: trace %s, parent %s", span.SpanContext().TraceID(), span.Parent().SpanID())
	}
	want := map[string]any{
		"dex.session_id": "s1", "dex.step_id": "step-t1", "dex.step_type": "CallTool", "dex.attempt_id": "t1",
		"dex.attempt": int64(2), "dex.agent": "a", "dex.worker_id": "w-1", "dex.tool": "lookup", "dex.call_id": "c-t1",
	}
	if got := attributesOf(span); len(got) != len(want) || !mapsEqual(got, want) {
		t.Fatalf("attributes %v, want %v", got, want)
	}
	if span.Status().Code != codes.Unset {
		t.Fatalf("a call that succeeded has no status: %+v", span.Status())
	}
	var own []sdktrace.ReadOnlySpan
	for _, s := range recorder.Ended() {
		if s.Name() == "query the table" {
			own = append(own, s)
		}
	}
	if len(own) != 1 || own[0].Parent().SpanID() != span.SpanContext().SpanID() {
		t.Fatalf("the tool's own span must nest under the attempt's: %v", own)
	}
}

func TestAModelsAttemptNamesTheModelAndAMalformedTraceparentStartsATrace(t *testing.T) {
	recorder := recordSpans(t)
	w := tracedWorker(t, true)
	s := runModelStep("m1", "s1", 0, Item{Type: "user", Text: "hi"})
	malformed := testTraceparent + "-extra" // version 00 has four fields
	s.Traceparent = &malformed
	w.handOut(s)
	span := spanOf(t, recorder, "m1")
	got := attributesOf(span)
	if span.Name() != "dex.model a" || got["gen_ai.system"] != "scripted" || got["gen_ai.request.model"] != "m-1" || got["dex.tool"] != nil {
		t.Fatalf("name %q, attributes %v", span.Name(), got)
	}
	if span.Parent().IsValid() || span.SpanContext().TraceID().String() == testTraceID {
		t.Fatalf("a malformed traceparent must start a new trace: parent %v", span.Parent())
	}
}

func TestAToolErrorAFailureOrAPanicSetsTheStatusToError(t *testing.T) {
	recorder := recordSpans(t)
	refuse := func(ctx context.Context, call *ToolContext, args json.RawMessage) (any, error) {
		return nil, &ToolError{Message: "no such key"}
	}
	crash := func(ctx context.Context, call *ToolContext, args json.RawMessage) (any, error) {
		return nil, errors.New("boom")
	}
	panics := func(ctx context.Context, call *ToolContext, args json.RawMessage) (any, error) { panic("bang") }
	w := tracedWorker(t, true,
		Tool{Name: "refuse", Kind: Read, Func: refuse}, Tool{Name: "crash", Kind: Read, Func: crash},
		Tool{Name: "panics", Kind: Read, Func: panics})
	for id, tool := range map[string]string{"t1": "refuse", "t2": "crash", "t3": "panics"} {
		w.handOut(callStep(id, tool, testTraceparent))
	}
	refused := spanOf(t, recorder, "t1")
	if refused.Status() != (sdktrace.Status{Code: codes.Error, Description: "no such key"}) || len(refused.Events()) != 0 {
		t.Fatalf("a ToolError: status %+v, events %v", refused.Status(), refused.Events())
	}
	for id, description := range map[string]string{"t2": "boom", "t3": "panic: bang"} {
		span := spanOf(t, recorder, id)
		events := span.Events()
		if span.Status() != (sdktrace.Status{Code: codes.Error, Description: description}) || len(events) != 1 || events[0].Name != "exception" {
			t.Fatalf("%s: status %+v, events %v", id, span.Status(), events)
		}
		if message := eventAttribute(events[0], "exception.message"); message != description {
			t.Fatalf("%s: the exception event says %q", id, message)
		}
	}
}

func eventAttribute(event sdktrace.Event, key attribute.Key) string {
	for _, kv := range event.Attributes {
		if kv.Key == key {
			return kv.Value.AsString()
		}
	}
	return ""
}

func TestAQuestionPausesTheSpanAndACancellationMarksItNeitherAnError(t *testing.T) {
	recorder := recordSpans(t)
	ask := func(ctx context.Context, call *ToolContext, args json.RawMessage) (any, error) {
		return call.Ask("which one?")
	}
	entered, release := make(chan struct{}), make(chan struct{})
	hold := func(ctx context.Context, call *ToolContext, args json.RawMessage) (any, error) {
		close(entered)
		<-release // deaf to ctx: its span ends when it returns
		return "held", nil
	}
	w := tracedWorker(t, true, Tool{Name: "ask", Kind: Read, Func: ask}, Tool{Name: "hold", Kind: Read, Func: hold})
	w.handOut(callStep("t1", "ask", testTraceparent))
	asked := spanOf(t, recorder, "t1")
	if attributesOf(asked)["dex.paused"] != true || asked.Status().Code != codes.Unset {
		t.Fatalf("a question: attributes %v, status %+v", attributesOf(asked), asked.Status())
	}
	w.handOut(callStep("t2", "hold", testTraceparent))
	<-entered
	w.mu.Lock()
	w.abandonLocked("t2", "cancelled by the server")
	w.mu.Unlock()
	close(release)
	cancelled := spanOf(t, recorder, "t2")
	if attributesOf(cancelled)["dex.cancelled"] != true || cancelled.Status().Code != codes.Unset {
		t.Fatalf("a cancellation: attributes %v, status %+v", attributesOf(cancelled), cancelled.Status())
	}
}

func TestAWorkerWithTracingOffMakesNoSpansAndTheToolsOwnAreRoots(t *testing.T) {
	recorder := recordSpans(t)
	w := tracedWorker(t, false, Tool{Name: "lookup", Kind: Read, Func: lookupWithASpan})
	w.handOut(callStep("t1", "lookup", testTraceparent))
	eventually(t, "the call's result", func() bool { return w.result("t1") != nil })
	ended := recorder.Ended()
	if len(ended) != 1 || ended[0].Name() != "query the table" || ended[0].Parent().IsValid() {
		t.Fatalf("only the tool's own span, a root: %v", ended)
	}
}

func mapsEqual(a, b map[string]any) bool {
	for k, v := range b {
		if a[k] != v {
			return false
		}
	}
	return len(a) == len(b)
}

// lookupWithASpan is a tool whose code makes a span of its own ("query the table") in
// the ctx it gets.
func lookupWithASpan(ctx context.Context, call *ToolContext, args json.RawMessage) (any, error) {
	_, span := otel.Tracer("user code").Start(ctx, "query the table")
	span.End()
	return "value", nil
}
