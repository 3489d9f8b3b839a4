package dex

import (
	"context"
	"encoding/json"
	"errors"
	"log"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

func TestOutboxBatchesAFrameAndJoinsDeltasOfOneAttempt(t *testing.T) {
	var box outbox
	box.add(delta("a", "he"))
	box.add(heartbeat([]string{"b"}, nil))
	box.add(delta("b", "x"))
	box.add(delta("a", "llo"))
	var frame []map[string]any
	data, results := box.take()
	if err := json.Unmarshal(data, &frame); err != nil {
		t.Fatal(err)
	}
	if results {
		t.Fatal("a frame of deltas and a heartbeat carries no result")
	}
	if len(frame) != 3 {
		t.Fatalf("want 3 messages in one frame, got %v", frame)
	}
	if frame[0]["text"] != "hello" || frame[2]["text"] != "x" {
		t.Fatalf("deltas not joined per attempt: %v", frame)
	}
	if data, _ := box.take(); data != nil {
		t.Fatal("an empty outbox gives no frame")
	}
	box.add(delta("a", "again"))
	box.add(doneMessage{T: "done", AttemptID: "a", Result: json.RawMessage(`{}`)})
	data, results = box.take()
	if err := json.Unmarshal(data, &frame); err != nil || frame[0]["text"] != "again" {
		t.Fatalf("a delta after a frame starts anew: %v %v", frame, err)
	}
	if !results {
		t.Fatal("a frame with a done carries a result")
	}
}

func TestDecodeFrameReadsMessagesInOrder(t *testing.T) {
	frame, err := decodeFrame([]byte(`[{"t":"ack","attempt_id":"a","ok":true},{"t":"hb","seq":3,"status":{"a":"stop"}}]`))
	if err != nil {
		t.Fatal(err)
	}
	ack, isAck := frame[0].(ackMessage)
	hb, isHb := frame[1].(heartbeatReplyMessage)
	if !isAck || !ack.OK || !isHb || *hb.Seq != 3 || hb.Status["a"] != "stop" {
		t.Fatalf("unexpected frame: %+v", frame)
	}
	for _, bad := range []string{`{"t":"ack"}`, `[{"ok":true}]`, `not json`} {
		if _, err := decodeFrame([]byte(bad)); err == nil {
			t.Fatalf("%s should not decode", bad)
		}
	}
}

func TestAMessageOfAnUnknownTIsKeptInOrderAndIgnored(t *testing.T) {
	frame, err := decodeFrame([]byte(`[{"t":"later","x":[1]},{"t":"ack","attempt_id":"a","ok":true}]`))
	if err != nil {
		t.Fatal(err)
	}
	if u, ok := frame[0].(unknownMessage); !ok || u.T != "later" {
		t.Fatalf("want the unknown message first, got %+v", frame)
	}
	if err := testWorker().handle(context.Background(), frame); err != nil {
		t.Fatalf("an unknown message is ignored, not an error: %v", err)
	}
}

// TestEveryServerMessageOfTheProtocolPageDecodesIntoItsType reads the "Server → Worker"
// section of docs/worker-protocol.md (generated from src/dex/wire/server_frames.py): a
// heading per message's t, and its JSON schema. Each t there must be one of
// serverMessages, of the type listed here; a sample of the schema, every property set,
// must decode into that type with a field set for each property. A message or a field
// the server starts sending fails here until the Go Worker types it.
func TestEveryServerMessageOfTheProtocolPageDecodesIntoItsType(t *testing.T) {
	types := map[string]reflect.Type{
		"welcome": reflect.TypeOf(welcomeMessage{}),
		"step":    reflect.TypeOf(step{}),
		"hb":      reflect.TypeOf(heartbeatReplyMessage{}),
		"ack":     reflect.TypeOf(ackMessage{}),
		"cancel":  reflect.TypeOf(cancelMessage{}),
		"members": reflect.TypeOf(membersMessage{}),
		"claimed": reflect.TypeOf(claimedMessage{}),
	}
	if len(serverMessages) != len(types) {
		t.Fatalf("serverMessages decodes %d messages, this test knows %d", len(serverMessages), len(types))
	}
	schemas := serverSchemas(t)
	if len(schemas) != len(types) {
		t.Errorf("the page lists %d server messages, the Go Worker types %d", len(schemas), len(types))
	}
	for name, schema := range schemas {
		want, typed := types[name]
		if _, decodes := serverMessages[name]; !typed || !decodes {
			t.Errorf("the page's server message %q has no Go type", name)
			continue
		}
		data, err := json.Marshal([]any{sample(schema, schema, 0)})
		if err != nil {
			t.Fatal(err)
		}
		frame, err := decodeFrame(data)
		if err != nil {
			t.Errorf("%s: a sample does not decode: %v (%s)", name, err, data)
			continue
		}
		got := reflect.ValueOf(frame[0])
		if got.Type() != want {
			t.Errorf("%s decodes into %v, want %v", name, got.Type(), want)
			continue
		}
		properties, _ := schema["properties"].(map[string]any)
		for property := range properties {
			if property == "t" {
				continue
			}
			field, ok := fieldTagged(got, property)
			if !ok {
				t.Errorf("%s: %v has no field for %q", name, want, property)
			} else if field.IsZero() {
				t.Errorf("%s: %q of the sample did not reach %v (%s)", name, property, want, data)
			}
		}
	}
}

// serverSchemas is the JSON schema of each message of the protocol page's
// "Server → Worker" section, by its t.
func serverSchemas(t *testing.T) map[string]map[string]any {
	t.Helper()
	page, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "worker-protocol.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, found := strings.Cut(string(page), "\n## Server → Worker\n")
	if !found {
		t.Fatal(`docs/worker-protocol.md has no "## Server → Worker" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	schemas := map[string]map[string]any{}
	for _, part := range strings.Split(section, "\n### `")[1:] {
		name, rest, _ := strings.Cut(part, "`")
		_, rest, _ = strings.Cut(rest, "```json\n")
		text, _, closed := strings.Cut(rest, "\n```")
		var schema map[string]any
		if !closed || json.Unmarshal([]byte(text), &schema) != nil {
			t.Fatalf("the schema of the server message %q does not read", name)
		}
		schemas[name] = schema
	}
	return schemas
}

// sample is a value of schema with every property set and nothing empty; root holds
// the $defs its references name.
func sample(schema, root map[string]any, depth int) any {
	if depth > 8 {
		return nil
	}
	if c, ok := schema["const"]; ok {
		return c
	}
	if values, ok := schema["enum"].([]any); ok && len(values) > 0 {
		return values[0]
	}
	if ref, ok := schema["$ref"].(string); ok {
		defs, _ := root["$defs"].(map[string]any)
		def, _ := defs[strings.TrimPrefix(ref, "#/$defs/")].(map[string]any)
		return sample(def, root, depth+1)
	}
	for _, key := range []string{"anyOf", "oneOf"} {
		if options, ok := schema[key].([]any); ok && len(options) > 0 {
			option, _ := options[0].(map[string]any) // the first: never null in this page
			return sample(option, root, depth+1)
		}
	}
	switch schema["type"] {
	case "string":
		return "x"
	case "integer":
		return 2
	case "number":
		return 2.5
	case "boolean":
		return true
	case "array":
		items, _ := schema["items"].(map[string]any)
		return []any{sample(items, root, depth+1)}
	}
	object := map[string]any{"any": 1} // an object, or any JSON value
	if properties, ok := schema["properties"].(map[string]any); ok {
		object = map[string]any{}
		for name, property := range properties {
			object[name] = sample(property.(map[string]any), root, depth+1)
		}
	}
	if values, ok := schema["additionalProperties"].(map[string]any); ok {
		object = map[string]any{"a": sample(values, root, depth+1)}
	}
	return object
}

// fieldTagged is v's field whose json name is name.
func fieldTagged(v reflect.Value, name string) (reflect.Value, bool) {
	for i := 0; i < v.NumField(); i++ {
		if tag, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ","); tag == name {
			return v.Field(i), true
		}
	}
	return reflect.Value{}, false
}

func TestBackoffGrowsWithJitterUpToReconnectMax(t *testing.T) {
	w := testWorker() // the defaults: 100ms doubling up to 1s, as the Python Worker
	for n := 1; n < 40; n++ {
		ceiling := 100 * time.Millisecond << uint(n-1)
		if n > 4 {
			ceiling = time.Second
		}
		for i := 0; i < 50; i++ {
			if d := w.backoff(n); d <= 0 || d > ceiling {
				t.Fatalf("backoff(%d) = %v, want within (0, %v]", n, d, ceiling)
			}
		}
	}
}

// logged signals once a log line naming action is written.
type logged struct {
	action string
	seen   chan struct{}
	once   sync.Once
}

func (l *logged) Write(p []byte) (int, error) {
	if strings.Contains(string(p), l.action) {
		l.once.Do(func() { close(l.seen) })
	}
	return len(p), nil
}

func TestRunStopsDuringTheBackoffWhenItsContextEnds(t *testing.T) {
	failed := &logged{action: "worker.connect_failed", seen: make(chan struct{})}
	w := NewWorker(WorkerOptions{
		Address: "http://127.0.0.1:1", Agents: []Agent{{Name: "a", Model: echoModel{}}},
		ReconnectInitial: time.Minute, ReconnectMax: time.Minute, Logger: log.New(failed, "", 0),
	})
	stop := runInBackground(w)
	select { // nothing listens on port 1: once the try failed, Run waits in its backoff
	case <-failed.seen:
	case <-time.After(5 * time.Second):
		_ = stop(5 * time.Second)
		t.Fatal("the Worker never reported its failed connection")
	}
	if err := stop(5 * time.Second); err != nil {
		t.Fatalf("Run must return during its backoff once its context ends: %v", err)
	}
}

type echoModel struct{}

func (echoModel) Spec() map[string]any { return map[string]any{"provider": "echo"} }

func (echoModel) Stream(ctx context.Context, req ModelRequest, emit func(string)) (ModelResponse, error) {
	return ModelResponse{Text: "echo"}, nil
}

func (echoModel) Summarize(ctx context.Context, req ModelRequest) (Summary, error) {
	return Summary{Text: "summary"}, nil
}

func testWorker() *Worker {
	return NewWorker(WorkerOptions{Address: "http://127.0.0.1:1", Agents: []Agent{{Name: "a", Model: echoModel{}}}})
}

func TestHelloAfterReconnectNamesUnsettledAttemptsAndResumeToken(t *testing.T) {
	w := testWorker()
	w.welcome(welcomeMessage{Resume: "r1", HeartbeatTimeout: 2})
	w.running["run"] = &attempt{step: step{AttemptID: "run"}, cancel: func() {}}
	w.results["done"] = doneMessage{T: "done", AttemptID: "done", Result: json.RawMessage(`{}`)}
	var frame []hello
	if err := json.Unmarshal(w.helloFrame(), &frame); err != nil {
		t.Fatal(err)
	}
	h := frame[0]
	if h.Resume == nil || *h.Resume != "r1" || len(h.Attempts) != 2 || w.timeout != 2*time.Second {
		t.Fatalf("unexpected hello: %+v", h)
	}
	// The next welcome stops one attempt and re-sends the unacked result.
	w.welcome(welcomeMessage{Resume: "r2", HeartbeatTimeout: 2, Stop: []string{"run"}})
	if _, ok := w.running["run"]; ok {
		t.Fatal("welcome.stop must stop the attempt")
	}
	var resent []map[string]any
	data, _ := w.seed.box.take()
	if err := json.Unmarshal(data, &resent); err != nil || len(resent) != 1 || resent[0]["attempt_id"] != "done" {
		t.Fatalf("the unacked result must be sent again: %v %v", resent, err)
	}
	if err := w.handle(context.Background(), []serverMessage{ackMessage{AttemptID: "done", OK: true}}); err != nil {
		t.Fatal(err)
	}
	if len(w.results) != 0 {
		t.Fatal("an ack settles the result")
	}
}

func TestStartAcknowledgementNeedsTheSameSeqInTime(t *testing.T) {
	w := testWorker()
	w.timeout = time.Second
	start := make(chan bool, 1)
	a := &attempt{step: step{AttemptID: "x"}, cancel: func() {}, start: start}
	w.running["x"] = a
	w.askStartLocked(a)
	other := a.startSeq + 1
	w.heartbeatReply(w.seed, heartbeatReplyMessage{Seq: &other, Status: map[string]string{"x": "ok"}})
	if len(start) != 0 {
		t.Fatal("an ok with another seq does not count")
	}
	a.startAt = time.Now().Add(-time.Second)
	seq := a.startSeq
	w.heartbeatReply(w.seed, heartbeatReplyMessage{Seq: &seq, Status: map[string]string{"x": "ok"}})
	if len(start) != 0 {
		t.Fatal("an ok later than half the heartbeat timeout does not count")
	}
	a.startAt = time.Now()
	w.heartbeatReply(w.seed, heartbeatReplyMessage{Seq: &seq, Status: map[string]string{"x": "ok"}})
	if !<-start {
		t.Fatal("an ok in time with the same seq starts the tool")
	}
}

func TestCloseCodesThatRetryingCannotFixAreRefusals(t *testing.T) {
	for code, refused := range map[int]bool{4400: true, 4401: true, 4409: true, 4503: false, 1006: false} {
		err := closeError(&websocket.CloseError{Code: code})
		if got := errors.Is(err, ErrRefused); got != refused {
			t.Fatalf("close %d: refused %v, want %v", code, got, refused)
		}
	}
}

// The messages a Worker writes carry the fields of docs/worker-protocol.md, and leave
// out an hb's seq and a back's reason and retry_after when they have none.
func TestWorkerMessagesEncodeAsTheProtocolNamesThem(t *testing.T) {
	seq := int64(7)
	s := step{AttemptID: "a"}
	for _, c := range []struct {
		m    message
		want string
	}{
		{drain(), `{"t":"drain"}`},
		{heartbeat([]string{}, nil), `{"t":"hb","attempts":[]}`},
		{heartbeat([]string{"a"}, &seq), `{"t":"hb","attempts":["a"],"seq":7}`},
		{delta("a", "hi"), `{"t":"delta","attempt_id":"a","text":"hi"}`},
		{done(s, Summary{Text: "s"}), `{"t":"done","attempt_id":"a","result":{"text":"s","usage":{"input_tokens":0,"output_tokens":0}}}`},
		{failed(s, "boom", false), `{"t":"fail","attempt_id":"a","error":{"message":"boom","attempt_progress":"NOT_COMPLETED","retryable":false}}`},
		{handBack("a", ""), `{"t":"back","attempt_id":"a"}`},
		{handBack("a", "history"), `{"t":"back","attempt_id":"a","reason":"history"}`},
		{rateLimited("a", &RateLimitedError{Message: "429", RetryAfter: 2 * time.Second, HasRetryAfter: true}),
			`{"t":"back","attempt_id":"a","reason":"rate_limited","retry_after":2}`},
		{rateLimited("a", &RateLimitedError{Message: "529"}), `{"t":"back","attempt_id":"a","reason":"rate_limited"}`},
	} {
		data, err := json.Marshal(c.m)
		if err != nil || string(data) != c.want {
			t.Fatalf("%T encodes as %s (%v), want %s", c.m, data, err, c.want)
		}
	}
}
