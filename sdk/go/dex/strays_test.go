package dex

import (
	"context"
	"encoding/json"
	"testing"
	"time"
)

// In a cluster an attempt outlives the node that handed it out: the Worker runs it on as a
// stray and claims it on every connection until the node that took its session over
// answers (docs/worker-protocol.md, rule 14; tests/unit/test_strays.py for Python's).

const strayID = "s/1.2/1"
const strayToken = "the-token-of-the-dead-node-s-connection"

// holdingStray is a Worker connected to nodes a and b that holds attempt strayID, handed
// out by a under strayToken (result: it has its result, not yet acknowledged).
func holdingStray(result bool) (w *Worker, a, b *node) {
	w = testWorker()
	a, b = w.newNode([]string{"http://a"}, false), w.newNode([]string{"http://b"}, false)
	tokenA, tokenB := strayToken, "b-token"
	a.resume, b.resume = &tokenA, &tokenB
	w.running[strayID] = &attempt{step: step{AttemptID: strayID, SessionID: "s", StepType: StepCallTool}, cancel: func() {}}
	w.origins[strayID] = &origin{node: a, resume: *a.resume}
	if result {
		w.results[strayID] = doneMessage{T: "done", AttemptID: strayID, Result: json.RawMessage(`{"status":"succeeded"}`)}
	}
	return w, a, b
}

func (w *Worker) strays() map[string]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.straysLocked()
}

func (w *Worker) lost(n *node) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lostLocked(n)
}

// sent is what waits to be sent on n, as one frame (and empties its outbox).
func sent(t *testing.T, w *Worker, n *node) []map[string]any {
	t.Helper()
	w.mu.Lock()
	data, _ := n.box.take()
	w.mu.Unlock()
	var frame []map[string]any
	if data != nil {
		if err := json.Unmarshal(data, &frame); err != nil {
			t.Fatal(err)
		}
	}
	return frame
}

func on(t *testing.T, w *Worker, n *node, m serverMessage) {
	t.Helper()
	if err := w.handleOn(context.Background(), n, []serverMessage{m}); err != nil {
		t.Fatal(err)
	}
}

func TestAnAttemptWhoseConnectionDroppedIsClaimedAndMovesToTheNodeThatSaysOK(t *testing.T) {
	w, a, b := holdingStray(true)
	if len(w.strays()) != 0 {
		t.Fatalf("no stray yet: %v", w.strays())
	}

	w.lost(a)
	if got := w.strays(); len(got) != 1 || got[strayID] != strayToken {
		t.Fatalf("claimed with the token it was handed out under: %v", got)
	}
	on(t, w, b, claimedMessage{Status: map[string]string{strayID: "ok"}})

	w.mu.Lock()
	moved := w.originLocked(strayID) == b
	w.mu.Unlock()
	if !moved || len(w.strays()) != 0 {
		t.Fatalf("the attempt is b's now, and no stray: %v", w.strays())
	}
	if frame := sent(t, w, b); len(frame) != 1 || frame[0]["t"] != "done" || frame[0]["attempt_id"] != strayID {
		t.Fatalf("its result goes to its new node at once: %v", frame)
	}
}

// beatOnce runs n's heartbeat loop until it beat, and returns that beat's seq and what
// it named (what else the loop sent stays in n's outbox, before the beat).
func beatOnce(t *testing.T, w *Worker, n *node) (int64, []string) {
	t.Helper()
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		w.heartbeatLoop(n, done)
		close(finished)
	}()
	eventually(t, "a beat on "+n.address, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return n.beat != nil
	})
	close(done)
	<-finished
	w.mu.Lock()
	defer w.mu.Unlock()
	return n.beat.seq, n.beat.ids
}

func TestAnAttemptLeftOutOfTheReplyToItsNodesBeatIsAStray(t *testing.T) {
	w, a, _ := holdingStray(false)
	w.opts.HeartbeatInterval = time.Millisecond

	seq, ids := beatOnce(t, w, a)
	frame := sent(t, w, a)
	if len(ids) != 1 || ids[0] != strayID || len(frame) == 0 || frame[len(frame)-1]["t"] != "hb" ||
		frame[len(frame)-1]["seq"] != float64(seq) {
		t.Fatalf("the beat names all a holds, with a seq of its own: %v %v", ids, frame)
	}
	on(t, w, a, heartbeatReplyMessage{Seq: &seq, Status: map[string]string{}}) // a gave the session up
	if got := w.strays(); got[strayID] != strayToken {
		t.Fatalf("left out of the reply to the beat: a stray, %v", got)
	}
	on(t, w, a, heartbeatReplyMessage{Status: map[string]string{strayID: "ok"}}) // a (back) holds it again
	if len(w.strays()) != 0 {
		t.Fatalf("an ok from its node: no stray, %v", w.strays())
	}
}

