// The attempts a Worker runs: hand-outs, heartbeats and the start acknowledgement,
// the frames the server sends about them, and running their models and tools.
//
// Every message about an attempt goes on the connection it is on (its origin). In a
// cluster, when that node dies or gives the session up, the attempt runs on as a stray,
// claimed on every connection until the node that took its session over answers: it is
// that connection's from then on, or it stops (docs/worker-protocol.md, rule 14). A
// stray's result waits for the node that takes it.

package dex

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dex-run/dex/sdk/go/internal/failpoint"
	"go.opentelemetry.io/otel/trace"
)

type attempt struct {
	step     step
	history  []Item // RunModel and CompactContext: the model's view
	cancel   context.CancelFunc
	startSeq int64
	startAt  time.Time
	start    chan bool // the start acknowledgement (needs_start_ack), buffered
}

// origin is the connection a held attempt (running, or its result unacked) is on.
type origin struct {
	node   *node
	resume string // the resume token it was handed out under (its node's then)
	// stray: its node may not run it any more (in a cluster, the connection dropped, or
	// the reply to its node's beat left it out): claimed on every connection until a
	// node answers; its result, if any, waits for the node that takes it (takeLocked)
	stray bool
}

// beat is a connection's last beat of all it holds: its seq, and the attempts it named.
// Only the reply with that seq marks strays: a named attempt, still held on that
// connection, that the reply leaves out.
type beat struct {
	seq int64
	ids []string
}

// heartbeatLoop beats on n every heartbeat interval from its welcome on (beatLocked; the
// welcome itself was answered with a beat at once): HeartbeatInterval, and at least five
// times per the welcome's heartbeat timeout.
func (w *Worker) heartbeatLoop(n *node, done <-chan struct{}) {
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
		w.beatLocked(n)
		w.mu.Unlock()
	}
}

// beatLocked beats every attempt held on n (running, or its result unacked) in one hb
// with a seq of its own; before that, in a cluster, it claims the Worker's strays on n,
// and asks again to start what got no timely answer (w.mu held). The heartbeat loop's
// tick, and the answer to a welcome, at once: a stray the hello reclaimed is taken by
// the reply, and the result it kept goes out (a first beat an interval later may come
// after the heartbeat timeout).
func (w *Worker) beatLocked(n *node) {
	// before the heartbeat, in the same frame: this node may be the one that took a
	// stray's session over, and it answers the claim first
	w.claimOnLocked(n)
	for id, a := range w.running {
		if w.originLocked(id) == n && a.start != nil && a.startSeq != 0 && time.Since(a.startAt) > w.timeout/2 {
			w.askStartLocked(a) // the answer came too late, or not at all: ask again
		}
	}
	if ids := w.heldLocked(n); len(ids) > 0 {
		w.seq++
		seq := w.seq
		n.beat = &beat{seq: seq, ids: ids}
		w.sendOnLocked(n, heartbeat(ids, &seq))
	}
}

// handle applies one frame from the seed's node (tests).
func (w *Worker) handle(ctx context.Context, frame []serverMessage) error {
	return w.handleOn(ctx, w.seed, frame)
}

