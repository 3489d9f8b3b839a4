package client_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/dex-run/dex/sdk/go/client"
)

// fakeServer answers the two calls of the example as a Dex server would.
func fakeServer() *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/v1/sessions":
			fmt.Fprint(w, `{"id": "order-42", "agent": "concierge", "status": "idle", "created_at": 1, "updated_at": 1}`)
		case "/v1/sessions/order-42/messages":
			fmt.Fprint(w, `{"session_id": "order-42", "turn": 1, "status": "completed", "created": true,
				"text": "Done: sunny in Paris", "tool_calls": [], "steps": [], "waiting_for": []}`)
		default:
			http.NotFound(w, r)
		}
	}))
}

// Create a session, send it a message and wait for the turn to end (or to wait for a
// person: then Status is client.TurnWaiting, and WaitingFor says for what).
func Example() {
	server := fakeServer() // a stand-in for dex server
	defer server.Close()

	c, err := client.New(client.Options{Addresses: []string{server.URL}})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	session, err := c.CreateSession(ctx, "concierge", "order-42")
	if err != nil {
		log.Fatal(err)
	}
	turn, err := c.SendMessage(ctx, session.ID, "Weather in Paris?", client.SendOptions{MessageID: "msg-1", Wait: true})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(session.ID, session.Status)
	fmt.Println(turn.Turn, turn.Status, turn.Text)
	// Output:
	// order-42 idle
	// 1 completed Done: sunny in Paris
}
