// Command dex-test-worker serves the test agents for the crash and end-to-end tests. It
// is configured as any Go Worker is, by its DEX_* variables (DEX_ADDRESS,
// DEX_WORKER_CAPACITY, DEX_WORKER_TOKEN, ...), and writes to DEX_TEST_LEDGER and
// DEX_TEST_GATES.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/dex-run/dex/sdk/go/dex"
	"github.com/dex-run/dex/sdk/go/internal/testagents"
)

func main() {
	agents := testagents.Agents(
		testagents.Ledger{Path: envOr("DEX_TEST_LEDGER", "ledger.jsonl")},
		testagents.Gates{Dir: envOr("DEX_TEST_GATES", ".")},
	)
	if err := dex.NewWorker(dex.WorkerOptions{Agents: agents}).RunUntilSignal(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "dex-test-worker:", err)
		os.Exit(1)
	}
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}
