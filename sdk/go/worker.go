package dex

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"math/big"
	"math/rand"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dex-run/dex/sdk/go/internal/failpoint"
	"github.com/gorilla/websocket"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
)

// WorkerOptions configure a Worker. An option left at its zero value is read from its
// environment variable, the one the Python and TypeScript Workers read (durations in
// seconds, such as DEX_DRAIN_TIMEOUT=2.5), or else takes its default: options set in
// code win. Run returns an error naming any variable that does not parse.
type WorkerOptions struct {
	// Address is the server's URL, or several comma-separated, tried in turn
	// (DEX_ADDRESS, default http://127.0.0.1:7450).
	Address string
	Agents  []Agent
	// Capacity is how many attempts the server may hand this Worker at once, and how
	// many it runs at once (DEX_WORKER_CAPACITY, default 16): an attempt beyond it, which
	// a stopped attempt's code still running can cause, waits for a slot.
	Capacity int
	// Token is the worker token, sent as Authorization: Bearer (DEX_WORKER_TOKEN).
	Token string
	// WorkerID names this Worker (DEX_WORKER_ID, default: host-pid-random).
	WorkerID string
	// HeartbeatInterval is the longest gap between two heartbeats of running attempts
	// (DEX_WORKER_HEARTBEAT_INTERVAL, default 1s); they come at least five times per
	// heartbeat timeout of the server.
	HeartbeatInterval time.Duration
	// DrainTimeout bounds how long a stopping Worker waits for running attempts
	// (DEX_DRAIN_TIMEOUT, default 30s; 0 there waits for none).
	DrainTimeout time.Duration
	// ReconnectInitial is the first wait before connecting again
	// (DEX_WORKER_RECONNECT_INITIAL, default 100ms); it doubles, with full jitter, up to
	// ReconnectMax (DEX_WORKER_RECONNECT_MAX, default 1s), as in the Python and
	// TypeScript Workers.
	ReconnectInitial time.Duration
	ReconnectMax     time.Duration
	// ConnectTimeout bounds one connection attempt, the WebSocket upgrade included,
	// before the next address is tried (DEX_WORKER_CONNECT_TIMEOUT, default 3s).
	ConnectTimeout time.Duration
	// PingInterval is the time between two WebSocket pings (DEX_WORKER_PING_INTERVAL,
	// default 2s). A node that answers a ping with nothing, neither its pong nor any
	// frame, before the next one is due is given up, and the next address tried: a node
	// that hung (stopped, frozen, cut off) keeps the connection open and silent.
	PingInterval time.Duration
	// Tracing turns on OpenTelemetry spans of the attempts it runs, under the server's
	// (DEX_TRACING: true or false, 1 or 0, yes or no, on or off; default off), sent to the
	// global tracer provider (otel.SetTracerProvider). The ctx a model or tool gets
	// carries its attempt's span.
	Tracing bool
	// LogFormat is how the Worker logs: "console" (one line for people, the default) or
	// "json" (one object a line), the lines and actions of the Python Worker
	// (DEX_LOG_FORMAT; see docs/operations.md, "Logs").
	LogFormat string
	// LogLevel is the least level logged: "debug", "info" (the default), "warning" or
	// "error" (DEX_LOG_LEVEL).
	LogLevel string
	// Logger, when set, receives each line (after its own prefix and flags: give it none,
	// log.New(w, "", 0), to keep the format); by default the lines go to stderr.
	Logger *log.Logger
}

// ErrRefused is returned by Run when the server refuses this Worker for good
// (a refused token, or a worker_id in use).
var ErrRefused = errors.New("dex: the server refused this Worker")

// Worker connects to Dex, runs the Steps it is handed and sends their results.
type Worker struct {
	opts   WorkerOptions
	config error // what is wrong with the options (a variable that does not parse, no address): Run returns it
	agents map[string]*Agent
	log    *logger
	conn   *connectionLog

	mu       sync.Mutex
	running  map[string]*attempt // handed out, not settled
	results  map[string]message  // sent, waiting for an ack
	history  *historyCache       // each session's model view, as last handed out
	box      outbox
	wake     chan struct{}
	resume   *string
	timeout  time.Duration // welcome.heartbeat_timeout
	seq      int64
	draining bool
	drainAt  time.Time
	// slots holds one token per attempt whose code runs: never more than Capacity,
	// even while the code of an attempt the server stopped has not returned yet.
	slots chan struct{}
	// tracer makes the attempts' spans (nil: Tracing off)
	tracer trace.Tracer
	// stopReason says why the Worker drains: "shutdown" (its context ended) or a
	// signal's name
	stopReason string
}

