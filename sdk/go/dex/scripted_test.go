package dex

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// weatherScript is the Go page's script: a tool call first, then an answer from its result.
func weatherScript(history []Item) ModelResponse {
	if last := history[len(history)-1]; last.Type == "tool_result" {
		return Say("Done: " + string(last.Result))
	}
	return ModelResponse{ToolCalls: []ModelToolCall{Call("get_weather", map[string]any{"city": "Paris"})}}
}

func modelResponse(t *testing.T, m message) ModelResponse {
	t.Helper()
	done, ok := m.(doneMessage)
	if !ok {
		t.Fatalf("want a done, got %v", m)
	}
	var r ModelResponse
	if err := json.Unmarshal(done.Result, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestAScriptedModelAnswersWhatItsScriptSaysOfTheHistory(t *testing.T) {
	w := NewWorker(WorkerOptions{Address: "http://127.0.0.1:1", Agents: []Agent{{Name: "a", Model: Scripted(weatherScript)}}})
	var hellos []hello
	if err := json.Unmarshal(w.helloFrame(), &hellos); err != nil {
		t.Fatal(err)
	}
	if got := hellos[0].Agents[0].Model; !reflect.DeepEqual(got, map[string]any{"provider": "scripted", "name": "scripted"}) {
		t.Fatalf("the server must be told a scripted model: %v", got)
	}

	w.handOut(runModelStep("m1", "s1", 0, Item{Type: "user", Text: "Weather in Paris?"}))
	eventually(t, "the tool call", func() bool { return w.result("m1") != nil })
	asked := modelResponse(t, w.result("m1"))
	want := []ModelToolCall{{ID: "call_1", Name: "get_weather", Arguments: map[string]any{"city": "Paris"}}}
	if asked.Text != "" || !reflect.DeepEqual(asked.ToolCalls, want) {
		t.Fatalf("the first response must call get_weather: %+v", asked)
	}

	result := Item{Type: "tool_result", CallID: "call_1", Name: "get_weather", Status: "succeeded", Result: json.RawMessage(`"sunny in Paris"`)}
	w.handOut(runModelStep("m2", "s1", 1, Item{Type: "assistant", ToolCalls: want}, result))
	eventually(t, "the answer", func() bool { return w.result("m2") != nil })
	if answer := modelResponse(t, w.result("m2")); answer.Text != `Done: "sunny in Paris"` || len(answer.ToolCalls) != 0 {
		t.Fatalf("the second response must answer from the result: %+v", answer)
	}
}

func TestAScriptedModelStreamsItsTextAndSummarizesTheHistory(t *testing.T) {
	model := Scripted(func(history []Item) ModelResponse { return Say("echo: " + history[0].Text) })
	var streamed []string
	response, err := model.Stream(context.Background(), ModelRequest{History: []Item{{Type: "user", Text: "hi"}}}, func(text string) {
		streamed = append(streamed, text)
	})
	if err != nil || response.Text != "echo: hi" || !reflect.DeepEqual(streamed, []string{"echo: hi"}) {
		t.Fatalf("the text must stream as one delta and end as the response: %+v %v %v", response, streamed, err)
	}

	history := []Item{
		{Type: "summary", Text: "Earlier."}, {Type: "user", Text: "one"},
		{Type: "assistant", Text: "reply"}, {Type: "user", Text: "two"},
	}
	summary, err := model.Summarize(context.Background(), ModelRequest{History: history})
	if err != nil || summary.Text != "Summary of 4 items. Before that: Earlier. The user said: one | two" {
		t.Fatalf("the summary must be Python's Scripted digest: %q %v", summary.Text, err)
	}
}

func TestCallAndSay(t *testing.T) {
	if got := Call("ping", nil); got.ID != "call_1" || got.Name != "ping" || got.Arguments == nil {
		t.Fatalf("a call without arguments sends an empty object: %+v", got)
	}
	if got := Say("done"); got.Text != "done" || got.ToolCalls != nil {
		t.Fatalf("Say is an answer with no call: %+v", got)
	}
	var none Scripted
	_, err := none.Stream(context.Background(), ModelRequest{}, func(string) {})
	var modelErr *ModelError
	if !errors.As(err, &modelErr) || !strings.Contains(err.Error(), "no function of the history") || modelErr.Retryable {
		t.Fatalf("a nil Scripted must fail for good, saying why: %v", err)
	}
}
