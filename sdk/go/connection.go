// The Worker's connection to the server: the addresses tried in turn with a pause that
// grows, hello and welcome, the outbox written as frames, pings, and the log of each
// connection's life.

package dex

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/dex-run/dex/sdk/go/internal/failpoint"
	"github.com/gorilla/websocket"
)

// connect tries the addresses in turn, and again after a pause that grows, until the
// server refuses this Worker for good (ErrRefused) or the Worker stopped (ctx done, and
// drained or out of time). It logs the life of each connection.
func (w *Worker) connect(ctx context.Context) error {
	addresses := addressList(w.opts.Address)
	failures := 0
	for {
		for _, address := range addresses {
			welcomed, err := w.session(ctx, address)
			if errors.Is(err, ErrRefused) {
				w.conn.stopped("", err)
				return err
			}
			if welcomed {
				failures = 0
			}
			if w.stopping(ctx) {
				w.conn.stopped(w.reason(), nil)
				return nil
			}
			if err == nil {
				err = errors.New("the connection closed")
			}
			if welcomed {
				w.conn.lost(address, err)
			} else { // unreachable, or closed before its welcome: a standby, say
				w.conn.failed(address, err)
			}
		}
		failures++
		// the pause ends early when the Worker is told to stop
		select {
		case <-ctx.Done():
		case <-time.After(w.backoff(failures)):
		}
		if w.stopping(ctx) {
			w.conn.stopped(w.reason(), nil)
			return nil
		}
	}
}

// backoff is the pause before the n-th round of connection attempts: ReconnectInitial
// doubled n-1 times, capped at ReconnectMax, with full jitter.
func (w *Worker) backoff(n int) time.Duration {
	ceiling := w.opts.ReconnectInitial
	for i := 1; i < n && ceiling < w.opts.ReconnectMax; i++ {
		ceiling *= 2
	}
	if ceiling > w.opts.ReconnectMax {
		ceiling = w.opts.ReconnectMax
	}
	return time.Duration(rand.Int63n(int64(ceiling)) + 1)
}

func wsURL(address string) string {
	address = strings.TrimRight(address, "/")
	switch {
	case strings.HasPrefix(address, "https://"):
		address = "wss://" + strings.TrimPrefix(address, "https://")
	case strings.HasPrefix(address, "http://"):
		address = "ws://" + strings.TrimPrefix(address, "http://")
	}
	return address + "/v1/workers/connect"
}

// session runs one connection to one address until it drops; welcomed says whether the
// server answered hello.
func (w *Worker) session(ctx context.Context, address string) (welcomed bool, err error) {
	header := http.Header{}
	if w.opts.Token != "" {
		header.Set("Authorization", "Bearer "+w.opts.Token)
	}
	dialer := websocket.Dialer{HandshakeTimeout: w.opts.ConnectTimeout}
	conn, resp, err := dialer.Dial(wsURL(address), header) // not ctx: a draining Worker still delivers
	if err != nil {
		if resp != nil && (resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden) {
			why := "no worker token"
			if resp.StatusCode == http.StatusForbidden {
				why = "a token without the worker role"
			}
			w.log.error("worker.unauthorized", fmt.Sprintf("%s refused this Worker (HTTP %d: %s): set "+
				"DEX_WORKER_TOKEN (or WorkerOptions.Token) to the server's worker token", address, resp.StatusCode, why),
				field{"address", address})
			return false, fmt.Errorf("%w: HTTP %d from %s (check the worker token)", ErrRefused, resp.StatusCode, address)
		}
		return false, err
	}
	defer conn.Close()
	conn.SetReadLimit(64 << 20)

	done := make(chan struct{})
	defer close(done)
	errs := make(chan error, 4)
	// a pong or any frame from the node is an answer to the pings; pongs arrive while a
	// read waits for a frame
	var answered atomic.Bool
	conn.SetPongHandler(func(string) error {
		answered.Store(true)
		return nil
	})
	read := func() ([]incoming, error) {
		frame, err := readFrame(conn)
		if err != nil {
			select {
			case gaveUp := <-errs: // the pings gave the node up, and closed the connection
				return nil, gaveUp
			default:
				return nil, closeError(err)
			}
		}
		answered.Store(true)
		return frame, nil
	}
	go func() {
		if err := w.pingLoop(conn, address, &answered, done); err != nil {
			errs <- err
			conn.Close() // ends the read that waits, and a write blocked on a full buffer
		}
	}()

	if err := conn.WriteMessage(websocket.TextMessage, w.helloFrame()); err != nil {
		return false, err
	}
	frame, err := read()
	if err != nil {
		return false, err
	}
	if len(frame) == 0 || frame[0].T != "welcome" {
		return false, errors.New("the server did not answer hello with welcome")
	}
	w.welcome(frame[0])
	w.conn.connected(address)
	if err := w.handle(ctx, frame[1:]); err != nil {
		return true, err
	}

	go func() { errs <- w.writeLoop(conn, done) }()
	go w.heartbeatLoop(done)
	go func() {
		for {
			frame, err := read()
			if err != nil {
				errs <- err
				return
			}
			if err := w.handle(ctx, frame); err != nil {
				errs <- err
				return
			}
		}
	}()
	watch := ctx.Done()
	for {
		select {
		case err := <-errs:
			return true, err
		case <-watch:
			watch = nil
			w.startDrain()
			go func() {
				<-w.idleOrTimeout()
				errs <- nil
			}()
		}
	}
}

