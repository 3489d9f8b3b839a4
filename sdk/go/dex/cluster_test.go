package dex

import (
	"context"
	"encoding/json"
	"log"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// webSocketServer is a fake node: it serves each WebSocket connection made to it with
// serve, and closes the connection when serve returns.
func webSocketServer(serve func(conn *websocket.Conn)) *httptest.Server {
	upgrader := websocket.Upgrader{}
	return httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		conn, err := upgrader.Upgrade(rw, r, nil)
		if err != nil {
			return
		}
		defer conn.Close()
		serve(conn)
	}))
}

// clusterNode is a fake node of a cluster: it welcomes a Worker listing members (once
// gate, if set, is closed), acks every result and keeps every message it gets, and each
// frame with when it came.
type clusterNode struct {
	*httptest.Server
	mu       sync.Mutex
	members  []string
	gate     chan struct{}
	conn     *websocket.Conn
	got      []map[string]any
	frames   []timedFrame
	welcomed []time.Time // when it sent each welcome
}

// timedFrame is a frame a fake node got, and when.
type timedFrame struct {
	at       time.Time
	messages []map[string]any
}

func newClusterNode(t *testing.T) *clusterNode {
	t.Helper()
	n := &clusterNode{}
	n.Server = webSocketServer(func(conn *websocket.Conn) {
		n.mu.Lock()
		n.conn = conn
		n.mu.Unlock()
		for first := true; ; first = false {
			_, data, err := conn.ReadMessage()
			if err != nil {
				return
			}
			var frame []map[string]any
			if err := json.Unmarshal(data, &frame); err != nil {
				return
			}
			n.mu.Lock()
			n.got = append(n.got, frame...)
			n.frames = append(n.frames, timedFrame{at: time.Now(), messages: frame})
			members, gate := n.members, n.gate
			n.mu.Unlock()
			if first {
				if gate != nil {
					<-gate
				}
				n.mu.Lock()
				n.welcomed = append(n.welcomed, time.Now())
				n.mu.Unlock()
				n.send(map[string]any{
					"t": "welcome", "worker_id": "w", "resume": "r", "stop": []string{},
					"heartbeat_timeout": 10, "reconnect_grace": 5, "members": members,
				})
			}
			for _, m := range frame {
				if t := m["t"]; t == "done" || t == "fail" || t == "back" {
					n.send(map[string]any{"t": "ack", "attempt_id": m["attempt_id"], "ok": true})
				}
			}
		}
	})
	t.Cleanup(n.stop)
	return n
}

func (n *clusterNode) send(messages ...map[string]any) {
	data, _ := json.Marshal(messages)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.conn != nil {
		_ = n.conn.WriteMessage(websocket.TextMessage, data)
	}
}

// stop: the node goes away, its connection dropped and nothing listening on its port.
func (n *clusterNode) stop() {
	n.mu.Lock()
	if n.conn != nil {
		n.conn.Close()
	}
	n.mu.Unlock()
	n.Server.Close()
}

// drop: the node drops the Worker's connection, and takes the next one.
func (n *clusterNode) drop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.conn != nil {
		n.conn.Close()
	}
}

// frameCount is how many frames it got.
func (n *clusterNode) frameCount() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.frames)
}

// framesSince are the frames it got from the i-th on.
func (n *clusterNode) framesSince(i int) []timedFrame {
	n.mu.Lock()
	defer n.mu.Unlock()
	if i > len(n.frames) {
		return nil
	}
	return append([]timedFrame(nil), n.frames[i:]...)
}

// lastWelcome is when it sent its last welcome.
func (n *clusterNode) lastWelcome() time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.welcomed[len(n.welcomed)-1]
}

// messages are those it got whose t is kind.
func (n *clusterNode) messages(kind string) []map[string]any {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := []map[string]any{}
	for _, m := range n.got {
		if m["t"] == kind {
			out = append(out, m)
		}
	}
	return out
}

// names: some message of kind names attempt id (attempt_id, or among hb attempts).
func (n *clusterNode) names(kind, id string) bool {
	for _, m := range n.messages(kind) {
		if m["attempt_id"] == id {
			return true
		}
		if ids, ok := m["attempts"].([]any); ok {
			for _, a := range ids {
				if a == id {
					return true
				}
			}
		}
	}
	return false
}

// startAsk is the seq of the last hb of n that may ask to start attempt id (nil: none):
// one with a seq that names only id (the Worker's beat of all it holds on n, when that is
// id alone, looks the same).
func (n *clusterNode) startAsk(id string) any {
	asks := n.startAsks(id)
	if len(asks) == 0 {
		return nil
	}
	return asks[len(asks)-1]
}

// startAsks are the seqs of every hb of n that may ask to start attempt id (startAsk).
func (n *clusterNode) startAsks(id string) []any {
	var seqs []any
	for _, m := range n.messages("hb") {
		if ids, _ := m["attempts"].([]any); m["seq"] != nil && len(ids) == 1 && ids[0] == id {
			seqs = append(seqs, m["seq"])
		}
	}
	return seqs
}

// claimedWith is the token of the last claim of attempt id n got ("": none).
func (n *clusterNode) claimedWith(id string) string {
	token := ""
	for _, m := range n.messages("claim") {
		if attempts, ok := m["attempts"].(map[string]any); ok {
			if t, ok := attempts[id].(string); ok {
				token = t
			}
		}
	}
	return token
}