type attempt struct {
	step     step
	history  []Item // RunModel and CompactContext: the model's view
	cancel   context.CancelFunc
	startSeq int64
	startAt  time.Time
	start    chan bool // the start acknowledgement (needs_start_ack), buffered
}

// NewWorker returns a Worker; Run checks the agents and the options, and starts it.
// It reads the options not set in code from the environment (see WorkerOptions).
func NewWorker(opts WorkerOptions) *Worker {
	opts, config := opts.resolve(os.Getenv)
	if opts.WorkerID == "" {
		host, _ := os.Hostname()
		opts.WorkerID = fmt.Sprintf("%s-%d-%06x", host, os.Getpid(), rand.Intn(1<<24))
	}
	logger := newLogger(opts.LogFormat, opts.LogLevel, opts.Logger)
	w := &Worker{
		opts: opts, config: config, agents: map[string]*Agent{}, log: logger,
		stopReason: "shutdown",
		running:    map[string]*attempt{}, results: map[string]message{},
		history: newHistoryCache(historySessions),
		wake:    make(chan struct{}, 1), timeout: 10 * time.Second,
		slots: make(chan struct{}, opts.Capacity),
	}
	names := make([]string, 0, len(opts.Agents))
	for i := range opts.Agents {
		w.agents[opts.Agents[i].Name] = &opts.Agents[i]
		names = append(names, opts.Agents[i].Name)
	}
	w.conn = &connectionLog{log: logger, workerID: opts.WorkerID, agents: names, capacity: opts.Capacity}
	if opts.Tracing {
		w.tracer = otel.Tracer(tracerName)
	}
	return w
}

// Run serves until ctx is done or SIGTERM/SIGINT arrives, then drains: it sends drain,
// lets running attempts finish (up to DrainTimeout) and hands back those not started.
// It returns an error wrapping ErrRefused when the server refuses the Worker for good,
// and an error at once when an agent or an option (from code or the environment) is wrong.
func (w *Worker) Run(ctx context.Context) error {
	if w.config != nil {
		return w.config
	}
	if err := failpoint.Err(); err != nil {
		return err
	}
	for i := range w.opts.Agents {
		if err := w.opts.Agents[i].validate(); err != nil {
			return err
		}
	}
	stopCtx, stop := w.stopOnSignal(ctx)
	defer stop()
	addresses := addressList(w.opts.Address)
	failures := 0
	for {
		for _, address := range addresses {
			welcomed, err := w.session(stopCtx, address)
			if errors.Is(err, ErrRefused) {
				w.conn.stopped("", err)
				return err
			}
			if welcomed {
				failures = 0
			}
			if w.stopping(stopCtx) {
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
		case <-stopCtx.Done():
		case <-time.After(w.backoff(failures)):
		}
		if w.stopping(stopCtx) {
			w.conn.stopped(w.reason(), nil)
			return nil
		}
	}
}

// stopOnSignal is ctx, ended also by SIGTERM or SIGINT, whose name becomes the reason
// the Worker gives for stopping.
func (w *Worker) stopOnSignal(ctx context.Context) (context.Context, func()) {
	stopCtx, cancel := context.WithCancel(ctx)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		select {
		case sig := <-signals:
			name := "SIGTERM"
			if sig == syscall.SIGINT {
				name = "SIGINT"
			}
			w.mu.Lock()
			w.stopReason = name
			w.mu.Unlock()
			cancel()
		case <-stopCtx.Done():
		}
	}()
	return stopCtx, func() {
		signal.Stop(signals)
		cancel()
	}
}

func (w *Worker) reason() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stopReason
}

