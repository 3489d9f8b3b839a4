package dex

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// A CheckToolCall runs the tool's Check with the call's arguments (their defaults filled
// in) and idempotency key, and says checked with what it found. A check that cannot tell
// because it returned a ToolError, or because the arguments do not fit, says checked,
// happened null, with the error (the call stays outcome_unknown), as the Python and
// TypeScript Workers do; any other error fails the attempt.
func TestACheckSaysWhatItFoundAndOneThatCannotTellSaysSo(t *testing.T) {
	yes, no := true, false
	check := func(ctx context.Context, call *ToolContext, raw json.RawMessage) (Checked, error) {
		var args struct {
			Amount int    `json:"amount"`
			Memo   string `json:"memo"`
		}
		if err := json.Unmarshal(raw, &args); err != nil {
			return Checked{}, err
		}
		switch args.Amount {
		case 1:
			return Checked{Happened: &yes, Result: fmt.Sprintf("paid %d%s under %s", args.Amount, args.Memo, call.IdempotencyKey)}, nil
		case 2:
			return Checked{Happened: &no}, nil
		case 3:
			return Checked{}, &ToolError{Message: "the bank cannot say"}
		}
		return Checked{}, errors.New("the bank is down")
	}
	pay := Tool{
		Name: "pay", Kind: Write, Check: check,
		Func: func(context.Context, *ToolContext, json.RawMessage) (any, error) {
			return nil, errors.New("a check never runs the body")
		},
		Parameters: map[string]any{
			"type": "object", "required": []any{"amount"},
			"properties": map[string]any{
				"amount": map[string]any{"type": "integer"},
				"memo":   map[string]any{"type": "string", "default": "!"},
			},
		},
	}
	w := limitedWorker(nil, &lockedBuffer{}, pay)
	cases := map[string]struct {
		arguments string
		want      string
	}{
		"k1": {`{"amount": 1}`, `"t":"done","attempt_id":"k1","result":{"status":"checked","result":"paid 1! under key-k1","error":null,` +
			`"question":null,"choices":null,"sleep_seconds":null,"happened":true}`},
		"k2": {`{"amount": 2}`, `"result":{"status":"checked","result":null,"error":null,` +
			`"question":null,"choices":null,"sleep_seconds":null,"happened":false}`},
		"k3": {`{"amount": 3}`, `"result":{"status":"checked","result":null,"error":"the bank cannot say",` +
			`"question":null,"choices":null,"sleep_seconds":null,"happened":null}`},
		"k4": {`{"amount": "lots"}`, `"status":"checked","result":null,"error":"invalid arguments for tool 'pay': amount:`},
		"k5": {`{"amount": 5}`, `"t":"fail","attempt_id":"k5","error":{"message":"the bank is down"`},
	}
	for id, c := range cases {
		tool, call, key := "pay", "c-"+id, "key-"+id
		w.handOut(step{AttemptID: id, SessionID: "s1", StepType: StepCheckToolCall, Attempt: 1, Agent: "a",
			Tool: &tool, CallID: &call, IdempotencyKey: &key, Arguments: json.RawMessage(c.arguments)})
		eventually(t, "the check of "+id, func() bool { return w.result(id) != nil })
		if sent := encoded(t, w.result(id)); !strings.Contains(sent, c.want) {
			t.Errorf("%s: sent %s, want it to hold %s", id, sent, c.want)
		}
	}
}
