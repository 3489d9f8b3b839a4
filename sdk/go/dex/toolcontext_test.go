package dex

import (
	"context"
	"encoding/json"
	"errors"
	"log"
	"sync"
	"testing"
	"time"
)

// What a tool's context does on the wire, against a fake node: call.Heartbeat sends an
// hb of its attempt alone, and a cancel from the node cancels the attempt's ctx, after
// which the Worker sends nothing more for it, even when the tool returns a value.

// contextWorker is a Worker on node's URL, beating every 50 ms, with the tools "beat"
// (calls call.Heartbeat, then waits for beaten), "obey" (waits for its ctx to be done,
// tells stopped why, and returns a value all the same) and "hold" (waits for released).
type contextWorker struct {
	*Worker
	beaten, released chan struct{}
	stopped          chan error
	once             sync.Once
}

// release lets "hold" return (at the latest when the test ends).
func (c *contextWorker) release() { c.once.Do(func() { close(c.released) }) }

func newContextWorker(t *testing.T, node *clusterNode) *contextWorker {
	t.Helper()
	setEnv(t, nil)
	c := &contextWorker{beaten: make(chan struct{}), released: make(chan struct{}), stopped: make(chan error, 1)}
	read := func(name string, body func(ctx context.Context, call *ToolContext) (any, error)) Tool {
		return Tool{Name: name, Kind: Read, Func: func(ctx context.Context, call *ToolContext, _ json.RawMessage) (any, error) {
			return body(ctx, call)
		}}
	}
	beat := read("beat", func(ctx context.Context, call *ToolContext) (any, error) {
		call.Heartbeat()
		<-c.beaten
		return "beat", nil
	})
	obey := read("obey", func(ctx context.Context, call *ToolContext) (any, error) {
		<-ctx.Done()
		c.stopped <- ctx.Err()
		return "finished anyway", nil // dropped: the attempt was cancelled
	})
	hold := read("hold", func(ctx context.Context, call *ToolContext) (any, error) {
		<-c.released
		return "held", nil
	})
	c.Worker = NewWorker(WorkerOptions{
		Address: node.URL, Logger: log.New(&lockedBuffer{}, "", 0), HeartbeatInterval: 50 * time.Millisecond,
		Agents: []Agent{{Name: "a", Model: viewModel{}, Tools: []Tool{beat, obey, hold}}},
	})
	stop := runInBackground(c.Worker)
	t.Cleanup(func() {
		c.release()
		if err := stop(5 * time.Second); err != nil {
			t.Errorf("the Worker did not stop cleanly: %v", err)
		}
	})
	eventually(t, "the hello", func() bool { return len(node.messages("hello")) == 1 })
	return c
}

// call is the hand-out of attempt id, a call of tool.
func call(id, tool string) map[string]any {
	m := callMessage(id)
	m["tool"] = tool
	return m
}

func TestAToolsHeartbeatSendsAnHbOfItsAttemptAlone(t *testing.T) {
	node := newClusterNode(t)
	w := newContextWorker(t, node)
	node.send(call("b1", "beat"))
	own := func() bool {
		for _, m := range node.messages("hb") {
			if ids, _ := m["attempts"].([]any); m["seq"] == nil && len(ids) == 1 && ids[0] == "b1" {
				return true
			}
		}
		return false
	}
	// the Worker's own beats carry a seq: one without is the tool's
	eventually(t, "the tool's heartbeat, while it runs", own)
	if !w.runs("b1") || node.names("done", "b1") {
		t.Fatal("the tool's heartbeat came after its result")
	}
	close(w.beaten)
	eventually(t, "b1 done", func() bool { return node.names("done", "b1") })
}

func TestACancelledAttemptsContextIsDoneAndNothingMoreIsSentForIt(t *testing.T) {
	node := newClusterNode(t)
	w := newContextWorker(t, node)
	node.send(call("c1", "obey"), call("h1", "hold"))
	eventually(t, "a beat of both", func() bool { return node.names("hb", "c1") && node.names("hb", "h1") })

	from := node.frameCount()
	node.send(map[string]any{"t": "cancel", "attempt_id": "c1"})
	select {
	case err := <-w.stopped:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the cancelled tool's ctx ended with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the cancelled tool's ctx was never done")
	}
	// the Worker beats on for h1 (every 50 ms), leaving c1 out
	eventually(t, "three more beats of h1", func() bool {
		beats := 0
		for _, f := range node.framesSince(from) {
			for _, m := range f.messages {
				if ids, _ := m["attempts"].([]any); m["t"] == "hb" && len(ids) > 0 && ids[0] == "h1" {
					beats++
				}
			}
		}
		return beats >= 3
	})
	w.release()
	eventually(t, "h1 done", func() bool { return node.names("done", "h1") })
	for _, f := range node.framesSince(from) {
		for _, m := range f.messages {
			ids, _ := m["attempts"].([]any)
			for _, id := range append(ids, m["attempt_id"]) {
				if id == "c1" {
					t.Fatalf("after its cancel the Worker sent %v", m)
				}
			}
		}
	}
	if w.runs("c1") {
		t.Fatal("the Worker still runs the cancelled attempt")
	}
}
