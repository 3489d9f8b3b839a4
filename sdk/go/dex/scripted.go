package dex

import (
	"context"
	"fmt"
	"strings"
)

// Scripted is a stand-in model whose response is a function of the history alone, as
// Python's dex.models.Scripted: for a first program, a demo or a test, with no provider
// and no key. A model call that runs again after a crash gets the same response.
//
//	model := dex.Scripted(func(history []dex.Item) dex.ModelResponse {
//		if last := history[len(history)-1]; last.Type == "tool_result" {
//			return dex.Say("Done: " + string(last.Result))
//		}
//		return dex.ModelResponse{ToolCalls: []dex.ModelToolCall{
//			dex.Call("get_weather", map[string]any{"city": "Paris"}),
//		}}
//	})
type Scripted func(history []Item) ModelResponse

// Say is a final answer: the model's text, and no tool call.
func Say(text string) ModelResponse {
	return ModelResponse{Text: text}
}

// Call is one tool call, with the id "call_1", for a ModelResponse's ToolCalls (give
// each of several calls in one response its own ID).
func Call(name string, args map[string]any) ModelToolCall {
	if args == nil {
		args = map[string]any{}
	}
	return ModelToolCall{ID: "call_1", Name: name, Arguments: args}
}

// Spec names the model: provider "scripted".
func (s Scripted) Spec() map[string]any {
	return map[string]any{"provider": "scripted", "name": "scripted"}
}

// Stream answers with the script's response, its text sent as one delta.
func (s Scripted) Stream(ctx context.Context, req ModelRequest, emit func(text string)) (ModelResponse, error) {
	if s == nil {
		return ModelResponse{}, &ModelError{Message: "dex.Scripted has no function of the history", Retryable: false}
	}
	response := s(req.History)
	if response.Text != "" {
		emit(response.Text)
	}
	return response, nil
}

// Summarize writes a deterministic summary, Python's Scripted's: how many items there
// were, the summary before them, and what the user said.
func (s Scripted) Summarize(ctx context.Context, req ModelRequest) (Summary, error) {
	var asked, earlier []string
	for _, item := range req.History {
		switch item.Type {
		case "user":
			asked = append(asked, item.Text)
		case "summary":
			earlier = append(earlier, item.Text)
		}
	}
	parts := []string{fmt.Sprintf("Summary of %d items.", len(req.History))}
	if len(earlier) > 0 {
		parts = append(parts, "Before that: "+earlier[len(earlier)-1])
	}
	if len(asked) > 0 {
		parts = append(parts, "The user said: "+strings.Join(asked, " | "))
	}
	return Summary{Text: strings.Join(parts, " ")}, nil
}
