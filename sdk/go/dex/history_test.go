package dex

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

var turn1 = []Item{
	{Type: "user", Text: "hi"},
	{Type: "assistant", ToolCalls: []ModelToolCall{{ID: "c0", Name: "t", Arguments: map[string]any{}}}},
	{Type: "tool_result", CallID: "c0", Name: "t", Status: "succeeded", Result: json.RawMessage("1")},
}

func texts(items []Item) []string {
	out := []string{}
	for _, i := range items {
		out = append(out, i.Type+":"+i.Text)
	}
	return out
}

func TestAViewBuiltOnABaseIsTheKeptItemsThenTheNewOnes(t *testing.T) {
	c := newHistoryCache(4)
	first, ok, err := c.view("s1", 0, turn1[:1])
	if err != nil || !ok || !reflect.DeepEqual(first, turn1[:1]) {
		t.Fatalf("a base of 0 is the items handed out: %v %v %v", first, ok, err)
	}
	longer, ok, err := c.view("s1", 1, turn1[1:])
	if err != nil || !ok || !reflect.DeepEqual(longer, turn1) {
		t.Fatalf("base 1 keeps the first item and adds the rest: %v %v %v", texts(longer), ok, err)
	}
	// a view handed to a model call is never changed by a later hand-out of the session
	again, _, _ := c.view("s1", 2, []Item{{Type: "user", Text: "other"}})
	if longer[2].Type != "tool_result" || texts(again)[2] != "user:other" {
		t.Fatalf("a later view overwrote an earlier one: %v / %v", texts(longer), texts(again))
	}
}

func TestABaseOfZeroReplacesTheView(t *testing.T) {
	c := newHistoryCache(4)
	c.view("s1", 0, turn1)
	compacted := append([]Item{{Type: "summary", Text: "earlier"}}, turn1[1:]...)
	view, ok, _ := c.view("s1", 0, compacted)
	if !ok || !reflect.DeepEqual(view, compacted) {
		t.Fatalf("a whole view replaces the kept one: %v", texts(view))
	}
	next, ok, _ := c.view("s1", 3, []Item{{Type: "user", Text: "more"}})
	if !ok || next[0].Type != "summary" || len(next) != 4 {
		t.Fatalf("the next delta builds on the replaced view: %v", texts(next))
	}
}

func TestAMissingBaseIsReportedNotGuessed(t *testing.T) {
	c := newHistoryCache(2)
	if _, ok, err := c.view("s1", 2, turn1[2:]); ok || err != nil {
		t.Fatal("a session never seen has no base")
	}
	c.view("s1", 0, turn1[:1])
	if _, ok, _ := c.view("s1", 2, turn1[2:]); ok {
		t.Fatal("a view of 1 item is no base of 2")
	}
	c.view("s1", 0, turn1[:1])
	c.view("a", 0, turn1[:1])
	c.view("b", 0, turn1[:1])
	if _, ok, _ := c.view("s1", 1, turn1[1:]); ok {
		t.Fatal("beyond the bound the least recently used session is dropped")
	}
	if view, ok, _ := c.view("b", 1, turn1[1:]); !ok || !reflect.DeepEqual(view, turn1) {
		t.Fatalf("a recent session is kept: %v", texts(view))
	}
	c.clear()
	if _, ok, _ := c.view("b", 1, turn1[1:]); ok {
		t.Fatal("a new connection starts with no views")
	}
}

func TestHistoryItemsThatDoNotFitTheProtocolAreRefused(t *testing.T) {
	c := newHistoryCache(4)
	c.view("s1", 0, turn1[:1])
	for _, bad := range []Item{{Type: "robot"}, {Type: "tool_result", Name: "t", Status: "failed"}} {
		_, ok, err := c.view("s1", 1, []Item{bad})
		if err == nil || ok || !strings.Contains(err.Error(), "history item 1") {
			t.Fatalf("%+v: want an error naming item 1, got %v", bad, err)
		}
	}
	if _, ok, _ := c.view("s1", 1, turn1[1:2]); ok {
		t.Fatal("a session whose hand-out was refused is not built on")
	}
}
