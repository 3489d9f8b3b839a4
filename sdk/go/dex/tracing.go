package dex

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// The Worker's OpenTelemetry spans, as the Python Worker's: one per attempt it runs,
// under the attempt's span on the server (the hand-out's traceparent), carried by the
// ctx the model or tool gets so that spans the user's code makes nest under it. Only
// the API is used: spans go to the global tracer provider (otel.SetTracerProvider), a
// no-op until the program sets one.

// tracerName is the instrumentation scope of the spans, the Python Worker's.
// The global provider's tracer: with none set yet, a no-op one that uses the program's
// provider once it sets one.
const tracerName = "dex.worker"

// startSpan starts the span of one attempt, named for what runs: "dex.model AGENT",
// "dex.compact AGENT" or "dex.tool TOOL", and returns ctx carrying it.
func (w *Worker) startSpan(ctx context.Context, agent *Agent, s step) (context.Context, trace.Span) {
	attributes := []attribute.KeyValue{
		attribute.String("dex.session_id", s.SessionID),
		attribute.String("dex.step_id", s.StepID),
		attribute.String("dex.step_type", string(s.StepType)),
		attribute.String("dex.attempt_id", s.AttemptID),
		attribute.Int("dex.attempt", s.Attempt),
		attribute.String("dex.agent", s.Agent),
		attribute.String("dex.worker_id", w.opts.WorkerID),
	}
	var name string
	switch s.StepType {
	case StepRunModel:
		name = "dex.model " + s.Agent
		spec := agent.Model.Spec()
		attributes = append(attributes,
			attribute.String("gen_ai.system", specText(spec, "provider")),
			attribute.String("gen_ai.request.model", specText(spec, "name")))
	case StepCompactContext:
		name = "dex.compact " + s.Agent
	default:
		name = "dex.tool " + deref(s.Tool)
		attributes = append(attributes,
			attribute.String("dex.tool", deref(s.Tool)), attribute.String("dex.call_id", deref(s.CallID)))
	}
	if s.Traceparent != nil && *s.Traceparent != "" {
		ctx = withRemoteParent(ctx, *s.Traceparent)
	}
	return w.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attributes...))
}

// traceparentFormat is W3C Trace Context's: version-traceid-parentid-flags, to which a
// later version may add fields.
var traceparentFormat = regexp.MustCompile(`^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$`)

// withRemoteParent is ctx carrying the remote parent a traceparent names, or ctx as it
// is (a new trace) when the traceparent does not fit the format, as the Python Worker's
// propagator reads it (stricter than this OpenTelemetry's: version 00 has four fields).
func withRemoteParent(ctx context.Context, traceparent string) context.Context {
	m := traceparentFormat.FindStringSubmatch(strings.TrimSpace(traceparent))
	if m == nil || m[1] == "ff" || (m[1] == "00" && m[5] != "") {
		return ctx
	}
	traceID, err := trace.TraceIDFromHex(m[2])
	if err != nil {
		return ctx // all zeros
	}
	spanID, err := trace.SpanIDFromHex(m[3])
	if err != nil {
		return ctx
	}
	flags, _ := strconv.ParseUint(m[4], 16, 8) // two hex digits: it parses
	parent := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: traceID, SpanID: spanID, TraceFlags: trace.TraceFlags(flags), Remote: true,
	})
	return trace.ContextWithRemoteSpanContext(ctx, parent)
}

// specText is a model spec's field as text ("" when it has none), as the Python Worker
// records it.
func specText(spec map[string]any, key string) string {
	value, ok := spec[key]
	if !ok || value == nil {
		return ""
	}
	return fmt.Sprint(value)
}

// endSpan ends an attempt's span with how it ended: a failed attempt, a model's rate
// limit (handed back), or a tool's known failure (a ToolError), sets the status to error,
// the first two recorded as an exception event; a pause (Ask, Sleep) sets dex.paused, and an attempt the server stopped or
// cancelled meanwhile (its ctx done) dex.cancelled.
func endSpan(ctx context.Context, span trace.Span, s step, result message) {
	defer span.End()
	if ctx.Err() != nil {
		span.SetAttributes(attribute.Bool("dex.cancelled", true))
		return
	}
	switch result := result.(type) {
	case failMessage:
		span.RecordError(errors.New(result.Error.Message))
		span.SetStatus(codes.Error, result.Error.Message)
	case backMessage:
		if result.Reason == "rate_limited" { // as the Python Worker's span of RateLimited
			span.RecordError(errors.New(result.why))
			span.SetStatus(codes.Error, result.why)
		}
	case doneMessage:
		if s.StepType == StepRunModel || s.StepType == StepCompactContext {
			return
		}
		raw := result.Result
		var outcome struct {
			Status string  `json:"status"`
			Error  *string `json:"error"`
		}
		if json.Unmarshal(raw, &outcome) != nil {
			return
		}
		switch {
		case outcome.Status == "asked" || outcome.Status == "sleep":
			span.SetAttributes(attribute.Bool("dex.paused", true)) // asked a question, or sleeps
		case outcome.Error != nil: // failed, or a check that failed
			span.SetStatus(codes.Error, *outcome.Error)
		}
	}
}