// stopping: once ctx is done the Worker drains; it stops when nothing of it runs or
// waits for an ack any more, or the drain timeout ran out.
func (w *Worker) stopping(ctx context.Context) bool {
	if ctx.Err() == nil {
		return false
	}
	w.startDrain()
	w.mu.Lock()
	late := time.Since(w.drainAt) > w.opts.DrainTimeout
	w.mu.Unlock()
	return late || w.isDrained()
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

// isDrained: the Worker stops, and nothing of it runs or waits for an ack any more.
func (w *Worker) isDrained() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.draining && len(w.running) == 0 && len(w.results) == 0
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

func (w *Worker) idleOrTimeout() <-chan struct{} {
	done := make(chan struct{})
	go func() {
		deadline := time.Now().Add(w.opts.DrainTimeout)
		for !w.isDrained() && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		close(done)
	}()
	return done
}

func (w *Worker) startDrain() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.draining {
		return
	}
	w.draining = true
	w.drainAt = time.Now()
	w.log.info("worker.draining",
		fmt.Sprintf("draining: taking no new Steps, finishing %d running attempts within %ss",
			len(w.running), fieldText(w.opts.DrainTimeout.Seconds())),
		field{"running", len(w.running)}, field{"timeout", w.opts.DrainTimeout.Seconds()})
	w.sendLocked(message{"t": "drain"})
	for _, a := range w.running {
		if a.start != nil && a.startSeq == 0 {
			select {
			case a.start <- false:
			default:
			}
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
		w.box.add(message{"t": "drain"})
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

// heartbeatLoop names every running attempt each HeartbeatInterval, and at least five
// times per heartbeat timeout.
func (w *Worker) heartbeatLoop(done <-chan struct{}) {
	for {
		w.mu.Lock()
		interval := w.timeout / 5
		w.mu.Unlock()
		if interval > w.opts.HeartbeatInterval {
			interval = w.opts.HeartbeatInterval
		}
		select {
		case <-done:
			return
		case <-time.After(interval):
		}
		w.mu.Lock()
		ids := []string{}
		for id, a := range w.running {
			if _, sent := w.results[id]; !sent {
				ids = append(ids, id)
			}
			if a.start != nil && a.startSeq != 0 && time.Since(a.startAt) > w.timeout/2 {
				w.askStartLocked(a) // the answer came too late, or not at all: ask again
			}
		}
		if len(ids) > 0 {
			w.sendLocked(message{"t": "hb", "attempts": ids})
		}
		w.mu.Unlock()
	}
}

// handle applies one frame from the server, in order.
func (w *Worker) handle(ctx context.Context, frame []incoming) error {
	for _, m := range frame {
		switch m.T {
		case "step":
			var s step
			if err := json.Unmarshal(m.raw, &s); err != nil {
				return fmt.Errorf("a step does not decode: %w", err)
			}
			w.handOut(s)
		case "hb":
			w.heartbeatReply(m)
		case "ack":
			w.mu.Lock()
			if !m.OK {
				w.log.info("worker.result_refused", "result refused: "+deref(m.Error),
					field{"attempt_id", m.AttemptID})
			}
			delete(w.results, m.AttemptID)
			w.forgetLocked(m.AttemptID)
			w.mu.Unlock()
		case "cancel":
			w.mu.Lock()
			w.abandonLocked(m.AttemptID, "the server cancelled this attempt")
			w.mu.Unlock()
		case "welcome":
			return errors.New("a second welcome on one connection")
		}
	}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func (w *Worker) heartbeatReply(m incoming) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, status := range m.Status {
		a, ok := w.running[id]
		if !ok {
			continue
		}
		if status == "stop" {
			w.abandonLocked(id, "the server no longer runs this attempt")
			continue
		}
		if a.start != nil && m.Seq != nil && *m.Seq == a.startSeq && time.Since(a.startAt) <= w.timeout/2 {
			select {
			case a.start <- true:
			default:
			}
			a.start = nil
		}
	}
}

// abandonLocked stops an attempt's code and drops its result (stop, cancel, welcome.stop).
func (w *Worker) abandonLocked(id, why string) {
	a, ok := w.running[id]
	if ok {
		w.log.info("worker.attempt_abandoned", why,
			field{"attempt_id", id}, field{"session_id", a.step.SessionID})
		if a.start != nil {
			select {
			case a.start <- false:
			default:
			}
		}
		a.cancel()
	}
	delete(w.results, id)
	w.forgetLocked(id)
}

func (w *Worker) forgetLocked(id string) {
	delete(w.running, id)
}

func (w *Worker) askStartLocked(a *attempt) {
	w.seq++
	a.startSeq = w.seq
	a.startAt = time.Now()
	w.sendLocked(message{"t": "hb", "attempts": []string{a.step.AttemptID}, "seq": a.startSeq})
}

func (w *Worker) handOut(s step) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, dup := w.running[s.AttemptID]; dup {
		return
	}
	a := &attempt{step: s}
	switch s.StepType {
	case StepRunModel:
		// even a hand-out that goes back: the server counts its view as sent
		view, ok, err := w.history.view(s.SessionID, s.HistoryBase, s.History)
		if err != nil {
			w.settleLocked(failMessage(s, "the hand-out's history does not fit the protocol: "+err.Error(), false))
			return
		}
		if !ok { // it builds on a view this Worker lacks: the server sends it whole next
			w.log.info("worker.history_missing", "the hand-out builds on a view this Worker lacks",
				field{"attempt_id", s.AttemptID}, field{"session_id", s.SessionID},
				field{"history_base", s.HistoryBase})
			w.settleLocked(message{"t": "back", "attempt_id": s.AttemptID, "reason": "history"})
			return
		}
		a.history = view
	case StepCompactContext: // the whole view, every time
		if err := checkItems(s.History, 0); err != nil {
			w.settleLocked(failMessage(s, "the hand-out's history does not fit the protocol: "+err.Error(), false))
			return
		}
		a.history = s.History
	}
	a.step.History = nil // kept once, in a.history
	if w.draining {
		w.settleLocked(message{"t": "back", "attempt_id": s.AttemptID})
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	w.running[s.AttemptID] = a
	go w.run(ctx, a)
}

// settleLocked answers a hand-out at once, without running it, and keeps the answer
// until its ack (w.mu held).
func (w *Worker) settleLocked(m message) {
	id, _ := m["attempt_id"].(string)
	w.results[id] = m
	w.sendLocked(m)
}

// run runs one attempt, once a slot is free, and keeps its result until the ack.
func (w *Worker) run(ctx context.Context, a *attempt) {
	s := a.step
	select {
	case w.slots <- struct{}{}:
	default:
		w.log.info("worker.at_capacity", fmt.Sprintf("waiting for a slot (capacity %d)", cap(w.slots)),
			field{"attempt_id", s.AttemptID}, field{"session_id", s.SessionID})
		select {
		case w.slots <- struct{}{}:
		case <-ctx.Done():
			return // stopped or cancelled before it started
		}
	}
	result := w.execute(ctx, a)
	<-w.slots // the attempt's code returned
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, still := w.running[s.AttemptID]; !still || result == nil {
		return // stopped or cancelled meanwhile, or forgotten: no result is wanted
	}
	w.results[s.AttemptID] = result
	w.sendLocked(result)
}

// execute runs a hand-out and returns the message that settles it (nil: none).
func (w *Worker) execute(ctx context.Context, a *attempt) (result message) {
	s := a.step
	agent, ok := w.agents[s.Agent]
	if !ok {
		return failMessage(s, fmt.Sprintf("this Worker serves no agent %q", s.Agent), false)
	}
	if w.tracer != nil {
		var span trace.Span
		ctx, span = w.startSpan(ctx, agent, s)
		defer func() { endSpan(ctx, span, s, result) }() // runs after the recover below
	}
	defer func() {
		if r := recover(); r != nil {
			result = failMessage(s, fmt.Sprintf("panic: %v", r), true)
		}
	}()
	switch s.StepType {
	case StepRunModel, StepCompactContext:
		return w.runModel(ctx, agent, a)
	case StepCallTool, StepCallSingleAttemptTool, StepPollToolTask, StepCheckToolCall:
		return w.runTool(ctx, agent, a)
	}
	return failMessage(s, fmt.Sprintf("a Worker does not run %s Steps", s.StepType), false)
}

func (w *Worker) runModel(ctx context.Context, agent *Agent, a *attempt) message {
	s := a.step
	req := ModelRequest{
		SessionID: s.SessionID, Agent: agent.Name, Instructions: agent.Instructions,
		History: a.history, Tools: agent.Tools, Attempt: s.Attempt,
		Traceparent: deref(s.Traceparent),
	}
	if s.StepType == StepCompactContext {
		req.Tools = nil
		w.hitFailpoint("worker.compact_context.running")
		summary, err := agent.Model.Summarize(ctx, req)
		if err != nil {
			return modelFailure(s, err)
		}
		return done(s, summary)
	}
	w.hitFailpoint("worker.run_model.before_output")
	emit := func(text string) {
		if text != "" {
			w.send(message{"t": "delta", "attempt_id": s.AttemptID, "text": text})
		}
	}
	response, err := agent.Model.Stream(ctx, req, emit)
	if err != nil {
		return modelFailure(s, err)
	}
	if response.ToolCalls == nil {
		response.ToolCalls = []ModelToolCall{}
	}
	for i := range response.ToolCalls {
		if response.ToolCalls[i].Arguments == nil {
			response.ToolCalls[i].Arguments = map[string]any{}
		}
	}
	if response.StopReason == "" {
		response.StopReason = "end_turn"
	}
	if response.ApprovalRequired == nil {
		response.ApprovalRequired = []string{}
	}
	for _, call := range response.ToolCalls {
		if tool := agent.tool(call.Name); tool != nil && tool.NeedsApproval != nil && tool.needsApproval(call.Arguments) {
			response.ApprovalRequired = append(response.ApprovalRequired, call.ID)
		}
	}
	return done(s, response)
}

// hitFailpoint hits the failpoint name while nothing of this Worker moves (no heartbeat,
// no read): a paused failpoint blocks the whole Worker, as in the Python Worker. With no
// failpoint armed it costs one atomic load: no lock is taken on the model and tool path.
func (w *Worker) hitFailpoint(name string) {
	if !failpoint.Armed() {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	failpoint.Hit(name)
}

func (w *Worker) runTool(ctx context.Context, agent *Agent, a *attempt) message {
	s := a.step
	tool := agent.tool(deref(s.Tool))
	if tool == nil {
		return toolFailed(s, fmt.Sprintf("this Worker's agent %q has no tool %q", agent.Name, deref(s.Tool)))
	}
	// invalid arguments: the body never runs; valid ones gain their parameters' defaults
	args, err := checkArguments(tool.Name, tool.Parameters, s.Arguments)
	if err != nil {
		return toolError(s, err)
	}
	w.hitFailpoint("worker.before_first_heartbeat")
	if s.NeedsStartAck {
		if !w.startAcknowledged(a) {
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.draining {
				if _, still := w.running[s.AttemptID]; still {
					return message{"t": "back", "attempt_id": s.AttemptID}
				}
			}
			w.log.info("worker.start_refused", "the server no longer runs this attempt: not starting it",
				field{"attempt_id", s.AttemptID})
			w.forgetLocked(s.AttemptID)
			return nil
		}
	}
	call := &CallContext{
		SessionID: s.SessionID, CallID: deref(s.CallID), Tool: tool.Name,
		IdempotencyKey: deref(s.IdempotencyKey), Attempt: s.Attempt,
		Answers: s.Answers, SleepsDone: s.SleepsDone, Traceparent: deref(s.Traceparent),
	}
	switch s.StepType {
	case StepPollToolTask:
		value, err := tool.Poll(ctx, call, s.TaskHandle)
		if err != nil {
			return toolError(s, err)
		}
		if value == Pending {
			return done(s, toolOutcome{Status: "pending"})
		}
		return succeeded(s, value)
	case StepCheckToolCall:
		if tool.Check == nil {
			return toolFailed(s, fmt.Sprintf("tool %q has no check", tool.Name))
		}
		verdict, err := tool.Check(ctx, call, args)
		if err != nil {
			return toolError(s, err)
		}
		return done(s, toolOutcome{Status: "checked", Happened: verdict.Happened, Result: verdict.Result})
	}
	w.hitFailpoint("worker.tool_running")
	value, err := tool.Func(ctx, call, args)
	if err != nil {
		return toolError(s, err)
	}
	return succeeded(s, value)
}

// startAcknowledged asks the node whether to start (an hb with a seq of ours) and waits
// for an ok in time; the heartbeat loop asks again when an answer is late.
func (w *Worker) startAcknowledged(a *attempt) bool {
	start := make(chan bool, 1)
	w.mu.Lock()
	if w.draining {
		w.mu.Unlock()
		return false
	}
	a.start = start
	w.askStartLocked(a)
	w.mu.Unlock()
	return <-start
}

func done(s step, result any) message {
	raw, err := json.Marshal(result)
	if err != nil {
		return failMessage(s, fmt.Sprintf("the result does not encode as JSON: %v", err), false)
	}
	if n, huge := hugeInteger(raw); huge {
		// sent, the node would close the connection (4400) on this frame and on every
		// resend: the attempt fails instead, and the node decides what runs again, as
		// the Python and TypeScript Workers do
		return failMessage(s, fmt.Sprintf("the result cannot be sent as JSON: the integer %s "+
			"is beyond what the protocol carries (-2^63 to 2^64-1); send it as a string", n), true)
	}
	return message{"t": "done", "attempt_id": s.AttemptID, "result": json.RawMessage(raw)}
}

var (
	smallestInteger = new(big.Int).Neg(new(big.Int).Lsh(big.NewInt(1), 63))
	largestInteger  = new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 64), big.NewInt(1))
)

// hugeInteger finds an integer in the JSON text raw that lies beyond -2^63..2^64-1 (a
// big.Int, a json.Number): the node refuses a frame that holds one. Only text with a run
// of 19 digits (2^63 has 19) is decoded to look.
func hugeInteger(raw []byte) (string, bool) {
	run := 0
	for _, c := range raw {
		if c < '0' || c > '9' {
			run = 0
		} else if run++; run >= 19 {
			break
		}
	}
	if run < 19 {
		return "", false
	}
	decoder := json.NewDecoder(bytes.NewReader(raw))
	decoder.UseNumber()
	var value any
	if decoder.Decode(&value) != nil {
		return "", false
	}
	return hugeIn(value)
}

func hugeIn(value any) (string, bool) {
	switch v := value.(type) {
	case json.Number:
		if strings.ContainsAny(string(v), ".eE") {
			return "", false // a float: JSON numbers with a fraction or exponent are not integers
		}
		n, ok := new(big.Int).SetString(string(v), 10)
		if ok && (n.Cmp(smallestInteger) < 0 || n.Cmp(largestInteger) > 0) {
			return string(v), true
		}
	case []any:
		for _, item := range v {
			if n, huge := hugeIn(item); huge {
				return n, true
			}
		}
	case map[string]any:
		for _, item := range v {
			if n, huge := hugeIn(item); huge {
				return n, true
			}
		}
	}
	return "", false
}

func succeeded(s step, value any) message {
	return done(s, toolOutcome{Status: "succeeded", Result: value})
}

func toolFailed(s step, text string) message {
	return done(s, toolOutcome{Status: "failed", Error: &text})
}

// toolError: a ToolError is a known failure, a wait ends the call for now, anything
// else fails the attempt (the code may have run).
func toolError(s step, err error) message {
	var known *ToolError
	if errors.As(err, &known) {
		return toolFailed(s, known.Message)
	}
	var wait *waitError
	if errors.As(err, &wait) {
		return done(s, wait.outcome)
	}
	return failMessage(s, err.Error(), true)
}

func modelFailure(s step, err error) message {
	var me *ModelError
	if errors.As(err, &me) {
		return failMessage(s, me.Message, me.Retryable)
	}
	return failMessage(s, err.Error(), true)
}

func failMessage(s step, text string, retryable bool) message {
	return message{"t": "fail", "attempt_id": s.AttemptID, "error": recoveryError{
		Message: text, AttemptProgress: "NOT_COMPLETED", Retryable: retryable,
	}}
}
