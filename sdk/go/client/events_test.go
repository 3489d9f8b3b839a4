package client

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// StreamEvents against servers that send crafted bytes, as
// tests/integration/test_client_events.py checks the Python Client's.

const eventStream = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"

// crafted answers its Nth request with handlers[N] (the last one repeats), and keeps
// each request's headers and the moment it came.
type crafted struct {
	address  string
	handlers []func(conn net.Conn)
	mu       sync.Mutex
	requests []http.Header
	times    []time.Time
}

func newCrafted(t *testing.T, handlers ...func(conn net.Conn)) *crafted {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &crafted{address: "http://" + l.Addr().String(), handlers: handlers}
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer conn.Close()
				req, err := http.ReadRequest(bufio.NewReader(conn))
				if err != nil {
					return
				}
				c.mu.Lock()
				c.requests = append(c.requests, req.Header)
				c.times = append(c.times, time.Now())
				handler := c.handlers[minInt(len(c.requests), len(c.handlers))-1]
				c.mu.Unlock()
				handler(conn)
			}()
		}
	}()
	return c
}

func (c *crafted) seen() ([]http.Header, []time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]http.Header(nil), c.requests...), append([]time.Time(nil), c.times...)
}

// whole is an event stream that is body and ends (the connection closes).
func whole(body string) func(net.Conn) {
	return func(conn net.Conn) {
		fmt.Fprint(conn, eventStream+"connection: close\r\n\r\n"+body)
	}
}

