// Package failpoint stops or crashes the Worker at named points, for crash tests.
//
// Armed only through the environment, as in the Python Worker:
// DEX_FAILPOINTS="worker.before_first_heartbeat=pause" and DEX_FAILPOINT_DIR. A hit
// writes NAME.hit; crash SIGKILLs the process, stop SIGSTOPs it, pause blocks until
// NAME.release exists. NAME=pause@3 acts on the third hit only.
package failpoint

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

type armed struct {
	action string
	nth    int
}

var (
	mu     sync.Mutex
	points = parse(os.Getenv("DEX_FAILPOINTS"))
	counts = map[string]int{}
	dir    = os.Getenv("DEX_FAILPOINT_DIR")
)

func parse(spec string) map[string]armed {
	out := map[string]armed{}
	for _, part := range strings.Split(spec, ",") {
		name, action, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			continue
		}
		action, nth, _ := strings.Cut(action, "@")
		n, err := strconv.Atoi(nth)
		if err != nil || n < 1 {
			n = 1
		}
		out[name] = armed{action, n}
	}
	return out
}

// Hit acts on the failpoint name if it is armed; unarmed, it returns at once.
func Hit(name string) {
	if len(points) == 0 {
		return
	}
	p, ok := points[name]
	if !ok {
		return
	}
	mu.Lock()
	counts[name]++
	count := counts[name]
	mu.Unlock()
	if count != p.nth {
		return
	}
	path := func(suffix string) string { return filepath.Join(dir, name+suffix) }
	_ = os.WriteFile(path(".hit"), []byte(strconv.Itoa(os.Getpid())), 0o644)
	switch p.action {
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
