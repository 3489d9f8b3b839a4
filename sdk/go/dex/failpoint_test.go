package dex

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dex-run/dex/sdk/go/internal/failpoint"
)

func TestUnarmedFailpointsTakeNoLockOnTheModelAndToolPath(t *testing.T) {
	if err := failpoint.Arm("", ""); err != nil {
		t.Fatal(err)
	}
	w := NewWorker(WorkerOptions{Address: "http://127.0.0.1:1", Agents: []Agent{{Name: "a", Model: viewModel{}}}})
	w.mu.Lock() // as a heartbeat or a frame being built would hold it
	defer w.mu.Unlock()
	passed := make(chan struct{})
	go func() {
		w.hitFailpoint("worker.run_model.before_output")
		w.hitFailpoint("worker.tool_running")
		close(passed)
	}()
	select {
	case <-passed:
	case <-time.After(5 * time.Second):
		t.Fatal("an unarmed failpoint waited for the Worker's lock")
	}
}

func TestAWorkerRefusesToStartWithAFailpointSpecItCannotRead(t *testing.T) {
	t.Cleanup(func() { _ = failpoint.Arm("", "") })
	if err := failpoint.Arm("worker.tool_running=pasue", t.TempDir()); err == nil {
		t.Fatal("the spec was accepted")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	w := NewWorker(WorkerOptions{Address: "http://127.0.0.1:1", Agents: []Agent{{Name: "a", Model: viewModel{}}}})
	err := w.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), `DEX_FAILPOINTS: "worker.tool_running=pasue": unknown action "pasue"`) {
		t.Fatalf("Run: %v", err)
	}
	if ctx.Err() != nil {
		t.Fatal("Run tried to connect instead of refusing at once")
	}
}