// cut is a chunked event stream that sends body and dies before its last chunk.
func cut(body string) func(net.Conn) {
	return func(conn net.Conn) {
		fmt.Fprintf(conn, eventStream+"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(body), body)
	} // the connection closes with no last chunk
}

// held sends body, then nothing more, until the client leaves.
func held(body string) func(net.Conn) {
	return func(conn net.Conn) {
		fmt.Fprintf(conn, eventStream+"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(body), body)
		conn.Read(make([]byte, 1))
	}
}

func craftedError(status int, code string) func(net.Conn) {
	return func(conn net.Conn) {
		body := fmt.Sprintf(`{"error": {"code": %q, "message": "crafted %d"}}`, code, status)
		fmt.Fprintf(conn, "HTTP/1.1 %d Crafted\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"+
			"connection: close\r\n\r\n%s", status, len(body), body)
	}
}

// take reads count events (fewer if the stream ends first) within 10 s.
func take(t *testing.T, s *EventStream, count int) []Event {
	t.Helper()
	var events []Event
	done := make(chan struct{})
	go func() {
		defer close(done)
		for len(events) < count && s.Next() {
			events = append(events, s.Event())
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		s.Close()
		<-done
		t.Fatalf("%d of %d events in 10 s", len(events), count)
	}
	return events
}

func ids(events []Event) string {
	var out []string
	for _, e := range events {
		out = append(out, e.ID)
	}
	return strings.Join(out, " ")
}

func TestMultiLineDataCRLFCommentsAndFieldsWithoutASpace(t *testing.T) {
	server := newCrafted(t, whole(": connected\r\n"+
		"retry: 10000\r\n"+
		"id: 1733150000000-0\r\n"+
		"event: history.item\r\n"+
		"data: {\"index\": 0,\r\n"+
		"data:  \"item\": {\"type\": \"user\",\r\n"+
		"data: \"text\": \"hi\"}}\r\n"+
		"\r\n"+
		"id:1733150000000-1\n"+
		"event:model.delta\n"+
		"data:{\"text\": \"two\\nlines\"}\n"+
		"\n"+
		": keep-alive\r\n\r\n"+
		"id: 1733150000000-2\rdata: {\"turn\": 1}\revent: turn.completed\r\r"))
	c := newTestClient(t, server.address)
	s := c.StreamEvents(context.Background(), "s1", StreamOptions{NoReconnect: true})
	events := take(t, s, 10)
	if s.Err() != nil {
		t.Fatalf("the end of the response ends the stream: %v", s.Err())
	}
	want := []Event{
		{"1733150000000-0", EventHistoryItem, []byte("{\"index\": 0,\n \"item\": {\"type\": \"user\",\n\"text\": \"hi\"}}")},
		{"1733150000000-1", EventModelDelta, []byte(`{"text": "two\nlines"}`)},
		{"1733150000000-2", EventTurnCompleted, []byte(`{"turn": 1}`)},
	}
	if fmt.Sprintf("%q", events) != fmt.Sprintf("%q", want) {
		t.Fatalf("got %q", events)
	}
	requests, _ := server.seen()
	if requests[0].Get("Last-Event-ID") != "" || requests[0].Get("Accept") != "text/event-stream" {
		t.Fatalf("sent %v", requests[0])
	}
}

func TestAStreamCutMidEventResumesAfterTheLastIDSeen(t *testing.T) {
	server := newCrafted(t,
		cut("id: 1733150000000-0\nevent: model.delta\ndata: {\"text\": \"a\"}\n\n"+
			"id: 1733150000000-1\nevent: model.delta\ndata: {\"text\": \"b\"}\n\n"+
			"id: 1733150000000-2\nevent: model.delta\ndata: {\"te"),
		whole("id: 1733150000000-2\nevent: model.delta\ndata: {\"text\": \"c\"}\n\n"+
			"id: 1733150000000-3\nevent: turn.completed\ndata: {\"turn\": 1}\n\n"))
	c := newTestClient(t, server.address)
	s := c.StreamEvents(context.Background(), "s1", StreamOptions{})
	defer s.Close()
	events := take(t, s, 4)
	if got := ids(events); got != "1733150000000-0 1733150000000-1 1733150000000-2 1733150000000-3" {
		t.Fatalf("got %s: none twice", got)
	}
	if string(events[2].Data) != `{"text": "c"}` {
		t.Fatalf("the unfinished event is dropped: %s", events[2].Data)
	}
	requests, _ := server.seen()
	if len(requests) != 2 || requests[1].Get("Last-Event-ID") != "1733150000000-1" {
		t.Fatalf("sent %v", requests)
	}
	if s.LastEventID() != "1733150000000-3" {
		t.Fatalf("last id %q", s.LastEventID())
	}
}

func TestAGivenLastEventIDIsSentAndACleanEndReconnectsWithTheNewest(t *testing.T) {
	server := newCrafted(t, whole("id: 8\ndata: 8\n\n"), whole("id: 9\ndata: 9\n\n"))
	c := newTestClient(t, server.address)
	s := c.StreamEvents(context.Background(), "s1", StreamOptions{LastEventID: "7"})
	defer s.Close()
	events := take(t, s, 2)
	if string(events[0].Data)+string(events[1].Data) != "89" || events[0].Type != "message" {
		t.Fatalf("got %q", events)
	}
	requests, _ := server.seen()
	if requests[0].Get("Last-Event-ID") != "7" || requests[1].Get("Last-Event-ID") != "8" {
		t.Fatalf("sent %v", requests)
	}
}

func TestAStandbyAndADeadAddressArePassedOver(t *testing.T) {
	standby := newCrafted(t, craftedError(503, "unavailable"))
	active := newCrafted(t, whole("id: 1\nevent: turn.started\ndata: {\"turn\": 1}\n\n"))
	c := newTestClient(t, deadAddress(t), standby.address, active.address)
	s := c.StreamEvents(context.Background(), "s1", StreamOptions{})
	defer s.Close()
	events := take(t, s, 1)
	if events[0].ID != "1" || events[0].Type != EventTurnStarted || string(events[0].Data) != `{"turn": 1}` {
		t.Fatalf("got %q", events)
	}
	if requests, _ := standby.seen(); len(requests) != 1 {
		t.Fatalf("the standby got %d requests", len(requests))
	}
}

func TestTheServersRetryFieldSetsTheWaitBeforeReconnecting(t *testing.T) {
	server := newCrafted(t, whole("retry: 300\nid: 1\ndata: 1\n\n"), whole("id: 2\ndata: 2\n\n"))
	c := newTestClient(t, server.address)
	s := c.StreamEvents(context.Background(), "s1", StreamOptions{})
	defer s.Close()
	take(t, s, 2)
	_, times := server.seen()
	if gap := times[1].Sub(times[0]); gap < 300*time.Millisecond {
		t.Fatalf("reconnected after %s", gap)
	}
}

func TestA4xxIsReturnedAtOnceAndNotTriedAgain(t *testing.T) {
	for _, tc := range []struct {
		status int
		code   string
		kind   error
	}{{404, "not_found", ErrNotFound}, {401, "unauthorized", ErrAuth}} {
		refusing := newCrafted(t, craftedError(tc.status, tc.code))
		other := newCrafted(t, whole("id: 1\ndata: 1\n\n"))
		c := newTestClient(t, refusing.address, other.address)
		s := c.StreamEvents(context.Background(), "s1", StreamOptions{})
		if events := take(t, s, 1); len(events) != 0 {
			t.Fatalf("got %q", events)
		}
		if e := wantKind(t, s.Err(), tc.kind); e.Message != fmt.Sprintf("crafted %d", tc.status) {
			t.Fatalf("%+v", e)
		}
		if r, _ := refusing.seen(); len(r) != 1 {
			t.Fatalf("%d requests", len(r))
		}
		if r, _ := other.seen(); len(r) != 0 {
			t.Fatal("a 4xx is the answer: not asked elsewhere")
		}
	}
}

func TestA4xxOnReconnectIsReturnedToo(t *testing.T) {
	server := newCrafted(t, cut("id: 1\ndata: 1\n\n"), craftedError(404, "not_found"))
	c := newTestClient(t, server.address)
	s := c.StreamEvents(context.Background(), "s1", StreamOptions{})
	events := take(t, s, 10)
	if ids(events) != "1" {
		t.Fatalf("got %q", events)
	}
	wantKind(t, s.Err(), ErrNotFound)
}

func TestItGivesUpWhenNoStreamOpensWithinTheTimeout(t *testing.T) {
	failing := newCrafted(t, craftedError(500, "internal"))
	c := newTestClientWith(t, Options{Addresses: []string{deadAddress(t), failing.address}, Timeout: time.Second})
	started := time.Now()
	s := c.StreamEvents(context.Background(), "s1", StreamOptions{})
	take(t, s, 1)
	e := wantKind(t, s.Err(), ErrUnavailable)
	if !e.Retryable || !strings.Contains(e.Message, "the event stream of s1 broke") {
		t.Fatalf("%+v", e)
	}
	if took := time.Since(started); took > 3*time.Second {
		t.Fatalf("gave up after %s", took)
	}
	if r, _ := failing.seen(); len(r) < 2 {
		t.Fatalf("%d requests: rounds over both addresses, with backoff", len(r))
	}
}

func TestWithoutReconnectACutIsUnavailable(t *testing.T) {
	server := newCrafted(t, cut("id: 1\ndata: 1\n\n"))
	c := newTestClient(t, server.address)
	s := c.StreamEvents(context.Background(), "s1", StreamOptions{NoReconnect: true})
	events := take(t, s, 10)
	e := wantKind(t, s.Err(), ErrUnavailable)
	if !e.Retryable || !strings.Contains(e.Message, "the event stream of s1 broke") || ids(events) != "1" {
		t.Fatalf("%+v after %q", e, events)
	}
	if r, _ := server.seen(); len(r) != 1 {
		t.Fatalf("%d requests", len(r))
	}
}

func TestAQuietStreamIsDeadAndOpenedAgain(t *testing.T) {
	defer func(was time.Duration) { silence = was }(silence)
	silence = 200 * time.Millisecond
	server := newCrafted(t, held("id: 1\ndata: 1\n\n"), held("id: 2\ndata: 2\n\n"))
	c := newTestClient(t, server.address)
	s := c.StreamEvents(context.Background(), "s1", StreamOptions{})
	defer s.Close()
	if events := take(t, s, 2); ids(events) != "1 2" {
		t.Fatalf("got %q", events)
	}
	requests, times := server.seen()
	if requests[1].Get("Last-Event-ID") != "1" || times[1].Sub(times[0]) < silence {
		t.Fatalf("reopened after %s with %v", times[1].Sub(times[0]), requests[1])
	}
}

func TestCloseEndsAStreamThatWaits(t *testing.T) {
	server := newCrafted(t, held("id: 1\ndata: 1\n\n"))
	c := newTestClient(t, server.address)
	s := c.StreamEvents(context.Background(), "s1", StreamOptions{})
	take(t, s, 1)
	go func() { time.Sleep(100 * time.Millisecond); s.Close() }()
	if s.Next() {
		t.Fatal("an event after Close")
	}
	if s.Err() != nil {
		t.Fatalf("Close is no error: %v", s.Err())
	}
}

func TestACancelledContextEndsTheStreamWithItsError(t *testing.T) {
	server := newCrafted(t, held("id: 1\ndata: 1\n\n"))
	c := newTestClient(t, server.address)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	s := c.StreamEvents(ctx, "s1", StreamOptions{})
	take(t, s, 5)
	if !errors.Is(s.Err(), context.DeadlineExceeded) {
		t.Fatalf("got %v", s.Err())
	}
}

func TestAnEventWhoseDataIsNotJSONIsAServerError(t *testing.T) {
	server := newCrafted(t, whole("id: 1\ndata: 1\n\nid: 2\nevent: model.delta\ndata: {not json\n\n"))
	c := newTestClient(t, server.address)
	s := c.StreamEvents(context.Background(), "s1", StreamOptions{})
	if events := take(t, s, 5); ids(events) != "1" {
		t.Fatalf("got %q", events)
	}
	if e := wantKind(t, s.Err(), ErrServer); !strings.Contains(e.Message, "not JSON: model.delta") {
		t.Fatalf("%+v", e)
	}
}
