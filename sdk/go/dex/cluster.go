// A Worker's connections to the nodes of a cluster (docs/worker-protocol.md, rule 13).
//
// Each node of a cluster hands out only the Steps of its own sessions, so a Worker must be
// connected to every node. The configured addresses are the seed: one connection tries
// them in turn, as on a single node. A node's welcome (and later members messages) lists
// the base URLs of every node; the Worker keeps one connection to each it is not
// connected to yet (the seed counts for the address it is on), each with its own
// reconnect loop. A member that no connected node lists any more and whose connection is
// down is let go. The seed stays, but while down it tries again only an address a
// connected node lists, or once no node is connected. While no node is connected, nothing
// is let go. All connections share the Worker's attempts, so one capacity.

package dex

import (
	"context"
	"sort"
	"strings"
)

// node is the Worker's connection to one node. Its fields but addresses, seed and log
// are guarded by the Worker's mu.
type node struct {
	addresses []string
	seed      bool
	log       *connectionLog

	address string        // the address it is on, or tries, or tried last
	box     outbox        // what waits to be sent on it
	wake    chan struct{} // wakes its write loop
	resume  *string       // the resume token of its last welcome
	history *historyCache // each session's model view, as last handed out on it
	members []string      // what its node listed last, while connected (nil: nothing)
	linked  bool          // a welcomed connection is up
	beat    *beat         // its last beat of all it holds, while connected (nil: none)
	letGo   bool          // no connected node lists it any more: it stops once down
	release chan struct{} // closed when it is let go
}

func (w *Worker) newNode(addresses []string, seed bool) *node {
	address := "" // none: Run says so before connecting
	if len(addresses) > 0 {
		address = addresses[0]
	}
	return &node{
		addresses: addresses, seed: seed, address: address,
		log: &connectionLog{log: w.log, workerID: w.opts.WorkerID, agents: w.agentNames,
			capacity: w.opts.Capacity},
		wake: make(chan struct{}, 1), history: newHistoryCache(historySessions),
		release: make(chan struct{}),
	}
}

// nodesLocked is every connection: the seed, then the members (w.mu held).
func (w *Worker) nodesLocked() []*node {
	nodes := []*node{w.seed}
	for _, n := range w.members {
		nodes = append(nodes, n)
	}
	return nodes
}

// takenLocked: a connection other than by is on (or tries) address.
func (w *Worker) takenLocked(address string, by *node) bool {
	for _, n := range w.nodesLocked() {
		if n != by && n.address == address {
			return true
		}
	}
	return false
}

// othersLinked: a connection other than by is up.
func (w *Worker) othersLinked(by *node) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, n := range w.nodesLocked() {
		if n != by && n.linked {
			return true
		}
	}
	return false
}

// listedLocked is what the connected nodes list; nil while no node is connected.
func (w *Worker) listedLocked() map[string]bool {
	var listed map[string]bool
	for _, n := range w.nodesLocked() {
		if n.linked && n.members != nil {
			if listed == nil {
				listed = map[string]bool{}
			}
			for _, m := range n.members {
				listed[m] = true
			}
		}
	}
	return listed
}

// wanted: n should (re)connect: while it is up, while a connected node lists its
// address, or while no node is connected.
func (w *Worker) wanted(n *node) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if n.letGo {
		return false
	}
	if n.linked {
		return true
	}
	listed := w.listedLocked()
	return listed == nil || listed[n.address]
}

// changes is closed at the next change.
func (w *Worker) changes() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.change
}

// listLocked records what n's node lists (welcome, members) and acts on it (w.mu held).
func (w *Worker) listLocked(n *node, members []string) {
	n.members = []string{}
	for _, m := range members {
		if m = strings.TrimRight(strings.TrimSpace(m), "/"); m != "" {
			n.members = append(n.members, m)
		}
	}
	w.changedLocked()
}

// changedLocked: a node listed its members, or a connection came up or went down:
// connect to every listed node no connection is on; let go of those no node lists.
func (w *Worker) changedLocked() {
	close(w.change)
	w.change = make(chan struct{})
	if w.serving == nil {
		return
	}
	listed := w.listedLocked()
	if listed == nil {
		return
	}
	addresses := make([]string, 0, len(listed))
	for a := range listed {
		addresses = append(addresses, a)
	}
	sort.Strings(addresses)
	for _, a := range addresses {
		if !w.takenLocked(a, nil) {
			w.startLocked(a)
		}
	}
	for a, n := range w.members {
		if !n.linked && !listed[a] && !n.letGo {
			n.letGo = true
			close(n.release)
		}
	}
}

// startLocked starts a connection to the member at address (w.mu held).
func (w *Worker) startLocked(address string) {
	n := w.newNode([]string{address}, false)
	w.members[address] = n
	ctx := w.serving
	w.nodes.Add(1)
	go func() {
		defer w.nodes.Done()
		err := w.serveNode(ctx, n)
		w.mu.Lock()
		if w.members[address] == n {
			delete(w.members, address)
		}
		w.mu.Unlock()
		if err != nil {
			select {
			case w.fatal <- err:
			default:
			}
		}
	}()
}

// connect serves the seed, and the members it learns of, until the Worker stopped (ctx
// done, and drained or out of time) or a node refused it for good (ErrRefused).
func (w *Worker) connect(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w.mu.Lock()
	w.serving = ctx
	w.mu.Unlock()
	seed := make(chan error, 1)
	go func() { seed <- w.serveNode(ctx, w.seed) }()
	var err error
	select {
	case err = <-seed:
	case err = <-w.fatal: // a member refused this Worker for good: stop serving
		cancel()
		<-seed
	}
	cancel()
	w.nodes.Wait()
	if err != nil {
		w.seed.log.stopped("", err)
		return err
	}
	w.seed.log.stopped(w.reason(), nil)
	return nil
}
