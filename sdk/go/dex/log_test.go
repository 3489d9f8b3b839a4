package dex

import (
	"encoding/json"
	"log"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

var consoleLine = regexp.MustCompile(`^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (\w+) dex\.worker (.*)$`)

func TestAConsoleLineIsTheTimeLevelLoggerMessageThenTheFields(t *testing.T) {
	out := &lockedBuffer{}
	l := newLogger(LogConsole, "info", log.New(out, "", 0))
	l.warning("worker.connection_lost", "lost it", field{"address", "http://a"}, field{"error", "cut off"})
	l.debug("worker.connect_failed", "below the level: not written")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("one line: %q", lines)
	}
	m := consoleLine.FindStringSubmatch(lines[0])
	if m == nil || m[1] != "WARNING" || m[2] != `lost it action=worker.connection_lost address=http://a error="cut off"` {
		t.Fatalf("the Python server's console format: %q", lines[0])
	}
	if fieldText([]string{"a", "b"}) != "a,b" || fieldText(30.0) != "30" || fieldText(2.5) != "2.5" || fieldText("a=b") != `"a=b"` {
		t.Fatal("a list is its items joined, a number as JavaScript writes it, a value with = quoted")
	}
}

func TestAJSONLineIsOneObjectInOrder(t *testing.T) {
	out := &lockedBuffer{}
	l := newLogger(LogJSON, "info", log.New(out, "", 0))
	l.info("worker.connected", "connected to http://a & b", field{"agents", []string{"x"}}, field{"capacity", 16})
	line := strings.TrimSpace(out.String())
	var entry map[string]any
	if err := json.Unmarshal([]byte(line), &entry); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`).MatchString(entry["time"].(string)) {
		t.Fatalf("UTC time to the millisecond: %v", entry["time"])
	}
	delete(entry, "time")
	want := map[string]any{"level": "info", "logger": "dex.worker", "message": "connected to http://a & b",
		"action": "worker.connected", "agents": []any{"x"}, "capacity": 16.0}
	if !reflect.DeepEqual(entry, want) {
		t.Fatalf("got %v", entry)
	}
	order := []string{`"time"`, `"level"`, `"logger"`, `"message"`, `"action"`, `"agents"`, `"capacity"`}
	for i := 1; i < len(order); i++ {
		if strings.Index(line, order[i-1]) > strings.Index(line, order[i]) {
			t.Fatalf("keys in the Python Worker's order: %s", line)
		}
	}
}

func TestAnOutageIsOneLostLineAndOneReconnectedLine(t *testing.T) {
	out := &lockedBuffer{}
	now := time.Unix(100, 0)
	c := &connectionLog{log: newLogger(LogJSON, "info", log.New(out, "", 0)), workerID: "w-1",
		agents: []string{"concierge"}, capacity: 16, clock: func() time.Time { return now }}
	refused := errString("refused")
	c.failed("http://a", refused) // started before its server: said once
	c.failed("http://a", refused)
	c.connected("http://a")
	c.lost("http://a", errString("the connection closed (1006)"), true)
	for i := 0; i < 5; i++ {
		now = now.Add(500 * time.Millisecond)
		c.failed("http://a", refused)
	}
	c.connected("http://b")
	c.stopped("SIGTERM", nil)
	var seen [][3]string
	var entries []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatal(err)
		}
		entries = append(entries, e)
		seen = append(seen, [3]string{e["level"].(string), e["action"].(string), e["message"].(string)})
	}
	want := [][3]string{
		{"warning", "worker.connect_failed", "cannot reach http://a: refused; trying again until it answers"},
		{"info", "worker.connected", "connected to http://a"},
		{"warning", "worker.connection_lost", "lost the connection to http://a: the connection closed (1006); reconnecting"},
		{"info", "worker.reconnected", "reconnected to http://b after 2.5s and 6 tries"},
		{"info", "worker.stopped", "stopped: SIGTERM, drained"},
	}
	if !reflect.DeepEqual(seen, want) {
		t.Fatalf("got %q", seen)
	}
	if back := entries[3]; back["address"] != "http://b" || back["tries"] != 6.0 || back["seconds"] != 2.5 {
		t.Fatalf("the reconnect says where, in how many tries, after how long: %v", back)
	}
}

type errString string

func (e errString) Error() string { return string(e) }