func readFrame(conn *websocket.Conn) ([]incoming, error) {
	_, data, err := conn.ReadMessage()
	if err != nil {
		return nil, err
	}
	return decodeFrame(data)
}

// closeError turns the refusals that retrying cannot fix into ErrRefused.
func closeError(err error) error {
	var ce *websocket.CloseError
	if errors.As(err, &ce) {
		switch ce.Code {
		case closeUnauthorized:
			return fmt.Errorf("%w: the token was refused (%s)", ErrRefused, ce.Text)
		case closeIDInUse:
			return fmt.Errorf("%w: another live connection uses this worker_id (%s)", ErrRefused, ce.Text)
		case closeBadFrame:
			return fmt.Errorf("%w: a frame did not fit the protocol: %s", ErrRefused, ce.Text)
		case closeNotReady:
			return fmt.Errorf("the node is not ready: %s", ce.Text)
		}
	}
	return err
}

func (w *Worker) helloFrame() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	agents := make([]agentSpec, 0, len(w.opts.Agents))
	for i := range w.opts.Agents {
		agents = append(agents, w.opts.Agents[i].spec())
	}
	held := []string{}
	for id := range w.running {
		held = append(held, id)
	}
	for id := range w.results {
		if _, ok := w.running[id]; !ok {
			held = append(held, id)
		}
	}
	data, err := json.Marshal([]hello{{
		T: "hello", WorkerID: w.opts.WorkerID, Agents: agents, Capacity: w.opts.Capacity,
		Attempts: held, Resume: w.resume, Protocol: ProtocolVersion,
		HistoryCache: w.history.sessions,
	}})
	if err != nil {
		panic(err)
	}
	return data
}

// welcome applies the server's answer: its heartbeat timeout, resume token and the
// attempts it no longer runs; then everything unacked is sent again. The history views
// of the last connection are dropped: the server sends each session's whole view first
// on a new connection.
func (w *Worker) welcome(m incoming) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.history.clear()
	resume := m.Resume
	w.resume = &resume
	if m.HeartbeatTimeout > 0 {
		w.timeout = time.Duration(m.HeartbeatTimeout * float64(time.Second))
	}
	for _, id := range m.Stop {
		w.abandonLocked(id, "the server no longer runs this attempt")
	}
	w.box = outbox{}
	if w.draining {
		w.box.add(drain())
	}
	for _, r := range w.results {
		w.box.add(r)
	}
	w.signal()
}

func (w *Worker) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// sendLocked queues one message for the next frame (w.mu held).
func (w *Worker) sendLocked(m message) {
	w.box.add(m)
	w.signal()
}

func (w *Worker) send(m message) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sendLocked(m)
}

// writeLoop sends whatever is ready as one frame each time it wakes.
func (w *Worker) writeLoop(conn *websocket.Conn, done <-chan struct{}) error {
	for {
		select {
		case <-done:
			return nil
		case <-w.wake:
		}
		w.mu.Lock()
		data, results := w.box.take()
		w.mu.Unlock()
		if data == nil {
			continue
		}
		if err := conn.WriteMessage(websocket.TextMessage, data); err != nil {
			return err
		}
		if results {
			failpoint.Hit("worker.after_send_result")
		}
	}
}

// pingLoop sends a WebSocket ping every PingInterval, and gives the node up when it did
// not answer the last one in time (no pong, no frame): a node that hung (a stopped
// process, a frozen VM, a partition) keeps the TCP connection open and silent, and a
// read on it would wait forever. It returns the reason once it gives up, nil when done
// closes. A tick that comes late means this process did not run (a failpoint paused the
// Worker, or the process was stopped): the answer may wait unread, so that tick only
// pings again, as in the TypeScript Worker.
func (w *Worker) pingLoop(conn *websocket.Conn, address string, answered *atomic.Bool, done <-chan struct{}) error {
	interval := w.opts.PingInterval
	answered.Store(true) // the upgrade just succeeded
	last := time.Now()
	for {
		select {
		case <-done:
			return nil
		case <-time.After(interval):
		}
		w.mu.Lock() // a paused failpoint blocks the whole Worker: the pings too
		w.mu.Unlock()
		late := time.Since(last) > interval*3/2
		last = time.Now()
		if !answered.Swap(false) && !late {
			w.log.warning("worker.ping_timeout", "the node did not answer a ping: giving it up",
				field{"address", address}, field{"interval", interval.Seconds()})
			return fmt.Errorf("the node answered no ping within %s: it hung, or the network to it did", interval)
		}
		// an error (a write that blocks past the deadline) leaves this ping unanswered
		_ = conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(interval))
	}
}
