// The public Worker: its options, NewWorker and Run, and how it stops (signals, drain).
// connection.go holds its connection to the server, runner.go the attempts it runs.

package dex

import (
	"context"
	"errors"
	"fmt"
	"log"
	"math/rand"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/dex-run/dex/sdk/go/internal/failpoint"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
)

// WorkerOptions configure a Worker. An option left at its zero value is read from its
// environment variable, the one the Python and TypeScript Workers read (durations in
// seconds, such as DEX_DRAIN_TIMEOUT=2.5), or else takes its default: options set in
// code win. Run returns an error naming any variable that does not parse.
type WorkerOptions struct {
	// Address is the server's URL, or several comma-separated, tried in turn
	// (DEX_ADDRESS, default http://127.0.0.1:7450). In a cluster the node reached lists
	// the others, and the Worker connects to each (docs/go-worker.md).
	Address string
	Agents  []Agent
	// Capacity is how many attempts the server may hand this Worker at once, and how
	// many it runs at once over all its connections (DEX_WORKER_CAPACITY, default 16): a
	// Step beyond it (in a cluster, other nodes' Steps took it) is handed back at once;
	// one that comes while a stopped attempt's code still runs waits for its slot.
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
	// agentNames are the agents' names, for the connections' logs
	agentNames []string
	// seed is the connection to the configured addresses (cluster.go)
	seed *node
	// nodes counts the member connections' goroutines
	nodes sync.WaitGroup
	// fatal receives what made a member connection give up for good
	fatal chan error

	mu      sync.Mutex
	running map[string]*attempt // handed out, not settled
	results map[string]message  // sent, waiting for an ack
	origins map[string]*origin  // the connection each held attempt is on (runner.go)
	// members are the connections to the nodes of a cluster the seed is not on
	members map[string]*node
	// change is closed (and replaced) at each change of the connections
	change chan struct{}
	// serving is the context the connections run in, once Run started
	serving  context.Context
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
		origins: map[string]*origin{}, members: map[string]*node{},
		change: make(chan struct{}), fatal: make(chan error, 1), timeout: 10 * time.Second,
		slots: make(chan struct{}, opts.Capacity),
	}
	names := make([]string, 0, len(opts.Agents))
	for i := range opts.Agents {
		w.agents[opts.Agents[i].Name] = &opts.Agents[i]
		names = append(names, opts.Agents[i].Name)
	}
	w.agentNames = names
	w.seed = w.newNode(addressList(opts.Address), true)
	if opts.Tracing {
		w.tracer = otel.Tracer(tracerName)
	}
	return w
}

// Run serves until ctx is done, then drains: it sends drain, lets running attempts finish
// (up to DrainTimeout) and hands back those not started. It leaves signals to the caller
// (RunUntilSignal is the common case: a process that drains on SIGTERM or Ctrl-C). It
// returns an error wrapping ErrRefused when the server refuses the Worker for good, and
// an error at once when an agent or an option (from code or the environment) is wrong.
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
	return w.connect(ctx)
}

// RunUntilSignal is Run, stopped also by SIGTERM or SIGINT (whose name the Worker logs as
// the reason it stopped): what a Worker process's main does.
func (w *Worker) RunUntilSignal(ctx context.Context) error {
	stopCtx, stop := w.stopOnSignal(ctx)
	defer stop()
	return w.Run(stopCtx)
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

// isDrained: the Worker stops, and nothing of it runs or waits for an ack any more.
func (w *Worker) isDrained() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.draining && len(w.running) == 0 && len(w.results) == 0
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
	for _, n := range w.nodesLocked() {
		w.sendOnLocked(n, drain())
	}
	for _, a := range w.running {
		if a.start != nil && a.startSeq == 0 {
			select {
			case a.start <- false:
			default:
			}
		}
	}
}
