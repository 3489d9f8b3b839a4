// The Worker's connection to one node: its addresses tried in turn with a pause that
// grows, hello and welcome, the outbox written as frames, pings, and the log of each
// connection's life. In a cluster the Worker holds one per node (cluster.go).

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

// serveNode connects n to its addresses in turn, and again after a pause that grows,
// until the server refuses this Worker for good (ErrRefused) or the Worker stopped (ctx
// done, and drained or out of time). In a cluster, while no connected node lists its
// address and it is down, it does not reconnect: a member stops for good (the node
// left), the seed waits until it is listed again or no node is connected. In a cluster,
// the attempts on n are strays once its connection drops (droppedLocked), claimed at once
// on the other connections. It logs the life of each connection.
func (w *Worker) serveNode(ctx context.Context, n *node) error {
	failures := 0
	next := 0
	for {
		changed := w.changes() // before the check: a change right after it still wakes the wait
		if !w.wanted(n) {
			if !n.seed {
				w.mu.Lock()
				address := n.address
				w.mu.Unlock()
				n.log.letGo(address)
				return nil
			}
			select {
			case <-ctx.Done():
			case <-changed:
			}
			if w.stopping(ctx) {
				return nil
			}
			continue
		}
		address := w.nextAddress(n, &next)
		welcomed, err := w.session(ctx, n, address)
		w.mu.Lock()
		w.droppedLocked(n)
		w.changedLocked()
		w.mu.Unlock()
		if errors.Is(err, ErrRefused) {
			if !errors.Is(err, errIDInUse) || !w.othersLinked(n) {
				return err
			}
			// another connection of this Worker is on that node (a seed through a load balancer)
		}
		if welcomed {
			failures = 0
		}
		if w.stopping(ctx) {
			return nil
		}
		if err == nil {
			err = errors.New("the connection closed")
		}
		if welcomed {
			reconnecting := w.wanted(n)
			n.log.lost(address, err, reconnecting)
			if !reconnecting && !n.seed {
				return nil
			}
		} else { // unreachable, or closed before its welcome: a standby, say
			n.log.failed(address, err)
		}
		if next%len(n.addresses) != 0 {
			continue // the next address at once
		}
		failures++
		// the pause ends early when the Worker is told to stop, or lets n go
		select {
		case <-ctx.Done():
		case <-n.release:
		case <-time.After(w.backoff(failures)):
		}
		if w.stopping(ctx) {
			return nil
		}
	}
}

// nextAddress is n's next address: in turn, but none another of the Worker's
// connections is on (two connections of one Worker id to one node refuse each other).
func (w *Worker) nextAddress(n *node, next *int) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	for range n.addresses {
		address := n.addresses[*next%len(n.addresses)]
		*next++
		if !w.takenLocked(address, n) {
			n.address = address
			return address
		}
	}
	return n.address
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