// handleOn applies one frame from n's node, in order; a message about an attempt
// another node handed out does nothing, nor does a message of an unknown t.
func (w *Worker) handleOn(ctx context.Context, n *node, frame []serverMessage) error {
	for _, m := range frame {
		switch m := m.(type) {
		case step:
			w.handOutOn(n, m)
		case heartbeatReplyMessage:
			w.heartbeatReply(n, m)
		case claimedMessage:
			w.claimed(n, m.Status)
		case membersMessage:
			w.mu.Lock()
			w.listLocked(n, m.Members)
			w.mu.Unlock()
		case ackMessage:
			w.mu.Lock()
			if w.originLocked(m.AttemptID) != n {
				w.mu.Unlock()
				continue
			}
			if !m.OK {
				w.log.info("worker.result_refused", "result refused: "+deref(m.Error),
					field{"attempt_id", m.AttemptID})
			}
			delete(w.results, m.AttemptID)
			w.forgetLocked(m.AttemptID)
			w.mu.Unlock()
		case cancelMessage:
			w.mu.Lock()
			if w.originLocked(m.AttemptID) == n {
				w.abandonLocked(m.AttemptID, "cancelled by the server")
			}
			w.mu.Unlock()
		case welcomeMessage:
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

// heartbeatReply applies n's node's answer to a heartbeat of n: an ok extends, and a
// timely ok to a start ask starts; a stop stops (an attempt whose result is kept waits
// for its ack). Only the reply to n's last beat of all it held marks strays: each attempt
// it named, still held on n, that it leaves out (n's node gave its session up); replies
// to other heartbeats (a start ask) never do. An ok to a stray of n takes it back: its
// node, back, owns it again.
func (w *Worker) heartbeatReply(n *node, m heartbeatReplyMessage) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if b := n.beat; b != nil && m.Seq != nil && *m.Seq == b.seq {
		for _, id := range b.ids {
			if _, named := m.Status[id]; !named && w.holdsLocked(id) && w.originLocked(id) == n {
				if o := w.origins[id]; o != nil {
					o.stray = true
				}
			}
		}
	}
	for id, status := range m.Status {
		if !w.holdsLocked(id) || w.originLocked(id) != n {
			continue
		}
		a := w.running[id]
		_, kept := w.results[id]
		if status != "ok" {
			if !kept {
				w.abandonLocked(id, "the server no longer runs this attempt")
			}
			continue
		}
		if a != nil && a.start != nil && m.Seq != nil && *m.Seq == a.startSeq && time.Since(a.startAt) <= w.timeout/2 {
			select {
			case a.start <- true:
			default:
			}
			a.start = nil
		}
		if o := w.origins[id]; o != nil && o.stray { // n's node answers for it again
			w.takeLocked(id, n)
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

// droppedLocked: n's connection dropped (w.mu held). Its last beat is forgotten. If its
// node listed members (a cluster's, which may be gone for good) its attempts are strays,
// claimed at once on every other connection whose node listed members; a single node's
// are reclaimed by the hello when it reconnects.
func (w *Worker) droppedLocked(n *node) {
	cluster := len(n.members) > 0
	n.linked, n.members, n.beat = false, nil, nil
	if !cluster {
		return
	}
	w.lostLocked(n)
	for _, other := range w.nodesLocked() {
		w.claimOnLocked(other)
	}
}

// lostLocked: n's connection to a cluster's node dropped: the attempts on it are strays
// until its node, back, or the node that took their sessions over, answers for them
// (w.mu held).
func (w *Worker) lostLocked(n *node) {
	n.beat = nil
	for _, o := range w.origins {
		if o.node == n {
			o.stray = true
		}
	}
}

// claimOnLocked claims the Worker's strays on n, if n is up and its node listed members
// (w.mu held): a single node needs no claim (a hello reclaims), and an older node would
// refuse the frame.
func (w *Worker) claimOnLocked(n *node) {
	if !n.linked || len(n.members) == 0 {
		return
	}
	if strays := w.straysLocked(); len(strays) > 0 {
		w.sendOnLocked(n, claim(strays))
	}
}

// holdsLocked: the Worker holds attempt id (it runs, or its result is kept; w.mu held).
func (w *Worker) holdsLocked(id string) bool {
	_, running := w.running[id]
	_, kept := w.results[id]
	return running || kept
}

// heldLocked is what is held on n: the attempts it handed out (or that were claimed on
// it) that run, then those whose result is kept (w.mu held).
func (w *Worker) heldLocked(n *node) []string {
	held := []string{}
	for id := range w.running {
		if w.originLocked(id) == n {
			held = append(held, id)
		}
	}
	for id := range w.results {
		if _, ok := w.running[id]; !ok && w.originLocked(id) == n {
			held = append(held, id)
		}
	}
	return held
}

// straysLocked is what to claim: each stray, with the token it was handed out under.
func (w *Worker) straysLocked() map[string]string {
	var strays map[string]string
	for id, o := range w.origins {
		if o.stray && o.resume != "" {
			if strays == nil {
				strays = map[string]string{}
			}
			strays[id] = o.resume
		}
	}
	return strays
}

// claimed: n's node took over the sessions of the strays it answers for: each is n's
// from now on (its result, if any, goes there at once), or runs nowhere. An answer about
// an attempt that is not held, or not a stray, does nothing.
func (w *Worker) claimed(n *node, status map[string]string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, s := range status {
		o := w.origins[id]
		if o == nil || !o.stray {
			continue
		}
		_, kept := w.results[id]
		switch {
		case s == "ok":
			w.takeLocked(id, n)
		case s == "stop" && !kept:
			w.abandonLocked(id, "the server no longer runs this attempt")
		case s == "stop":
			delete(w.results, id)
			w.forgetLocked(id)
		}
	}
}

// takeLocked: stray id is n's from now on (a claimed ok from n's node, or an hb ok from
// its own node, back): the result it kept while no node ran it goes there at once; one
// that waits to start asks n's node now (w.mu held).
func (w *Worker) takeLocked(id string, n *node) {
	o := w.origins[id]
	o.node, o.stray = n, false
	if r, kept := w.results[id]; kept {
		w.sendOnLocked(n, r)
	} else if a := w.running[id]; a != nil && a.start != nil && a.startSeq != 0 {
		w.askStartLocked(a) // a stray asked nothing: ask now
	}
}

func (w *Worker) forgetLocked(id string) {
	delete(w.running, id)
	if _, kept := w.results[id]; !kept {
		delete(w.origins, id)
	}
}

// askStartLocked asks the attempt's node whether to start it; a stray asks nothing
// (its node may not run it any more): its new node is asked once one claims it.
func (w *Worker) askStartLocked(a *attempt) {
	w.seq++
	a.startSeq = w.seq
	a.startAt = time.Now()
	seq := a.startSeq
	if o := w.origins[a.step.AttemptID]; o != nil && o.stray {
		return
	}
	w.sendOnLocked(w.originLocked(a.step.AttemptID), heartbeat([]string{a.step.AttemptID}, &seq))
}

// handOut hands s out on the seed (tests).
func (w *Worker) handOut(s step) { w.handOutOn(w.seed, s) }

// handOutOn takes on a hand-out of n's node: its messages go back on n.
func (w *Worker) handOutOn(n *node, s step) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, dup := w.running[s.AttemptID]; dup {
		return
	}
	if _, dup := w.results[s.AttemptID]; dup {
		return
	}
	w.origins[s.AttemptID] = &origin{node: n, resume: deref(n.resume)}
	a := &attempt{step: s}
	switch s.StepType {
	case StepRunModel:
		// even a hand-out that goes back: the server counts its view as sent
		view, ok, err := n.history.view(s.SessionID, s.HistoryBase, s.History)
		if err != nil {
			w.settleLocked(failed(s, "the hand-out's history does not fit the protocol: "+err.Error(), false))
			return
		}
		if !ok { // it builds on a view this Worker lacks: the server sends it whole next
			w.log.info("worker.history_missing", "the hand-out builds on a view this Worker lacks",
				field{"attempt_id", s.AttemptID}, field{"session_id", s.SessionID},
				field{"history_base", s.HistoryBase})
			w.settleLocked(handBack(s.AttemptID, "history"))
			return
		}
		a.history = view
	case StepCompactContext: // the whole view, every time
		if err := checkItems(s.History, 0); err != nil {
			w.settleLocked(failed(s, "the hand-out's history does not fit the protocol: "+err.Error(), false))
			return
		}
		a.history = s.History
	}
	a.step.History = nil // kept once, in a.history
	if w.draining {
		w.settleLocked(handBack(s.AttemptID, ""))
		return
	}
	if w.liveLocked() >= w.opts.Capacity {
		// other nodes' Steps take the capacity (each node counts only its own): this one
		// goes back at once, to another Worker (its history view is kept, as the node
		// assumes)
		w.log.debug("worker.handed_back", "capacity taken: handing back "+s.AttemptID,
			field{"attempt_id", s.AttemptID}, field{"address", n.address})
		w.settleLocked(handBack(s.AttemptID, ""))
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	w.running[s.AttemptID] = a
	go w.run(ctx, a)
}

// liveLocked is how many attempts the Worker took on to run and still runs (a stopped
// attempt's code may run on, holding its slot, but is not counted).
func (w *Worker) liveLocked() int {
	live := 0
	for id := range w.running {
		if _, sent := w.results[id]; !sent {
			live++
		}
	}
	return live
}

// settleLocked answers a hand-out at once, without running it, and keeps the answer
// until its ack (w.mu held).
func (w *Worker) settleLocked(m message) {
	w.results[m.attempt()] = m
	w.sendResultLocked(m)
}

// sendResultLocked sends an attempt's result on the connection it is on, but a stray's:
// that waits for the node that takes it (takeLocked; w.mu held).
func (w *Worker) sendResultLocked(m message) {
	if o := w.origins[m.attempt()]; o != nil && o.stray {
		return
	}
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
	w.sendResultLocked(result) // a stray's waits for the node that takes it
}

// execute runs a hand-out and returns the message that settles it (nil: none).
func (w *Worker) execute(ctx context.Context, a *attempt) (result message) {
	s := a.step
	agent, ok := w.agents[s.Agent]
	if !ok {
		return failed(s, fmt.Sprintf("this Worker serves no agent %q", s.Agent), false)
	}
	if w.tracer != nil {
		var span trace.Span
		ctx, span = w.startSpan(ctx, agent, s)
		defer func() { endSpan(ctx, span, s, result) }() // runs after the recover below
	}
	defer func() {
		if r := recover(); r != nil {
			result = failed(s, fmt.Sprintf("panic: %v", r), true)
		}
	}()
	switch s.StepType {
	case StepRunModel, StepCompactContext:
		return w.runModel(ctx, agent, a)
	case StepCallTool, StepCallSingleAttemptTool, StepPollToolTask, StepCheckToolCall:
		return w.runTool(ctx, agent, a)
	}
	return failed(s, fmt.Sprintf("a Worker does not run %s Steps", s.StepType), false)
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
			return w.modelFailure(s, err)
		}
		return done(s, summary)
	}
	w.hitFailpoint("worker.run_model.before_output")
	emit := func(text string) {
		if text != "" {
			w.send(delta(s.AttemptID, text)) // to its origin now: a claim may move it
		}
	}
	response, err := agent.Model.Stream(ctx, req, emit)
	if err != nil {
		return w.modelFailure(s, err)
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
					return handBack(s.AttemptID, "")
				}
			}
			w.log.info("worker.start_refused", "the server no longer runs this attempt: not starting it",
				field{"attempt_id", s.AttemptID})
			w.forgetLocked(s.AttemptID)
			return nil
		}
	}
	call := &ToolContext{
		SessionID: s.SessionID, CallID: deref(s.CallID), Tool: tool.Name,
		IdempotencyKey: deref(s.IdempotencyKey), Attempt: s.Attempt,
		Answers: s.Answers, SleepsDone: s.SleepsDone, Traceparent: deref(s.Traceparent),
		beat: func() { w.toolBeat(s.AttemptID) },
	}
	switch s.StepType {
	case StepPollToolTask:
		value, err := tool.Poll(ctx, call, s.TaskHandle)
		if errors.Is(err, ErrPending) || (err == nil && value == Pending) {
			return done(s, toolOutcome{Status: "pending"})
		}
		if err != nil {
			return toolError(s, err)
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

// toolBeat is a tool's own heartbeat (ToolContext.Heartbeat): an hb of attempt id alone,
// without a seq (its reply marks no stray), to the node it is on; none once the attempt
// is stopped, cancelled or settled, nor while it is a stray (its node may not run it).
func (w *Worker) toolBeat(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, running := w.running[id]; !running {
		return
	}
	if _, settled := w.results[id]; settled {
		return
	}
	if o := w.origins[id]; o != nil && o.stray {
		return
	}
	w.sendOnLocked(w.originLocked(id), heartbeat([]string{id}, nil))
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
