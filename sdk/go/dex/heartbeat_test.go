package dex

import (
	"context"
	"encoding/json"
	"log"
	"sync"
	"testing"
	"time"
)

// A welcome is answered at once with the claim of the strays and a beat of every attempt
// held on that connection, not a heartbeat interval later: a stray the hello reclaimed is
// taken by the reply, and the result it kept goes out (docs/worker-protocol.md, rules 2
// and 14). The heartbeat loop beats on from the welcome, on the welcome's interval.

// welcomeWorker is a Worker on node's URL whose tool "wait" runs until release is called
// (at the latest when the test ends); it beats every 5 s as configured (2 s, a fifth of
// the fake node's heartbeat timeout), and reconnects within 10 ms.
func welcomeWorker(t *testing.T, node *clusterNode) (w *Worker, release func()) {
	t.Helper()
	setEnv(t, nil)
	released := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(released) }) }
	wait := func(ctx context.Context, call *ToolContext, args json.RawMessage) (any, error) {
		<-released
		return "waited", nil
	}
	w = NewWorker(WorkerOptions{
		Address: node.URL, Logger: log.New(&lockedBuffer{}, "", 0), HeartbeatInterval: 5 * time.Second,
		ReconnectInitial: 10 * time.Millisecond, ReconnectMax: 10 * time.Millisecond,
		DrainTimeout: time.Second, // a stray's result waits for no ack
		Agents:       []Agent{{Name: "a", Model: viewModel{}, Tools: []Tool{{Name: "wait", Kind: Read, Func: wait}}}},
	})
	stop := runInBackground(w)
	t.Cleanup(func() {
		release()
		if err := stop(5 * time.Second); err != nil {
			t.Errorf("the Worker did not stop cleanly: %v", err)
		}
	})
	return w, release
}

// runs: the Worker runs attempt id.
func (w *Worker) runs(id string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.running[id]
	return ok
}

// kinds are the types of a frame's messages, in order.
func kinds(frame []map[string]any) []any {
	out := []any{}
	for _, m := range frame {
		out = append(out, m["t"])
	}
	return out
}

// afterHello is the frame after the first hello among frames, waiting for it; and
// the hello.
func afterHello(t *testing.T, node *clusterNode, from int) (hello, next timedFrame) {
	t.Helper()
	eventually(t, "a hello, and the frame after it", func() bool {
		frames := node.framesSince(from)
		for i, f := range frames {
			if f.messages[0]["t"] == "hello" && i+1 < len(frames) {
				hello, next = f, frames[i+1]
				return true
			}
		}
		return false
	})
	return hello, next
}

func TestAWelcomeIsAnsweredAtOnceWithABeatOfWhatTheHelloReclaims(t *testing.T) {
	node := newClusterNode(t) // a single node: it lists no members
	w, release := welcomeWorker(t, node)
	eventually(t, "the first hello", func() bool { return len(node.messages("hello")) == 1 })
	node.send(callMessage("g1"))
	eventually(t, "the call running", func() bool { return w.runs("g1") })

	from := node.frameCount()
	node.drop() // a single node's dropped connection makes no stray: the hello reclaims g1
	hello, next := afterHello(t, node, from)
	if ids, _ := hello.messages[0]["attempts"].([]any); len(ids) != 1 || ids[0] != "g1" {
		t.Fatalf("the hello reclaims g1: %v", hello.messages)
	}
	// the welcome is answered at once with a beat (a seq of its own), not a heartbeat
	// interval (2 s) later
	if after := next.at.Sub(node.lastWelcome()); after > 500*time.Millisecond {
		t.Fatalf("the beat came %v after the welcome", after)
	}
	ids, _ := next.messages[0]["attempts"].([]any)
	if len(next.messages) != 1 || next.messages[0]["t"] != "hb" || next.messages[0]["seq"] == nil ||
		len(ids) != 1 || ids[0] != "g1" {
		t.Fatalf("the frame after the hello is a beat of g1 alone, with a seq: %v", next.messages)
	}
	release()
	eventually(t, "g1 done on its node", func() bool { return node.names("done", "g1") })
	if len(node.messages("claim")) != 0 {
		t.Fatal("a claim to a single node")
	}
}

func TestAStrayTheHelloReclaimsIsTakenByTheReplyToTheBeatOnTheWelcome(t *testing.T) {
	node := newClusterNode(t)
	node.members = []string{node.URL} // a cluster's node: a dropped connection makes strays
	w, release := welcomeWorker(t, node)
	eventually(t, "the first hello", func() bool { return len(node.messages("hello")) == 1 })
	node.send(callMessage("k1"))
	eventually(t, "the call running", func() bool { return w.runs("k1") })

	// the node drops the connection, and welcomes the next one only once k1 is done
	gate := make(chan struct{})
	node.mu.Lock()
	node.gate = gate
	node.mu.Unlock()
	from := node.frameCount()
	node.drop()
	eventually(t, "the hello again", func() bool { return len(node.messages("hello")) == 2 })
	release()
	eventually(t, "k1's result kept", func() bool { return w.result("k1") != nil })
	close(gate)

	hello, next := afterHello(t, node, from)
	if ids, _ := hello.messages[0]["attempts"].([]any); len(ids) != 1 || ids[0] != "k1" {
		t.Fatalf("the hello names the stray: %v", hello.messages)
	}
	if after := next.at.Sub(node.lastWelcome()); after > 500*time.Millisecond {
		t.Fatalf("the claim and beat came %v after the welcome", after)
	}
	// at once: the claim of the stray, then the beat of all the connection holds
	claims, _ := next.messages[0]["attempts"].(map[string]any)
	ids, _ := next.messages[len(next.messages)-1]["attempts"].([]any)
	beat := next.messages[len(next.messages)-1]
	if len(next.messages) != 2 || next.messages[0]["t"] != "claim" || claims["k1"] != "r" ||
		beat["t"] != "hb" || beat["seq"] == nil || len(ids) != 1 || ids[0] != "k1" {
		t.Fatalf("the frame after the hello is the claim of k1, then the beat of k1: %v", kinds(next.messages))
	}
	if node.names("done", "k1") {
		t.Fatal("a stray's result waits for the node that takes it")
	}
	// the node owns k1's session: its ok to the beat takes it, and the kept result goes out
	answered := time.Now()
	node.send(map[string]any{"t": "hb", "seq": beat["seq"], "status": map[string]any{"k1": "ok"}})
	eventually(t, "k1 done on its node", func() bool { return node.names("done", "k1") })
	if after := time.Since(answered); after > 500*time.Millisecond {
		t.Fatalf("the kept result went out %v after the reply", after)
	}
}