// session runs one connection of n to one address until it drops; welcomed says whether
// the server answered hello.
func (w *Worker) session(ctx context.Context, n *node, address string) (welcomed bool, err error) {
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
	read := func() ([]serverMessage, error) {
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

	if err := conn.WriteMessage(websocket.TextMessage, w.helloFrameOf(n)); err != nil {
		return false, err
	}
	frame, err := read()
	if err != nil {
		return false, err
	}
	var welcome welcomeMessage
	isWelcome := false
	if len(frame) > 0 {
		welcome, isWelcome = frame[0].(welcomeMessage)
	}
	if !isWelcome {
		return false, errors.New("the server did not answer hello with welcome")
	}
	w.welcomeOn(n, welcome)
	n.log.connected(address)
	w.mu.Lock()
	w.listLocked(n, welcome.Members)
	// at once, not a heartbeat later: a stray the hello reclaimed is taken by the reply,
	// and the result it kept goes out; the heartbeat loop beats on from here, on the
	// welcome's interval
	w.beatLocked(n)
	w.mu.Unlock()
	if err := w.handleOn(ctx, n, frame[1:]); err != nil {
		return true, err
	}

	go func() { errs <- w.writeLoop(conn, n, done) }()
	go w.heartbeatLoop(n, done)
	go func() {
		for {
			frame, err := read()
			if err != nil {
				errs <- err
				return
			}
			if err := w.handleOn(ctx, n, frame); err != nil {
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

func readFrame(conn *websocket.Conn) ([]serverMessage, error) {
	_, data, err := conn.ReadMessage()
	if err != nil {
		return nil, err
	}
	return decodeFrame(data)
}

// errIDInUse is the refusal of a worker_id in use: for good, unless another connection
// of this Worker is the one that uses it (a seed through a load balancer, in a cluster).
var errIDInUse = fmt.Errorf("%w: another live connection uses this worker_id", ErrRefused)

// closeError turns the refusals that retrying cannot fix into ErrRefused.
func closeError(err error) error {
	var ce *websocket.CloseError
	if errors.As(err, &ce) {
		switch ce.Code {
		case closeUnauthorized:
			return fmt.Errorf("%w: the token was refused (%s)", ErrRefused, ce.Text)
		case closeIDInUse:
			return fmt.Errorf("%w (%s)", errIDInUse, ce.Text)
		case closeBadFrame:
			return fmt.Errorf("%w: a frame did not fit the protocol: %s", ErrRefused, ce.Text)
		case closeNotReady:
			return fmt.Errorf("the node is not ready: %s", ce.Text)
		}
	}
	return err
}

// helloFrame is the seed's hello (tests).
func (w *Worker) helloFrame() []byte { return w.helloFrameOf(w.seed) }

// helloFrameOf is n's hello: it names the attempts handed out on n that the Worker holds.
func (w *Worker) helloFrameOf(n *node) []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	agents := make([]agentSpec, 0, len(w.opts.Agents))
	for i := range w.opts.Agents {
		agents = append(agents, w.opts.Agents[i].spec())
	}
	held := w.heldLocked(n)
	data, err := json.Marshal([]hello{{
		T: "hello", WorkerID: w.opts.WorkerID, Agents: agents, Capacity: w.opts.Capacity,
		Attempts: held, Resume: n.resume, Protocol: ProtocolVersion,
		HistoryCache: n.history.sessions,
	}})
	if err != nil {
		panic(err)
	}
	return data
}

// welcome applies the seed's welcome (tests).
func (w *Worker) welcome(m welcomeMessage) { w.welcomeOn(w.seed, m) }

// welcomeOn applies n's node's answer: its heartbeat timeout, resume token and the
// attempts it no longer runs; then everything unacked of n is sent again (a stray's
// result waits for the node that takes it: a claim, or n's node's hb ok). The history
// views of n's last connection are dropped: the server sends each session's whole view
// first on a new connection.
func (w *Worker) welcomeOn(n *node, m welcomeMessage) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n.history.clear()
	resume := m.Resume
	n.resume = &resume
	n.linked = true
	if m.HeartbeatTimeout > 0 {
		w.timeout = time.Duration(m.HeartbeatTimeout * float64(time.Second))
	}
	for _, id := range m.Stop {
		if w.originLocked(id) == n {
			w.abandonLocked(id, "the server no longer runs this attempt")
		}
	}
	n.box = outbox{}
	if w.draining {
		n.box.add(drain())
	}
	for id, r := range w.results {
		if o := w.origins[id]; w.originLocked(id) == n && (o == nil || !o.stray) {
			n.box.add(r)
		}
	}
	wakeWriter(n)
}

func wakeWriter(n *node) {
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

// originLocked is the connection attempt id is on: the one it was handed out on, or
// claimed on (w.mu held).
func (w *Worker) originLocked(id string) *node {
	if o, ok := w.origins[id]; ok {
		return o.node
	}
	return w.seed
}

// sendLocked queues one message about an attempt for the next frame of the connection
// it is on now (w.mu held): a claim may have moved it since it was handed out.
func (w *Worker) sendLocked(m message) {
	w.sendOnLocked(w.originLocked(m.attempt()), m)
}

// sendOnLocked queues one message for n's next frame (w.mu held).
func (w *Worker) sendOnLocked(n *node, m message) {
	n.box.add(m)
	wakeWriter(n)
}

func (w *Worker) send(m message) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sendLocked(m)
}

// writeLoop sends whatever is ready on n as one frame each time it wakes.
func (w *Worker) writeLoop(conn *websocket.Conn, n *node, done <-chan struct{}) error {
	for {
		select {
		case <-done:
			return nil
		case <-n.wake:
		}
		w.mu.Lock()
		data, results := n.box.take()
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
		// a paused failpoint holds w.mu and so blocks the whole Worker: the pings too
		w.mu.Lock()
		//lint:ignore SA2001 the wait for the lock is the point
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