func callMessage(id string) map[string]any {
	return map[string]any{
		"t": "step", "attempt_id": id, "session_id": id, "step_id": id, "step_type": StepCallTool,
		"attempt": 1, "agent": "a", "tool": "wait", "call_id": id, "arguments": map[string]any{},
	}
}

func TestAWorkerInAClusterConnectsToEveryMemberWithOneCapacity(t *testing.T) {
	setEnv(t, nil)
	a, b := newClusterNode(t), newClusterNode(t)
	a.members = []string{a.URL, b.URL}
	b.members = []string{a.URL, b.URL}
	release := make(chan struct{})
	var mu sync.Mutex
	runningNow := 0
	wait := func(ctx context.Context, call *ToolContext, args json.RawMessage) (any, error) {
		mu.Lock()
		runningNow++
		mu.Unlock()
		<-release
		mu.Lock()
		runningNow--
		mu.Unlock()
		return "waited", nil
	}
	var writes atomic.Int32
	write := func(ctx context.Context, call *ToolContext, args json.RawMessage) (any, error) {
		writes.Add(1)
		return "written", nil
	}
	logs := &lockedBuffer{}
	w := NewWorker(WorkerOptions{
		Address: a.URL, Capacity: 1, Logger: log.New(logs, "", 0), LogLevel: "debug",
		HeartbeatInterval: 20 * time.Millisecond,
		ReconnectInitial:  10 * time.Millisecond, ReconnectMax: 50 * time.Millisecond,
		Agents: []Agent{{Name: "a", Model: viewModel{}, Tools: []Tool{
			{Name: "wait", Kind: Read, Func: wait}, {Name: "write", Kind: Write, Func: write},
		}}},
	})
	stop := runInBackground(w)
	defer func() {
		if err := stop(10 * time.Second); err != nil {
			t.Errorf("the Worker did not stop cleanly: %v", err)
		}
	}()

	eventually(t, "a hello on B, learnt from A's welcome", func() bool { return len(b.messages("hello")) == 1 })
	a.send(callMessage("a1"))
	eventually(t, "A's call running", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return runningNow == 1
	})
	b.send(callMessage("b1"))
	eventually(t, "B's call handed back at once, on B", func() bool { return b.names("back", "b1") })
	eventually(t, "A's call beating on A", func() bool { return a.names("hb", "a1") })
	close(release)
	eventually(t, "A's call done on A", func() bool { return a.names("done", "a1") })
	if b.names("hb", "a1") || b.names("done", "a1") || a.names("back", "b1") {
		t.Fatal("an attempt's messages go on the connection that handed it out")
	}
	for _, node := range []*clusterNode{a, b} {
		if logs.count("action=worker.connected address="+node.URL) != 1 {
			t.Fatalf("one connected line per node, naming it:\n%s", logs)
		}
	}

	// B hands out a single-attempt write, which waits for its start acknowledgement
	single := callMessage("b2")
	single["step_type"], single["tool"], single["needs_start_ack"] = StepCallSingleAttemptTool, "write", true
	b.send(single)
	eventually(t, "B's write asking to start", func() bool { return b.startAsk("b2") != nil })

	// B goes down, and the Worker tries it again; then A says B left: no more tries
	gone := b.URL
	b.stop()
	eventually(t, "B tried again", func() bool { return logs.count("action=worker.connect_failed address="+gone) > 0 })
	a.send(map[string]any{"t": "members", "members": []string{a.URL}})
	eventually(t, "B let go", func() bool { return logs.count("action=worker.node_left address="+gone) == 1 })
	// B's write is a stray: claimed on A with the token B handed it out under
	eventually(t, "B's write claimed on A", func() bool { return a.claimedWith("b2") == "r" })
	tries := logs.count("action=worker.connect_failed address=" + gone)
	if writes.Load() != 0 || a.startAsk("b2") != nil {
		t.Fatal("a stray asks no node to start, and does not start")
	}
	// A took B's sessions over: the write is A's now, asks A to start, and runs
	a.send(map[string]any{"t": "claimed", "status": map[string]any{"b2": "ok"}})
	eventually(t, "B's write asking A to start", func() bool { return a.startAsk("b2") != nil })
	// A answers ok to every hb that may ask (its beat of all A holds, b2 alone, looks the
	// same), as a node does
	answered := 0
	eventually(t, "B's write done on A", func() bool {
		asks := a.startAsks("b2")
		for ; answered < len(asks); answered++ {
			a.send(map[string]any{"t": "hb", "seq": asks[answered], "status": map[string]any{"b2": "ok"}})
		}
		return a.names("done", "b2")
	})
	if writes.Load() != 1 {
		t.Fatalf("the claimed write ran %d times", writes.Load())
	}
	for _, id := range []string{"a2", "a3", "a4"} { // A serves on, with the slot freed
		a.send(callMessage(id))
		eventually(t, id+" done on A", func() bool { return a.names("done", id) })
	}
	if logs.count("action=worker.connect_failed address="+gone) != tries {
		t.Fatalf("B is tried again after it left:\n%s", logs)
	}
}
