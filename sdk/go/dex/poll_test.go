package dex

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
)

// A task's Poll says the task still runs by returning ErrPending, wrapped or not (or, as
// before, the deprecated Pending value): the Step records pending, not a failure.
func TestAPollThatReturnsErrPendingRecordsPending(t *testing.T) {
	answers := map[string]func() (any, error){
		"p1": func() (any, error) { return nil, ErrPending },
		"p2": func() (any, error) { return nil, fmt.Errorf("job 7: %w", ErrPending) },
		"p3": func() (any, error) { return Pending, nil },
		"p4": func() (any, error) { return "done", nil },
	}
	poll := func(ctx context.Context, call *ToolContext, handle json.RawMessage) (any, error) {
		var id string
		if err := json.Unmarshal(handle, &id); err != nil {
			return nil, err
		}
		return answers[id]()
	}
	task := Tool{Name: "job", Kind: Task, Func: func(context.Context, *ToolContext, json.RawMessage) (any, error) {
		return "p1", nil
	}, Poll: poll}
	w := limitedWorker(nil, &lockedBuffer{}, task)
	want := map[string]string{"p1": "pending", "p2": "pending", "p3": "pending", "p4": "succeeded"}
	for id, status := range want {
		tool, call := "job", "c-"+id
		w.handOut(step{AttemptID: id, SessionID: "s1", StepType: StepPollToolTask, Attempt: 1, Agent: "a",
			Tool: &tool, CallID: &call, TaskHandle: json.RawMessage(`"` + id + `"`)})
		eventually(t, "the poll of "+id, func() bool { return w.result(id) != nil })
		var sent struct {
			T      string
			Result struct{ Status string }
		}
		if err := json.Unmarshal([]byte(encoded(t, w.result(id))), &sent); err != nil {
			t.Fatal(err)
		}
		if sent.T != "done" || sent.Result.Status != status {
			t.Errorf("%s: sent %s, want done with status %s", id, encoded(t, w.result(id)), status)
		}
	}
}
