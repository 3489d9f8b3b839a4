// The messages that settle an attempt (done, fail, back), built from what its code returned.

package dex

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strings"
)

func done(s step, result any) message {
	raw, err := json.Marshal(result)
	if err != nil {
		return failed(s, fmt.Sprintf("the result does not encode as JSON: %v", err), false)
	}
	if n, huge := hugeInteger(raw); huge {
		// sent, the node would close the connection (4400) on this frame and on every
		// resend: the attempt fails instead, and the node decides what runs again, as
		// the Python and TypeScript Workers do
		return failed(s, fmt.Sprintf("the result cannot be sent as JSON: the integer %s "+
			"is beyond what the protocol carries (-2^63 to 2^64-1); send it as a string", n), true)
	}
	return doneMessage{T: "done", AttemptID: s.AttemptID, Result: raw}
}

var (
	smallestInteger = new(big.Int).Neg(new(big.Int).Lsh(big.NewInt(1), 63))
	largestInteger  = new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 64), big.NewInt(1))
)

// hugeInteger finds an integer in the JSON text raw that lies beyond -2^63..2^64-1 (a
// big.Int, a json.Number): the node refuses a frame that holds one. Only text with a run
// of 19 digits (2^63 has 19) is decoded to look.
func hugeInteger(raw []byte) (string, bool) {
	run := 0
	for _, c := range raw {
		if c < '0' || c > '9' {
			run = 0
		} else if run++; run >= 19 {
			break
		}
	}
	if run < 19 {
		return "", false
	}
	decoder := json.NewDecoder(bytes.NewReader(raw))
	decoder.UseNumber()
	var value any
	if decoder.Decode(&value) != nil {
		return "", false
	}
	return hugeIn(value)
}

func hugeIn(value any) (string, bool) {
	switch v := value.(type) {
	case json.Number:
		if strings.ContainsAny(string(v), ".eE") {
			return "", false // a float: JSON numbers with a fraction or exponent are not integers
		}
		n, ok := new(big.Int).SetString(string(v), 10)
		if ok && (n.Cmp(smallestInteger) < 0 || n.Cmp(largestInteger) > 0) {
			return string(v), true
		}
	case []any:
		for _, item := range v {
			if n, huge := hugeIn(item); huge {
				return n, true
			}
		}
	case map[string]any:
		for _, item := range v {
			if n, huge := hugeIn(item); huge {
				return n, true
			}
		}
	}
	return "", false
}

func succeeded(s step, value any) message {
	return done(s, toolOutcome{Status: "succeeded", Result: value})
}

// toolFailed is a call's known failure: the model sees text. A check that fails so (a
// ToolError, arguments that do not fit) could not tell: it says checked, happened null,
// and the call's outcome stays unknown, as in the Python and TypeScript Workers.
func toolFailed(s step, text string) message {
	if s.StepType == StepCheckToolCall {
		return done(s, toolOutcome{Status: "checked", Error: &text})
	}
	return done(s, toolOutcome{Status: "failed", Error: &text})
}

// toolError: a ToolError is a known failure, a wait ends the call for now, anything
// else fails the attempt (the code may have run).
func toolError(s step, err error) message {
	var known *ToolError
	if errors.As(err, &known) {
		return toolFailed(s, known.Message)
	}
	var wait *waitError
	if errors.As(err, &wait) {
		return done(s, wait.outcome)
	}
	return failed(s, err.Error(), true)
}

// modelFailure settles a model call that returned err: a provider's rate limit goes back
// (no attempt used; logged), any other error fails the attempt.
func (w *Worker) modelFailure(s step, err error) message {
	var limited *RateLimitedError
	if errors.As(err, &limited) {
		fields := []field{{"attempt_id", s.AttemptID}, {"session_id", s.SessionID}}
		back := rateLimited(s.AttemptID, limited)
		if back.RetryAfter != nil {
			fields = append(fields, field{"retry_after", *back.RetryAfter})
		}
		w.log.info("worker.rate_limited", limited.Message, fields...)
		return back
	}
	var me *ModelError
	if errors.As(err, &me) {
		return failed(s, me.Message, me.Retryable)
	}
	return failed(s, err.Error(), true)
}

func failed(s step, text string, retryable bool) message {
	return failMessage{T: "fail", AttemptID: s.AttemptID, Error: recoveryError{
		Message: text, AttemptProgress: "NOT_COMPLETED", Retryable: retryable,
	}}
}
