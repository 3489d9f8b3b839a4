// Package testagents ports the agents of tests/support/agents.py that the crash cells
// run against a Go Worker: the same scripted model, tool names, ledger entries and gates.
package testagents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/dex-run/dex/sdk/go/dex"
)

// Ledger appends one JSON line per side effect (DEX_TEST_LEDGER), as dex.testing.Ledger.
type Ledger struct{ Path string }

// Record appends {"effect": effect, ...fields} and syncs it to disk.
func (l Ledger) Record(effect string, fields map[string]any) error {
	row := map[string]any{"effect": effect}
	for k, v := range fields {
		row[k] = v
	}
	line, err := json.Marshal(row)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(l.Path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Write(append(line, '\n')); err != nil {
		return err
	}
	return f.Sync()
}

// Entries are the ledger's entries of effect, in order, as dex.testing.Ledger.entries
// reads them (no ledger yet: none).
func (l Ledger) Entries(effect string) ([]map[string]any, error) {
	data, err := os.ReadFile(l.Path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var found []map[string]any
	for _, line := range strings.Split(string(data), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var entry map[string]any
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			return nil, fmt.Errorf("ledger line %q: %w", line, err)
		}
		if entry["effect"] == effect {
			found = append(found, entry)
		}
	}
	return found, nil
}

// Gates is the directory of gate files (DEX_TEST_GATES), as dex.testing.Gates.
type Gates struct{ Dir string }

// Wait says that attempt reached gate (<gate>.<attempt>.entered), then waits for
// <gate>.open; no gate returns at once.
func (g Gates) Wait(ctx context.Context, gate string, attempt int) error {
	if gate == "" {
		return nil
	}
	entered := filepath.Join(g.Dir, fmt.Sprintf("%s.%d.entered", gate, attempt))
	if err := os.WriteFile(entered, nil, 0o644); err != nil {
		return err
	}
	for {
		if _, err := os.Stat(filepath.Join(g.Dir, gate+".open")); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Scripted is the test model: the SDK's dex.Scripted with script, which records every
// model call ("model") and summary call ("summary") in Ledger as it starts, with
// session_id and attempt, as the tools record their effects, and streams its text in
// chunks of ChunkChars, Delay apart (ChunkChars 0: in one piece).
type Scripted struct {
	Ledger     Ledger
	ChunkChars int
	Delay      time.Duration
}

// model is the SDK's scripted model that this one records and streams.
var model = dex.Scripted(script)

func (m Scripted) Spec() map[string]any {
	return model.Spec()
}

// record records a model or summary call as it starts: only in a ledger a test named
// (a Worker some end-to-end test starts without one leaves no ledger.jsonl behind).
func (m Scripted) record(effect string, req dex.ModelRequest) error {
	if os.Getenv("DEX_TEST_LEDGER") == "" {
		return nil
	}
	return m.Ledger.Record(effect, map[string]any{"session_id": req.SessionID, "attempt": req.Attempt})
}

// Summarize is dex.Scripted's deterministic digest: how much there was, and what the
// user asked.
func (m Scripted) Summarize(ctx context.Context, req dex.ModelRequest) (dex.Summary, error) {
	if err := m.record("summary", req); err != nil {
		return dex.Summary{}, err
	}
	return model.Summarize(ctx, req)
}

// GatedSummaries is Scripted, whose summary call, once recorded in the ledger, waits
// behind the gate "summary", so a test can interrupt a CompactContext while it runs.
type GatedSummaries struct {
	Scripted
	Gates Gates
}

func (m GatedSummaries) Summarize(ctx context.Context, req dex.ModelRequest) (dex.Summary, error) {
	if err := m.record("summary", req); err != nil {
		return dex.Summary{}, err
	}
	if err := m.Gates.Wait(ctx, "summary", req.Attempt); err != nil {
		return dex.Summary{}, err
	}
	return model.Summarize(ctx, req)
}

func (m Scripted) Stream(ctx context.Context, req dex.ModelRequest, emit func(string)) (dex.ModelResponse, error) {
	if err := m.record("model", req); err != nil {
		return dex.ModelResponse{}, err
	}
	if m.ChunkChars <= 0 {
		return model.Stream(ctx, req, emit)
	}
	chunked := func(text string) {
		for i := 0; i < len(text); i += m.ChunkChars {
			select {
			case <-ctx.Done():
				return
			case <-time.After(m.Delay):
			}
			emit(text[i:minInt(i+m.ChunkChars, len(text))])
		}
	}
	response, err := model.Stream(ctx, req, chunked)
	if err == nil {
		err = ctx.Err() // stopped while it streamed
	}
	return response, err
}

func minInt(a, b int) int {
	if a < b {
		return a
	}
	return b
}

// script is tests/support/agents.py's: "call: [[tool, {args}], ...]" asks for those
// calls, then answers "results: <json>"; anything else answers "echo: <text>". A history
// it cannot answer (no user message, calls that do not decode) panics, as the Python
// script raises: the Worker fails the attempt.
func script(history []dex.Item) dex.ModelResponse {
	response, err := answer(history)
	if err != nil {
		panic(err)
	}
	return response
}

func answer(history []dex.Item) (dex.ModelResponse, error) {
	last := -1
	for i, item := range history {
		if item.Type == "user" {
			last = i
		}
	}
	if last < 0 {
		return dex.ModelResponse{}, fmt.Errorf("no user message in the history")
	}
	user, after := history[last], history[last+1:]
	if !strings.HasPrefix(user.Text, "call:") {
		return dex.Say("echo: " + user.Text), nil
	}
	for _, item := range after {
		if item.Type == "assistant" {
			summary := []map[string]any{}
			for _, r := range after {
				if r.Type == "tool_result" {
					summary = append(summary, map[string]any{
						"name": r.Name, "status": r.Status, "result": raw(r.Result), "error": r.Error,
					})
				}
			}
			data, err := json.Marshal(summary)
			return dex.Say("results: " + string(data)), err
		}
	}
	var calls [][2]json.RawMessage
	if err := json.Unmarshal([]byte(strings.TrimPrefix(user.Text, "call:")), &calls); err != nil {
		return dex.ModelResponse{}, err
	}
	response := dex.ModelResponse{StopReason: "tool_use"}
	for i, c := range calls {
		var name string
		var args map[string]any
		if err := json.Unmarshal(c[0], &name); err != nil {
			return response, err
		}
		if err := json.Unmarshal(c[1], &args); err != nil {
			return response, err
		}
		response.ToolCalls = append(response.ToolCalls, dex.ModelToolCall{ID: fmt.Sprintf("c%d", i), Name: name, Arguments: args})
	}
	return response, nil
}

func raw(r json.RawMessage) json.RawMessage {
	if len(r) == 0 {
		return json.RawMessage("null")
	}
	return r
}

type gated struct {
	Key    string `json:"key"`
	Amount int    `json:"amount"`
	Gate   string `json:"gate"`
}

func params(required string, typ string) map[string]any {
	return map[string]any{
		"type": "object",
		"properties": map[string]any{
			required: map[string]any{"type": typ},
			"gate":   map[string]any{"anyOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "null"}}},
		},
		"required": []string{required},
	}
}

// Agents returns the assistant, streamer, waiter, compactor and slow_summaries agents,
// writing to ledger and gates.
func Agents(ledger Ledger, gates Gates) []dex.Agent {
	fast := &dex.RetryPolicy{MaxAttempts: 3, InitialBackoffSeconds: 0.05}
	tool := func(name string, kind dex.ToolKind, param, typ string, body func(gated) (any, map[string]any)) dex.Tool {
		return dex.Tool{
			Name: name, Kind: kind, Parameters: params(param, typ),
			Func: func(ctx context.Context, call *dex.ToolContext, args json.RawMessage) (any, error) {
				var a gated
				if err := json.Unmarshal(args, &a); err != nil {
					return nil, &dex.ToolError{Message: err.Error()}
				}
				value, fields := body(a)
				fields["idempotency_key"] = call.IdempotencyKey
				fields["attempt"] = call.Attempt
				if err := ledger.Record(name, fields); err != nil {
					return nil, err
				}
				if err := gates.Wait(ctx, a.Gate, call.Attempt); err != nil {
					return nil, err
				}
				return value, nil
			},
		}
	}
	lookup := tool("lookup", dex.Read, "key", "string", func(a gated) (any, map[string]any) {
		return map[string]any{"key": a.Key, "value": strings.ToUpper(a.Key)}, map[string]any{"key": a.Key}
	})
	lookup.Description, lookup.Retry = "Read a value.", fast
	charge := tool("charge", dex.Write, "amount", "integer", func(a gated) (any, map[string]any) {
		return fmt.Sprintf("charged %d", a.Amount), map[string]any{"amount": a.Amount}
	})
	charge.Description = "Charge a card: not idempotent, so Dex runs it at most once."
	upsert := tool("upsert", dex.IdempotentWrite, "key", "string", func(a gated) (any, map[string]any) {
		return "stored " + a.Key, map[string]any{"key": a.Key}
	})
	upsert.Description, upsert.Retry = "Write a record keyed by the idempotency key.", fast
	refuse := dex.Tool{
		Name: "refuse", Kind: dex.Read, Parameters: params("reason", "string"),
		Description: "Fails with a known outcome.",
		Func: func(ctx context.Context, call *dex.ToolContext, args json.RawMessage) (any, error) {
			var a struct {
				Reason string `json:"reason"`
			}
			if err := json.Unmarshal(args, &a); err != nil {
				return nil, &dex.ToolError{Message: err.Error()}
			}
			return nil, &dex.ToolError{Message: a.Reason}
		},
	}
	scripted := Scripted{Ledger: ledger}
	return []dex.Agent{
		{
			Name: "assistant", Instructions: "You are a test agent.", Model: scripted,
			Tools: []dex.Tool{lookup, charge, upsert, refuse}, ModelRetry: fast,
		},
		{
			Name: "streamer", Model: Scripted{Ledger: ledger, ChunkChars: 4, Delay: 10 * time.Millisecond},
			Tools: []dex.Tool{lookup}, ModelRetry: fast,
		},
		{
			Name: "waiter", Model: scripted,
			Tools: append(waits(ledger, fast), append(tasks(ledger, gates, fast), pay(ledger, gates), lookup, charge)...), ModelRetry: fast,
		},
		{
			Name: "compactor", Model: scripted, Tools: []dex.Tool{lookup}, ModelRetry: fast,
			CompactThresholdChars: 400,
		},
		{
			Name: "slow_summaries", Model: GatedSummaries{Scripted: scripted, Gates: gates},
			Tools: []dex.Tool{lookup}, ModelRetry: fast, CompactThresholdChars: 400,
		},
	}
}

// tasks are the task tools of agents.py's waiter, each handle its idempotency key:
// render, polled every 0.05 s, whose poll holds while <handle>.pause exists (writing
// <handle>.polling) until <handle>.open, and export, polled once a second. A task is
// done once <handle>.done exists; in gate file names the handle's slashes are
// underscores.
func tasks(ledger Ledger, gates Gates, fast *dex.RetryPolicy) []dex.Tool {
	gate := func(handle, suffix string) string {
		return filepath.Join(gates.Dir, strings.ReplaceAll(handle, "/", "_")+"."+suffix)
	}
	exists := func(path string) bool {
		_, err := os.Stat(path)
		return err == nil
	}
	task := func(name, param, description string, interval float64, poll func(ctx context.Context, handle string) (any, error)) dex.Tool {
		return dex.Tool{
			Name: name, Kind: dex.Task, Retry: fast, PollIntervalSeconds: interval,
			Parameters: params(param, "string"), Description: description,
			Func: func(ctx context.Context, call *dex.ToolContext, args json.RawMessage) (any, error) {
				var a map[string]any
				if err := json.Unmarshal(args, &a); err != nil {
					return nil, &dex.ToolError{Message: err.Error()}
				}
				fields := map[string]any{param: a[param], "idempotency_key": call.IdempotencyKey, "attempt": call.Attempt}
				return call.IdempotencyKey, ledger.Record(name+".start", fields)
			},
			Poll: func(ctx context.Context, call *dex.ToolContext, raw json.RawMessage) (any, error) {
				var handle string
				if err := json.Unmarshal(raw, &handle); err != nil {
					return nil, fmt.Errorf("the handle %s is not a string: %w", raw, err)
				}
				if err := ledger.Record(name+".poll", map[string]any{"handle": handle, "attempt": call.Attempt}); err != nil {
					return nil, err
				}
				return poll(ctx, handle)
			},
		}
	}
	render := task("render", "scene", "Starts a render job; the handle is the idempotency key.", 0.05,
		func(ctx context.Context, handle string) (any, error) {
			if exists(gate(handle, "pause")) {
				if err := os.WriteFile(gate(handle, "polling"), nil, 0o644); err != nil {
					return nil, err
				}
				for !exists(gate(handle, "open")) {
					select {
					case <-ctx.Done():
						return nil, ctx.Err()
					case <-time.After(5 * time.Millisecond):
					}
				}
			}
			if exists(gate(handle, "done")) {
				return "rendered " + handle, nil
			}
			return nil, dex.ErrPending
		})
	export := task("export", "report", "Starts an export job polled once a second; the handle is the idempotency key.", 1.0,
		func(ctx context.Context, handle string) (any, error) {
			if exists(gate(handle, "done")) {
				return "exported " + handle, nil
			}
			return nil, dex.ErrPending
		})
	return []dex.Tool{render, export}
}

// pay is agents.py's write with a check probe: it records "pay" (amount, idempotency
// key) and waits at its gate; its check asks the ledger whether a "pay" of the call's
// idempotency key happened, and records "pay.check" (found).
func pay(ledger Ledger, gates Gates) dex.Tool {
	return dex.Tool{
		Name: "pay", Kind: dex.Write, Parameters: params("amount", "integer"),
		Description: "A write with a check probe: the bank can be asked whether the payment happened.",
		Func: func(ctx context.Context, call *dex.ToolContext, args json.RawMessage) (any, error) {
			var a gated
			if err := json.Unmarshal(args, &a); err != nil {
				return nil, &dex.ToolError{Message: err.Error()}
			}
			if err := ledger.Record("pay", map[string]any{"amount": a.Amount, "idempotency_key": call.IdempotencyKey}); err != nil {
				return nil, err
			}
			if err := gates.Wait(ctx, a.Gate, call.Attempt); err != nil {
				return nil, err
			}
			return fmt.Sprintf("paid %d", a.Amount), nil
		},
		Check: func(ctx context.Context, call *dex.ToolContext, args json.RawMessage) (dex.Checked, error) {
			var a gated
			if err := json.Unmarshal(args, &a); err != nil {
				return dex.Checked{}, &dex.ToolError{Message: err.Error()}
			}
			entries, err := ledger.Entries("pay")
			if err != nil {
				return dex.Checked{}, err
			}
			found := 0
			for _, e := range entries {
				if e["idempotency_key"] == call.IdempotencyKey {
					found++
				}
			}
			if err := ledger.Record("pay.check", map[string]any{"found": found}); err != nil {
				return dex.Checked{}, err
			}
			happened := found > 0
			return dex.Checked{Happened: &happened, Result: fmt.Sprintf("paid %d (found by check)", a.Amount)}, nil
		},
	}
}

// waits are the tools of agents.py's waiter that wait in Dex: an approval (delete_all,
// publish), a question (order) and a durable sleep (remind).
func waits(ledger Ledger, fast *dex.RetryPolicy) []dex.Tool {
	decode := func(args json.RawMessage, into any) error {
		if err := json.Unmarshal(args, into); err != nil {
			return &dex.ToolError{Message: err.Error()}
		}
		return nil
	}
	deleteAll := dex.Tool{
		Name: "delete_all", Kind: dex.Write, Approval: true, Description: "Always needs approval.",
		Parameters: map[string]any{"type": "object", "properties": map[string]any{}},
		Func: func(ctx context.Context, call *dex.ToolContext, args json.RawMessage) (any, error) {
			err := ledger.Record("delete_all", map[string]any{"idempotency_key": call.IdempotencyKey, "attempt": call.Attempt})
			return "deleted", err
		},
	}
	order := dex.Tool{
		Name: "order", Kind: dex.IdempotentWrite, Retry: fast, Parameters: params("item", "string"),
		Description: "Asks which size, then orders.",
		Func: func(ctx context.Context, call *dex.ToolContext, args json.RawMessage) (any, error) {
			var a struct {
				Item string `json:"item"`
			}
			if err := decode(args, &a); err != nil {
				return nil, err
			}
			if err := ledger.Record("order.before_ask", map[string]any{"attempt": call.Attempt, "answers": len(call.Answers)}); err != nil {
				return nil, err
			}
			size, err := call.Ask(fmt.Sprintf("Which size of %s?", a.Item), "S", "M", "L")
			if err != nil {
				return nil, err
			}
			fields := map[string]any{"item": a.Item, "size": size, "idempotency_key": call.IdempotencyKey}
			return fmt.Sprintf("ordered %s in %s", a.Item, size), ledger.Record("order", fields)
		},
	}
	remind := dex.Tool{
		Name: "remind", Kind: dex.Read, Retry: fast, Parameters: params("seconds", "number"),
		Description: "Sleeps durably, then reminds.",
		Func: func(ctx context.Context, call *dex.ToolContext, args json.RawMessage) (any, error) {
			var a struct {
				Seconds float64 `json:"seconds"`
			}
			if err := decode(args, &a); err != nil {
				return nil, err
			}
			if err := ledger.Record("remind.before_sleep", map[string]any{"sleeps_done": call.SleepsDone}); err != nil {
				return nil, err
			}
			if err := call.Sleep(a.Seconds); err != nil {
				return nil, err
			}
			return "time is up", ledger.Record("remind", map[string]any{"idempotency_key": call.IdempotencyKey})
		},
	}
	publish := dex.Tool{
		Name: "publish", Kind: dex.IdempotentWrite, Retry: fast, Approval: true, Parameters: params("post", "string"),
		Description: "Needs approval; a keyed write, so it may run again after a crash.",
		Func: func(ctx context.Context, call *dex.ToolContext, args json.RawMessage) (any, error) {
			var a struct {
				Post string `json:"post"`
			}
			if err := decode(args, &a); err != nil {
				return nil, err
			}
			fields := map[string]any{"post": a.Post, "idempotency_key": call.IdempotencyKey, "attempt": call.Attempt}
			return "published " + a.Post, ledger.Record("publish", fields)
		},
	}
	return []dex.Tool{deleteAll, order, remind, publish}
}
