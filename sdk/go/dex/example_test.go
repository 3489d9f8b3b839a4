package dex_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"

	"github.com/dex-run/dex/sdk/go/dex"
)

// A tool that reads: no side effects, so after a crash it simply runs again. The Worker
// checks each call's arguments against Parameters before Func runs.
func ExampleTool() {
	getWeather := dex.Tool{
		Name:        "get_weather",
		Description: "Today's weather in a city.",
		Kind:        dex.Read,
		Parameters: map[string]any{
			"type":       "object",
			"properties": map[string]any{"city": map[string]any{"type": "string"}},
			"required":   []string{"city"},
		},
		Func: func(ctx context.Context, call *dex.ToolContext, args json.RawMessage) (any, error) {
			var a struct{ City string }
			if err := json.Unmarshal(args, &a); err != nil {
				return nil, err
			}
			return "sunny in " + a.City, nil
		},
	}

	// What the Worker does with a call of it, by hand:
	call := &dex.ToolContext{CallID: "call_1", Tool: getWeather.Name, Attempt: 1}
	result, err := getWeather.Func(context.Background(), call, json.RawMessage(`{"city": "Paris"}`))
	fmt.Println(result, err)
	// Output: sunny in Paris <nil>
}

// A tool whose failure the model should see returns a *dex.ToolError: the call records
// failed, and no retry runs it again.
func ExampleToolError() {
	book := dex.Tool{
		Name: "book_table",
		Kind: dex.Write, // at most once, even across crashes
		Func: func(ctx context.Context, call *dex.ToolContext, args json.RawMessage) (any, error) {
			// pass call.IdempotencyKey to the system you call, so it can de-duplicate
			return nil, &dex.ToolError{Message: "no table free at 8"}
		},
	}
	_, err := book.Func(context.Background(), &dex.ToolContext{IdempotencyKey: "s1:call_1"}, nil)
	var known *dex.ToolError
	fmt.Println(errors.As(err, &known), err)
	// Output: true no table free at 8
}

// A task tool starts a job once and is polled until it is done: Poll returns
// dex.ErrPending while the job runs.
func ExampleErrPending() {
	jobs := map[string]int{} // polls so far, by job
	report := dex.Tool{
		Name: "build_report",
		Kind: dex.Task,
		Func: func(ctx context.Context, call *dex.ToolContext, args json.RawMessage) (any, error) {
			return "job-" + call.IdempotencyKey, nil // the handle Poll gets
		},
		Poll: func(ctx context.Context, call *dex.ToolContext, handle json.RawMessage) (any, error) {
			var job string
			if err := json.Unmarshal(handle, &job); err != nil {
				return nil, err
			}
			if jobs[job]++; jobs[job] < 3 {
				return nil, dex.ErrPending
			}
			return "report ready", nil
		},
	}
	for i := 0; i < 3; i++ {
		result, err := report.Poll(context.Background(), &dex.ToolContext{}, json.RawMessage(`"job-1"`))
		fmt.Println(result, errors.Is(err, dex.ErrPending))
	}
	// Output:
	// <nil> true
	// <nil> true
	// report ready false
}

// An agent: instructions, a model and tools. dex.Scripted is a stand-in model whose
// answer depends only on the history: the same history always gets the same answer.
func ExampleAgent() {
	script := func(history []dex.Item) dex.ModelResponse {
		if last := history[len(history)-1]; last.Type == "tool_result" {
			return dex.Say("Done: " + string(last.Result))
		}
		return dex.ModelResponse{ToolCalls: []dex.ModelToolCall{
			dex.Call("get_weather", map[string]any{"city": "Paris"}),
		}}
	}
	concierge := dex.Agent{
		Name:         "concierge",
		Instructions: "You help with the weather.",
		Model:        dex.Scripted(script),
		Tools:        []dex.Tool{{Name: "get_weather", Kind: dex.Read}},
	}

	// What the model answers, first to the user's message, then to the tool's result:
	history := []dex.Item{{Type: "user", Text: "Weather in Paris?"}}
	asked, _ := concierge.Model.Stream(context.Background(), dex.ModelRequest{History: history}, func(string) {})
	fmt.Println(asked.ToolCalls[0].Name, asked.ToolCalls[0].Arguments)
	result := dex.Item{Type: "tool_result", CallID: "call_1", Name: "get_weather", Status: "succeeded",
		Result: json.RawMessage(`"sunny in Paris"`)}
	answer, _ := concierge.Model.Stream(context.Background(), dex.ModelRequest{History: append(history, result)}, func(string) {})
	fmt.Println(answer.Text)
	// Output:
	// get_weather map[city:Paris]
	// Done: "sunny in Paris"
}

// Serve agents to the server at DEX_ADDRESS (else http://127.0.0.1:7450) until SIGTERM
// or Ctrl-C, which drain the Worker: it finishes what runs and hands back the rest.
func ExampleWorker_RunUntilSignal() {
	agent := dex.Agent{Name: "concierge", Model: dex.Scripted(func([]dex.Item) dex.ModelResponse {
		return dex.Say("hello")
	})}
	w := dex.NewWorker(dex.WorkerOptions{Agents: []dex.Agent{agent}})
	if err := w.RunUntilSignal(context.Background()); err != nil {
		log.Fatal(err) // errors.Is(err, dex.ErrRefused): a token the server refused
	}
}

// Run leaves signals to the caller: the Worker drains when ctx is done.
func ExampleWorker_Run() {
	agent := dex.Agent{Name: "concierge", Model: dex.Scripted(func([]dex.Item) dex.ModelResponse {
		return dex.Say("hello")
	})}
	ctx, stop := context.WithCancel(context.Background())
	defer stop() // call stop() from your own shutdown to drain the Worker
	w := dex.NewWorker(dex.WorkerOptions{Address: "http://10.0.0.1:7450,http://10.0.0.2:7450", Agents: []dex.Agent{agent}})
	if err := w.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
