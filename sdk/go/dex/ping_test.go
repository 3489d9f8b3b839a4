package dex

import (
	"encoding/json"
	"log"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// pingNode is a node that welcomes a Worker and counts its hellos and pings. A hung one
// answers no ping and sends nothing after its welcome, while its connection stays open:
// a stopped process, a frozen VM.
type pingNode struct {
	*httptest.Server
	mu            sync.Mutex
	hellos, pings int
}

func newPingNode(t *testing.T, hung bool) *pingNode {
	t.Helper()
	n := &pingNode{}
	n.Server = webSocketServer(func(conn *websocket.Conn) {
		// gorilla answers every ping by default: a hung node must not
		conn.SetPingHandler(func(data string) error {
			n.add(&n.pings)
			if hung {
				return nil
			}
			return conn.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(time.Second))
		})
		if _, _, err := conn.ReadMessage(); err != nil { // hello
			return
		}
		n.add(&n.hellos)
		welcome, _ := json.Marshal([]map[string]any{{
			"t": "welcome", "worker_id": "w", "resume": "r", "stop": []string{},
			"heartbeat_timeout": 10, "reconnect_grace": 5,
		}})
		if err := conn.WriteMessage(websocket.TextMessage, welcome); err != nil {
			return
		}
		for { // reading is what answers pings (or, hung, swallows them)
			if _, _, err := conn.ReadMessage(); err != nil {
				return
			}
		}
	})
	t.Cleanup(n.Server.Close)
	return n
}

func (n *pingNode) add(counter *int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	*counter++
}

func (n *pingNode) counts() (hellos, pings int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.hellos, n.pings
}

func TestANodeThatAnswersNoPingIsGivenUpForTheNextAddress(t *testing.T) {
	setEnv(t, nil)
	hung, live := newPingNode(t, true), newPingNode(t, false)
	logs := &lockedBuffer{}
	w := NewWorker(WorkerOptions{
		Address: hung.URL + "," + live.URL, Agents: testAgents,
		PingInterval: 100 * time.Millisecond, Logger: log.New(logs, "", 0),
	})
	stop := runInBackground(w)
	defer func() {
		if err := stop(5 * time.Second); err != nil {
			t.Errorf("the Worker did not stop cleanly: %v", err)
		}
	}()

	eventually(t, "the Worker moved on to the live node", func() bool {
		hellos, _ := live.counts()
		return hellos == 1
	})
	if hellos, pings := hung.counts(); hellos != 1 || pings == 0 {
		t.Fatalf("the hung node welcomed the Worker once and got its pings: %d hellos, %d pings", hellos, pings)
	}
	if logs.count("action=worker.ping_timeout address="+hung.URL+" interval=0.1") != 1 ||
		logs.count("action=worker.connection_lost address="+hung.URL+` error="the node answered no ping within 100ms`) != 1 {
		t.Fatalf("giving the hung node up is logged, naming it:\n%s", logs)
	}
	// a node that answers is kept however long it has nothing to say
	eventually(t, "pings answered by the live node", func() bool {
		_, pings := live.counts()
		return pings >= 5
	})
	if hellos, _ := live.counts(); hellos != 1 || logs.count("action=worker.ping_timeout") != 1 {
		t.Fatalf("the live node is never given up: %d hellos there\n%s", hellos, logs)
	}
}
