package dex

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"testing"
)

var booking = map[string]any{
	"type": "object",
	"properties": map[string]any{
		"city":   map[string]any{"type": "string", "minLength": 2, "maxLength": 20, "pattern": "^[A-Z]"},
		"guests": map[string]any{"type": "integer", "minimum": 1, "maximum": 12},
		"price":  map[string]any{"type": "number", "exclusiveMinimum": 0, "multipleOf": 0.5},
		"kind":   map[string]any{"enum": []string{"table", "room"}},
		"note":   map[string]any{"anyOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "null"}}, "default": nil},
		"tags":   map[string]any{"type": "array", "items": map[string]any{"type": "string"}, "maxItems": 2, "uniqueItems": true},
		"when":   map[string]any{"$ref": "#/$defs/When"},
		"vip":    map[string]any{"type": "boolean", "default": false},
	},
	"required":             []string{"city", "guests"},
	"additionalProperties": false,
	"$defs": map[string]any{"When": map[string]any{
		"type":                 "object",
		"properties":           map[string]any{"day": map[string]any{"type": "string"}, "hour": map[string]any{"type": "integer"}},
		"required":             []string{"day"},
		"additionalProperties": false,
	}},
}

func problems(t *testing.T, args string) string {
	t.Helper()
	_, err := checkArguments("book", booking, json.RawMessage(args))
	if err == nil {
		return ""
	}
	var known *ToolError
	if !errors.As(err, &known) {
		t.Fatalf("%s: want a ToolError, got %v", args, err)
	}
	return known.Message
}

func TestValidArgumentsPassWithTheDefaultsOfTheParametersLeftOut(t *testing.T) {
	out, err := checkArguments("book", booking, json.RawMessage(
		`{"city":"Paris","guests":2,"price":12.5,"kind":"table","tags":["a","b"],"when":{"day":"mon","hour":20}}`))
	if err != nil {
		t.Fatal(err)
	}
	var args map[string]any
	if err := json.Unmarshal(out, &args); err != nil {
		t.Fatal(err)
	}
	if args["vip"] != false || args["note"] != nil || args["city"] != "Paris" {
		t.Fatalf("want the defaults filled in: %v", args)
	}
	if _, has := args["note"]; !has {
		t.Fatal("a default of null is filled in too")
	}
}

func TestArgumentProblemsAreNamedByPath(t *testing.T) {
	for args, want := range map[string]string{
		`{"city":"Paris","extra":1}`:                       `^invalid arguments for tool 'book': guests: missing; extra: not a parameter$`,
		`{"city":"Paris","guests":"3"}`:                    `guests: want integer, got string`,
		`{"city":"Paris","guests":2.5}`:                    `guests: want integer, got number`,
		`[]`:                                               `arguments: want object, got array`,
		`{"city":"Paris","guests":0}`:                      `guests: at least 1, got 0`,
		`{"city":"Paris","guests":13}`:                     `guests: at most 12, got 13`,
		`{"city":"P","guests":1}`:                          `city: at least 2 characters`,
		`{"city":"paris","guests":1}`:                      `city: does not match \^\[A-Z\]`,
		`{"city":"Paris","guests":1,"price":0}`:            `price: more than 0`,
		`{"city":"Paris","guests":1,"price":1.2}`:          `price: a multiple of 0.5`,
		`{"city":"Paris","guests":1,"kind":"car"}`:         `kind: want one of "table", "room"`,
		`{"city":"Paris","guests":1,"tags":["a",2]}`:       `tags\.1: want string`,
		`{"city":"Paris","guests":1,"tags":["a","a"]}`:     `tags: items must be unique`,
		`{"city":"Paris","guests":1,"tags":["a","b","c"]}`: `tags: at most 2 items`,
		`{"city":"Paris","guests":1,"when":{"hour":1}}`:    `when\.day: missing`,
		`{"city":"Paris","guests":1,"note":5}`:             `note: fits none of the allowed shapes`,
		`{"city":"Paris",`:                                 `not JSON`,
	} {
		if got := problems(t, args); !regexp.MustCompile(want).MatchString(got) {
			t.Errorf("%s: got %q, want it to match %s", args, got, want)
		}
	}
	for _, fine := range []string{`{"city":"Paris","guests":2,"price":3}`, `{"city":"Paris","guests":1,"note":null}`, `{"city":"Paris","guests":2.0}`} {
		if got := problems(t, fine); got != "" {
			t.Errorf("%s: want no problem, got %q", fine, got)
		}
	}
}

func TestAnInvalidCallNeverRunsItsBodyAndAValidOneSeesTheTraceparent(t *testing.T) {
	ran := 0
	body := func(ctx context.Context, call *ToolContext, args json.RawMessage) (any, error) {
		ran++
		return map[string]any{"args": args, "traceparent": call.Traceparent}, nil
	}
	w := NewWorker(WorkerOptions{Address: "http://127.0.0.1:1", Agents: []Agent{{
		Name: "a", Model: viewModel{}, Tools: []Tool{{Name: "book", Kind: Read, Parameters: booking, Func: body}},
	}}})
	tool, trace := "book", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	call := func(id, args string) step {
		return step{AttemptID: id, SessionID: "s", StepType: StepCallTool, Attempt: 1, Agent: "a", Tool: &tool,
			CallID: &id, Arguments: json.RawMessage(args), Traceparent: &trace}
	}
	w.handOut(call("bad", `{"city":"Paris"}`))
	w.handOut(call("good", `{"city":"Paris","guests":2}`))
	eventually(t, "both calls settled", func() bool { return w.result("bad") != nil && w.result("good") != nil })
	var bad, good struct {
		Status string
		Error  *string
		Result struct {
			Args        map[string]any
			Traceparent string
		}
	}
	for m, into := range map[string]any{"bad": &bad, "good": &good} {
		if err := json.Unmarshal(w.result(m).(doneMessage).Result, into); err != nil {
			t.Fatal(err)
		}
	}
	if bad.Status != "failed" || bad.Error == nil || *bad.Error != "invalid arguments for tool 'book': guests: missing" {
		t.Fatalf("an invalid call records failed and says why: %+v", bad)
	}
	if ran != 1 || good.Status != "succeeded" || good.Result.Traceparent != trace || good.Result.Args["vip"] != false {
		t.Fatalf("the valid call runs once, with defaults and the traceparent: ran %d, %+v", ran, good)
	}
}
