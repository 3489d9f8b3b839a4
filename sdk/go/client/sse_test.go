package client

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The decoder without I/O, as tests/unit/test_sse.py checks the Python Client's: the
// HTML standard's parsing rules, with the stream cut into chunks anywhere.

const stream = "\xef\xbb\xbf: a comment first\r\n" +
	"retry: 2500\r\n" +
	"id: 1\r\n" +
	"event: history.item\r\n" +
	"data: {\"index\": 0,\r\n" +
	"data:  \"text\": \"two lines\"}\r\n" +
	"\r\n" +
	"id:2\n" + // no space after the colon
	"event:model.delta\n" +
	"data:\"caf\xc3\xa9 \xe2\x80\xa8\"\n" + // U+2028 inside the data ends no line
	"\n" +
	"id: 3\r" + // CR alone ends lines too
	"data: 3\r" +
	"unknown: ignored\r" +
	"\r" +
	": keep-alive\n\n" +
	"data\n" + // a field with no colon: data with an empty value
	"data\n" +
	"\n" +
	"id: 4\n" + // an id with no data dispatches nothing, but sets the last event id
	"\n" +
	"data: not finished" // the stream ends before its blank line: never dispatched

var expected = []message{
	{"1", "history.item", "{\"index\": 0,\n \"text\": \"two lines\"}"},
	{"2", "model.delta", "\"café \u2028\""},
	{"3", "message", "3"},
	{"3", "message", "\n"},
}

func decodeChunks(chunks ...string) ([]message, *decoder) {
	d := newDecoder("")
	var out []message
	for _, c := range chunks {
		out = append(out, d.feed([]byte(c))...)
	}
	return out, d
}

func TestTheDecoderFollowsTheStandard(t *testing.T) {
	got, d := decodeChunks(stream)
	if !reflect.DeepEqual(got, expected) {
		t.Fatalf("got %q", got)
	}
	if d.lastEventID != "4" || d.retry != 2500*time.Millisecond {
		t.Fatalf("last id %q, retry %s", d.lastEventID, d.retry)
	}
}

func TestChunksCutAnywhereDecodeTheSame(t *testing.T) {
	for _, size := range []int{1, 2, 3, 5, 7, 64} {
		var chunks []string
		for i := 0; i < len(stream); i += size {
			chunks = append(chunks, stream[i:minInt(i+size, len(stream))])
		}
		got, d := decodeChunks(chunks...)
		if !reflect.DeepEqual(got, expected) || d.lastEventID != "4" {
			t.Fatalf("chunks of %d: got %q, last id %q", size, got, d.lastEventID)
		}
	}
	for cut := 0; cut < len(stream); cut++ {
		if got, _ := decodeChunks(stream[:cut], stream[cut:]); !reflect.DeepEqual(got, expected) {
			t.Fatalf("cut at %d: got %q", cut, got)
		}
	}
}

func TestACRLFThenABlankLFLineDispatches(t *testing.T) {
	for _, chunks := range [][]string{{"data: 1\r\n\n"}, {"data: 1\r", "\n", "\n"}, {"data: 1\r", "\n\n"}} {
		if got, _ := decodeChunks(chunks...); len(got) != 1 || got[0].data != "1" {
			t.Fatalf("%q: got %q", chunks, got)
		}
	}
}

func TestALongLineInManyChunks(t *testing.T) {
	text := strings.Repeat("x", 300_000)
	payload := "id: 9\ndata: \"" + text + "\"\n\n"
	var chunks []string
	for i := 0; i < len(payload); i += 4096 {
		chunks = append(chunks, payload[i:minInt(i+4096, len(payload))])
	}
	got, _ := decodeChunks(chunks...)
	var data string
	if len(got) != 1 || got[0].id != "9" || json.Unmarshal([]byte(got[0].data), &data) != nil || data != text {
		t.Fatalf("got %d messages", len(got))
	}
}

func TestANewConnectionDropsTheUnfinishedEventAndKeepsTheLastID(t *testing.T) {
	d := newDecoder("7")
	if got := d.feed([]byte("id: 8\ndata: 8\n\nid: 9\ndata: half")); !reflect.DeepEqual(got, []message{{"8", "message", "8"}}) {
		t.Fatalf("got %q", got)
	}
	d.reset()
	if d.lastEventID != "8" {
		t.Fatalf("last id %q", d.lastEventID)
	}
	if got := d.feed([]byte("data: 10\n\n")); !reflect.DeepEqual(got, []message{{"8", "message", "10"}}) {
		t.Fatalf("got %q", got)
	}
}

func TestANullInAnIDLeavesTheLastID(t *testing.T) {
	d := newDecoder("5")
	if got := d.feed([]byte("id: 6\x007\ndata: 1\n\n")); !reflect.DeepEqual(got, []message{{"5", "message", "1"}}) {
		t.Fatalf("got %q", got)
	}
}

func TestInvalidUTF8AndABadRetryAreTakenCalmly(t *testing.T) {
	got, d := decodeChunks("retry: 12x\nretry: -1\ndata: a\xffb\n\n")
	if len(got) != 1 || got[0].data != "a\uFFFDb" || d.retry != 0 {
		t.Fatalf("got %q, retry %s", got, d.retry)
	}
}

func minInt(a, b int) int {
	if a < b {
		return a
	}
	return b
}