func TestRepliesToOtherHeartbeatsThatLeaveItOutDoNotMakeAStray(t *testing.T) {
	w, a, b := holdingStray(true) // a result, kept until its ack, is held too
	w.opts.HeartbeatInterval = time.Millisecond
	seq, ids := beatOnce(t, w, a)
	if len(ids) != 1 || ids[0] != strayID {
		t.Fatalf("the beat names the attempt whose result is unacked: %v", ids)
	}

	on(t, w, a, heartbeatReplyMessage{Status: map[string]string{"s/1.5/1": "ok"}}) // a tool's own beat
	other := seq + 1
	on(t, w, a, heartbeatReplyMessage{Seq: &other, Status: map[string]string{}}) // another's start ask
	on(t, w, b, heartbeatReplyMessage{Seq: &seq, Status: map[string]string{}})   // b's, not a's, beat
	if len(w.strays()) != 0 {
		t.Fatalf("only the reply to a's own beat marks strays: %v", w.strays())
	}

	w.mu.Lock()
	w.droppedLocked(a) // a single node: the hello reclaims
	w.mu.Unlock()
	on(t, w, a, heartbeatReplyMessage{Seq: &seq, Status: map[string]string{}}) // a forgot that beat
	if len(w.strays()) != 0 {
		t.Fatalf("a connection forgets its beat when it drops: %v", w.strays())
	}
}

func TestAStraysResultWaitsForTheNodeThatTakesIt(t *testing.T) {
	release := make(chan struct{})
	wait := func(ctx context.Context, call *ToolContext, args json.RawMessage) (any, error) {
		<-release
		return "waited", nil
	}
	w := NewWorker(WorkerOptions{Address: "http://127.0.0.1:1", Agents: []Agent{{
		Name: "a", Model: echoModel{}, Tools: []Tool{{Name: "wait", Kind: Read, Func: wait}},
	}}})
	a, b := w.newNode([]string{"http://a"}, false), w.newNode([]string{"http://b"}, false)
	tokenA, tokenB := strayToken, "b-token"
	a.resume, b.resume = &tokenA, &tokenB
	tool := "wait"
	w.handOutOn(a, step{AttemptID: strayID, SessionID: "s", StepType: StepCallTool, Agent: "a",
		Tool: &tool, Arguments: json.RawMessage(`{}`)})
	w.lost(a)

	close(release) // it ends while a stray: its result goes nowhere
	eventually(t, "the stray's result kept", func() bool { return w.result(strayID) != nil })
	if fa, fb := sent(t, w, a), sent(t, w, b); len(fa) != 0 || len(fb) != 0 {
		t.Fatalf("a stray's result is sent to no node: %v %v", fa, fb)
	}
	w.welcomeOn(a, welcomeMessage{Resume: "a2", HeartbeatTimeout: 10}) // a is back
	if fa, fb := sent(t, w, a), sent(t, w, b); len(fa) != 0 || len(fb) != 0 {
		t.Fatalf("nor again when its connection is back: %v %v", fa, fb)
	}
	on(t, w, b, heartbeatReplyMessage{Status: map[string]string{strayID: "ok"}}) // not b's
	if fa, fb := sent(t, w, a), sent(t, w, b); len(fa) != 0 || len(fb) != 0 || len(w.strays()) != 1 {
		t.Fatalf("an ok from a node it is not on changes nothing: %v %v", fa, fb)
	}

	on(t, w, a, heartbeatReplyMessage{Status: map[string]string{strayID: "ok"}}) // a, back, owns it
	frame := sent(t, w, a)
	if len(w.strays()) != 0 || len(frame) != 1 || frame[0]["t"] != "done" || frame[0]["attempt_id"] != strayID {
		t.Fatalf("taken by its own node's ok: its result goes there at once: %v", frame)
	}
}

