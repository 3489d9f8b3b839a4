// Package failpoint stops or crashes the Worker at named points, for crash tests.
//
// Armed only through the environment, as in the Python Worker:
// DEX_FAILPOINTS="worker.before_first_heartbeat=pause" and DEX_FAILPOINT_DIR. A hit
// writes NAME.hit; crash SIGKILLs the process, stop SIGSTOPs it, pause blocks until
// NAME.release exists. NAME=pause@3 acts on the third hit only.
//
// A spec it cannot read (an unknown action, a hit number that is not a positive
// integer, a part without "=") arms nothing: Err says why, and the Worker refuses to
// start with it, as the Python and TypeScript Workers do: a typo fails loudly instead of
// doing nothing.
//
// Unarmed, Hit and Armed cost one atomic load: no lock, no map look-up.
package failpoint

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Actions are the actions a Go Worker's failpoint takes.
var Actions = []string{"crash", "pause", "stop"}

type point struct {
	action string
	nth    int
	hits   int
}

var (
	armed  atomic.Bool // true only while some point is armed: the hot path's one check
	mu     sync.Mutex  // guards the rest
	points map[string]*point
	dir    string
	refuse error
)

func init() {
	_ = Arm(os.Getenv("DEX_FAILPOINTS"), os.Getenv("DEX_FAILPOINT_DIR"))
}

// Arm replaces the armed points with those of spec (DEX_FAILPOINTS' syntax), reporting
// hits in directory. A spec it refuses arms nothing; Err returns why until the next Arm.
// Tests arm points with it; the Worker's points come from the environment.
func Arm(spec, directory string) error {
	parsed, err := parse(spec)
	mu.Lock()
	defer mu.Unlock()
	points, dir, refuse = parsed, directory, err
	armed.Store(len(parsed) > 0)
	return err
}

// Err is why the failpoints' spec was refused, nil if it was not: a Worker must not start
// with a spec it cannot honour.
func Err() error {
	mu.Lock()
	defer mu.Unlock()
	return refuse
}

// Armed reports whether any point is armed; when none is, it is one atomic load.
func Armed() bool {
	return armed.Load()
}

func parse(spec string) (map[string]*point, error) {
	out := map[string]*point{}
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		bad := func(why string) error {
			return fmt.Errorf("DEX_FAILPOINTS: %q: %s", part, why)
		}
		name, action, ok := strings.Cut(part, "=")
		if !ok || name == "" {
			return nil, bad("not NAME=ACTION")
		}
		action, nth, counted := strings.Cut(action, "@")
		if !known(action) {
			last := len(Actions) - 1
			choices := strings.Join(Actions[:last], ", ") + " or " + Actions[last]
			return nil, bad(fmt.Sprintf("unknown action %q (%s)", action, choices))
		}
		n := 1
		if counted {
			var err error
			if n, err = strconv.Atoi(nth); err != nil || n < 1 {
				return nil, bad(fmt.Sprintf("the hit number %q is not a positive integer", nth))
			}
		}
		out[name] = &point{action: action, nth: n}
	}
	return out, nil
}

func known(action string) bool {
	for _, a := range Actions {
		if action == a {
			return true
		}
	}
	return false
}

// Hit acts on the failpoint name if it is armed; unarmed, it returns at once.
func Hit(name string) {
	if !armed.Load() {
		return
	}
	mu.Lock()
	p, ok := points[name]
	if !ok {
		mu.Unlock()
		return
	}
	p.hits++
	act, action, directory := p.hits == p.nth, p.action, dir
	mu.Unlock()
	if !act {
		return
	}
	path := func(suffix string) string { return filepath.Join(directory, name+suffix) }
	_ = os.WriteFile(path(".hit"), []byte(strconv.Itoa(os.Getpid())), 0o644)
	switch action {
	case "crash":
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	case "stop":
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	case "pause":
		for {
			if _, err := os.Stat(path(".release")); err == nil {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}
