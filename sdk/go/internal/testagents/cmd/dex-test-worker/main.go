// Command dex-test-worker serves the test agents for the crash and end-to-end tests:
// dex-test-worker --address URL[,URL...] [--capacity N] [--token T].
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"

	dex "github.com/dex-run/dex/sdk/go"
	"github.com/dex-run/dex/sdk/go/internal/testagents"
)

func main() {
	address := flag.String("address", os.Getenv("DEX_ADDRESS"), "server address(es), comma-separated")
	capacity := flag.Int("capacity", envInt("DEX_WORKER_CAPACITY", 16), "attempts run at once")
	token := flag.String("token", os.Getenv("DEX_WORKER_TOKEN"), "worker token")
	flag.Parse()
	agents := testagents.Agents(
		testagents.Ledger{Path: envOr("DEX_TEST_LEDGER", "ledger.jsonl")},
		testagents.Gates{Dir: envOr("DEX_TEST_GATES", ".")},
	)
	worker := dex.NewWorker(dex.WorkerOptions{Address: *address, Agents: agents, Capacity: *capacity, Token: *token})
	if err := worker.Run(context.Background()); err != nil {
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

func envInt(name string, fallback int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return n
	}
	return fallback
}