func TestOnlyAClusterNodesDropMakesStraysClaimedAtOnceOnTheOtherNodes(t *testing.T) {
	w, a, b := holdingStray(false)
	c := w.newNode([]string{"http://c"}, false) // up, a single node: it needs no claim
	w.mu.Lock()
	w.members["http://b"], w.members["http://c"] = b, c
	a.linked, b.linked, c.linked = true, true, true
	w.listLocked(b, []string{"http://a", "http://b"})
	w.listLocked(c, nil)
	w.droppedLocked(a) // a listed no members: a single node
	w.mu.Unlock()
	if len(w.strays()) != 0 || len(sent(t, w, b)) != 0 {
		t.Fatalf("a single node's drop makes no stray (the hello reclaims): %v", w.strays())
	}

	w.mu.Lock()
	a.linked = true
	w.listLocked(a, []string{"http://a", "http://b"})
	w.droppedLocked(a) // a cluster's node
	w.mu.Unlock()
	if got := w.strays(); got[strayID] != strayToken {
		t.Fatalf("a cluster node's drop makes its attempts strays: %v", got)
	}
	frame := sent(t, w, b)
	claims, _ := frame[0]["attempts"].(map[string]any)
	if len(frame) != 1 || frame[0]["t"] != "claim" || claims[strayID] != strayToken {
		t.Fatalf("claimed at once on the other cluster node: %v", frame)
	}
	if got := sent(t, w, c); len(got) != 0 {
		t.Fatalf("no claim to a single node: %v", got)
	}
}

func TestAStrayToldToStopIsDroppedAndAnswersFromOthersDoNotCount(t *testing.T) {
	for _, result := range []bool{false, true} {
		w, a, b := holdingStray(result)
		w.lost(a)

		on(t, w, b, claimedMessage{Status: map[string]string{"t/1.1/1": "ok"}})        // not one it holds
		on(t, w, b, heartbeatReplyMessage{Status: map[string]string{strayID: "stop"}}) // not b's attempt
		if _, held := w.running[strayID]; !held || len(w.strays()) != 1 {
			t.Fatal("answers about other attempts, or from a node it is not on, change nothing")
		}
		on(t, w, b, claimedMessage{Status: map[string]string{strayID: "stop"}})

		_, running := w.running[strayID]
		_, kept := w.results[strayID]
		if running || kept || len(w.strays()) != 0 || len(sent(t, w, b)) != 0 {
			t.Fatalf("stopped, its result (%v) dropped, and nothing sent", result)
		}
	}
}

func TestAWelcomeOfTheNodeBackStopsOnlyWhatItLists(t *testing.T) {
	w, a, _ := holdingStray(false)
	w.lost(a)

	w.welcomeOn(a, welcomeMessage{Resume: "x", HeartbeatTimeout: 10})

	if got := w.strays(); got[strayID] != strayToken {
		t.Fatalf("still claimed (another node may own it): %v", got)
	}
}

func TestEachConnectionClaimsTheStraysBeforeItsHeartbeatAndAStrayAsksNoNodeToStart(t *testing.T) {
	w, a, b := holdingStray(false)
	w.opts.HeartbeatInterval = 5 * time.Millisecond
	w.running["b1"] = &attempt{step: step{AttemptID: "b1"}, cancel: func() {}}
	w.origins["b1"] = &origin{node: b, resume: *b.resume}
	b.linked = true
	start := make(chan bool, 1)
	w.mu.Lock()
	w.lostLocked(a)
	held := w.running[strayID]
	held.start = start
	w.askStartLocked(held) // waits for its start acknowledgement
	w.mu.Unlock()
	if frame := sent(t, w, a); len(frame) != 0 {
		t.Fatalf("a stray asks no node to start: %v", frame)
	}

	// beat runs b's heartbeat loop until it sent two messages, and returns them
	beat := func() []map[string]any {
		done, finished := make(chan struct{}), make(chan struct{})
		go func() {
			w.heartbeatLoop(b, done)
			close(finished)
		}()
		var frame []map[string]any
		eventually(t, "two messages on b", func() bool {
			frame = append(frame, sent(t, w, b)...)
			return len(frame) >= 2
		})
		close(done)
		<-finished
		sent(t, w, b) // what a last tick left
		return frame
	}
	for _, m := range beat() { // b's node is a single node: it listed no members
		if m["t"] != "hb" {
			t.Fatalf("a single node gets no claim (a hello reclaims): %v", m)
		}
	}
	w.mu.Lock()
	w.listLocked(b, []string{"http://a", "http://b"})
	w.mu.Unlock()
	frame := beat()
	claims, _ := frame[0]["attempts"].(map[string]any)
	if frame[0]["t"] != "claim" || claims[strayID] != strayToken || frame[1]["t"] != "hb" || frame[1]["seq"] == nil {
		t.Fatalf("the claim of every stray, then b's own beat, with a seq: %v", frame)
	}

	on(t, w, b, claimedMessage{Status: map[string]string{strayID: "ok"}})
	asked := false
	for _, m := range sent(t, w, b) { // after what the last ticks left
		ids, _ := m["attempts"].([]any)
		asked = asked || m["t"] == "hb" && m["seq"] != nil && len(ids) == 1 && ids[0] == strayID
	}
	if !asked {
		t.Fatal("claimed, it asks its new node to start at once")
	}
}
