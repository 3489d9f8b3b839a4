package dex

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// stepFrame is a frame of n step hand-outs as a busy node sends them: every other one a
// RunModel with a history of 16 items, the others CallTool with arguments.
func stepFrame(tb testing.TB, n int) []byte {
	tb.Helper()
	type sent struct {
		T string `json:"t"`
		step
	}
	errText := "the lookup timed out"
	frame := make([]sent, 0, n)
	for i := 0; i < n; i++ {
		tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		s := step{
			AttemptID: fmt.Sprintf("s%d/1.%d/1", i, i+1), SessionID: fmt.Sprintf("s%d", i),
			StepID: fmt.Sprintf("s%d/1.%d", i, i+1), Attempt: 1, Agent: "assistant",
			Traceparent: &tp,
		}
		if i%2 == 0 {
			s.StepType = StepRunModel
			for j := 0; j < 16; j++ {
				switch j % 4 {
				case 0:
					s.History = append(s.History, Item{Type: "user", Text: strings.Repeat("What is the weather in Lyon? ", 6)})
				case 1:
					s.History = append(s.History, Item{Type: "assistant", ToolCalls: []ModelToolCall{
						{ID: fmt.Sprintf("c%d", j), Name: "weather", Arguments: map[string]any{"city": "Lyon", "days": 3}},
					}})
				case 2:
					s.History = append(s.History, Item{
						Type: "tool_result", CallID: fmt.Sprintf("c%d", j-1), Name: "weather", Status: "ok",
						Result: json.RawMessage(`{"city":"Lyon","forecast":[{"day":1,"sky":"sun","high":24},{"day":2,"sky":"rain","high":18}]}`),
					})
				default:
					s.History = append(s.History, Item{Type: "tool_result", CallID: "x", Name: "weather", Status: "error", Error: &errText})
				}
			}
		} else {
			tool, call, key := "weather", fmt.Sprintf("c%d", i), fmt.Sprintf("s%d/1.%d", i, i+1)
			s.StepType = StepCallTool
			s.Tool, s.CallID, s.IdempotencyKey = &tool, &call, &key
			s.Arguments = json.RawMessage(`{"city":"Lyon","days":3,"units":"metric"}`)
		}
		frame = append(frame, sent{T: "step", step: s})
	}
	data, err := json.Marshal(frame)
	if err != nil {
		tb.Fatal(err)
	}
	return data
}

// BenchmarkDecodeStepFrame decodes a frame of 64 steps into the hand-outs the Worker runs.
func BenchmarkDecodeStepFrame(b *testing.B) {
	data := stepFrame(b, 64)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		frame, err := decodeFrame(data)
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range frame {
			if s, ok := m.(step); !ok || s.AttemptID == "" {
				b.Fatalf("not a step: %+v", m)
			}
		}
	}
}
