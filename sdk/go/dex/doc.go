// Package dex is the Go Worker of Dex, a durable runtime for AI agents: it serves agents
// whose models and tools are Go functions to a Dex server, which keeps each session's
// history and decides what runs next. The server hands the Worker Steps (a model call, a
// tool call, a poll of a tool's task, a summary), and each tool's Kind says what a crash
// may do to it: a Read runs again, an IdempotentWrite runs again with the same
// idempotency key, a Write runs at most once, a Task is started once and then polled.
//
// Define tools and an agent, then serve them until a signal:
//
//	weather := dex.Tool{
//		Name: "get_weather", Kind: dex.Read,
//		Parameters: map[string]any{"type": "object"},
//		Func: func(ctx context.Context, call *dex.ToolContext, args json.RawMessage) (any, error) {
//			return "sunny", nil
//		},
//	}
//	agent := dex.Agent{Name: "concierge", Model: dex.Scripted(script), Tools: []dex.Tool{weather}}
//	w := dex.NewWorker(dex.WorkerOptions{Agents: []dex.Agent{agent}})
//	err := w.RunUntilSignal(context.Background()) // Run(ctx) leaves signals to you
//
// Import it as "github.com/dex-run/dex/sdk/go/dex" (the module is
// github.com/dex-run/dex/sdk/go). The Client, which creates sessions, sends messages and
// approves calls over the HTTP API, is its sibling package
// "github.com/dex-run/dex/sdk/go/client". docs/go-worker.md and docs/go-client.md
// describe both; docs/worker-protocol.md the protocol the Worker speaks.
package dex
