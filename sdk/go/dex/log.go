package dex

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The Worker's log lines are those of the Python server and Worker (docs/operations.md,
// "Logs"): "console" (the default, for people) or "json" (one object a line), chosen by
// WorkerOptions.LogFormat or DEX_LOG_FORMAT, at a least level (WorkerOptions.LogLevel or
// DEX_LOG_LEVEL: debug, info, warning or error; default info):
//
//	2026-12-07 01:02:03,456 INFO dex.worker connected to http://127.0.0.1:7450 action=worker.connected address=http://127.0.0.1:7450 agents=concierge capacity=16 worker_id=...
//	{"time":"2026-12-07T01:02:03.456Z","level":"info","logger":"dex.worker","message":"connected to ...","action":"worker.connected",...}
//
// The console line's time is local, as Python's logging writes it; the JSON's is UTC.
const (
	LogConsole = "console"
	LogJSON    = "json"
)

const loggerName = "dex.worker"

var logLevels = []string{"debug", "info", "warning", "error"}

// field is one key=value of a log line, kept in order.
type field struct {
	key   string
	value any
}

// logger writes the Worker's lines to a *log.Logger (WorkerOptions.Logger; its prefix
// and flags, if any, come first) or, by default, to stderr.
type logger struct {
	json  bool
	level int
	out   *log.Logger
	mu    sync.Mutex
	to    io.Writer
}

func newLogger(format, level string, out *log.Logger) *logger {
	l := &logger{json: format == LogJSON, level: levelIndex(level), out: out, to: os.Stderr}
	if l.level < 0 {
		l.level = 1
	}
	return l
}

func levelIndex(level string) int {
	for i, name := range logLevels {
		if name == level {
			return i
		}
	}
	return -1
}

func (l *logger) debug(action, message string, fields ...field) {
	l.line(0, action, message, fields)
}

func (l *logger) info(action, message string, fields ...field) {
	l.line(1, action, message, fields)
}

func (l *logger) warning(action, message string, fields ...field) {
	l.line(2, action, message, fields)
}

func (l *logger) error(action, message string, fields ...field) {
	l.line(3, action, message, fields)
}

func (l *logger) line(level int, action, message string, fields []field) {
	if level < l.level {
		return
	}
	now := time.Now()
	fields = append([]field{{"action", action}}, fields...)
	var b strings.Builder
	if l.json {
		b.WriteString(`{"time":`)
		b.Write(jsonText(now.UTC().Format("2006-01-02T15:04:05.000Z")))
		b.WriteString(`,"level":`)
		b.Write(jsonText(logLevels[level]))
		b.WriteString(`,"logger":`)
		b.Write(jsonText(loggerName))
		b.WriteString(`,"message":`)
		b.Write(jsonText(message))
		for _, f := range fields {
			b.WriteString(",")
			b.Write(jsonText(f.key))
			b.WriteString(":")
			b.Write(jsonText(f.value))
		}
		b.WriteString("}")
	} else {
		b.WriteString(now.Format("2006-01-02 15:04:05,000"))
		b.WriteString(" " + strings.ToUpper(logLevels[level]) + " " + loggerName + " " + message)
		for _, f := range fields {
			b.WriteString(" " + f.key + "=" + fieldText(f.value))
		}
	}
	if l.out != nil {
		l.out.Print(b.String())
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintln(l.to, b.String())
}

// jsonText is v as JSON, with <, > and & as they are (as Python and JavaScript write them).
func jsonText(v any) []byte {
	var b bytes.Buffer
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	if err := e.Encode(v); err != nil {
		return jsonText(fmt.Sprint(v))
	}
	return bytes.TrimRight(b.Bytes(), "\n")
}

// fieldText is a field's value in a console line: a list as its items joined by commas,
// a number as JavaScript writes it, and quoted as a JSON string when it would not read as
// one word.
func fieldText(value any) string {
	var text string
	switch v := value.(type) {
	case []string:
		text = strings.Join(v, ",")
	case float64:
		text = strconv.FormatFloat(v, 'f', -1, 64)
	case error:
		text = v.Error()
	default:
		text = fmt.Sprint(v)
	}
	if text == "" || strings.ContainsAny(text, " \t\n\r\"=") {
		return string(jsonText(text))
	}
	return text
}

// seconds is d in seconds, to the millisecond.
func seconds(d time.Duration) float64 {
	return math.Round(d.Seconds()*1000) / 1000
}

// connectionLog decides which connection events are worth a line: one per change, not
// one per retry (as the Python Worker's dex.worker.connection_log and the TypeScript
// Worker's ConnectionLog).
type connectionLog struct {
	log      *logger
	workerID string
	agents   []string
	capacity int
	clock    func() time.Time // nil: time.Now

	mu            sync.Mutex
	everConnected bool      // whether any node ever welcomed this Worker
	lostAt        time.Time // when the last connection was lost, until the next welcome
	failedTries   int       // tries that failed since the last welcome (or since the start)
}

func (c *connectionLog) now() time.Time {
	if c.clock != nil {
		return c.clock()
	}
	return time.Now()
}

// connected: a node welcomed this Worker.
func (c *connectionLog) connected(address string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.everConnected {
		c.log.info("worker.connected", "connected to "+address,
			field{"address", address}, field{"agents", c.agents}, field{"capacity", c.capacity},
			field{"worker_id", c.workerID})
	} else {
		tries := c.failedTries + 1
		after := seconds(c.now().Sub(c.lostAt))
		word := "tries"
		if tries == 1 {
			word = "try"
		}
		c.log.info("worker.reconnected",
			fmt.Sprintf("reconnected to %s after %ss and %d %s", address, fieldText(after), tries, word),
			field{"address", address}, field{"tries", tries}, field{"seconds", after},
			field{"worker_id", c.workerID})
	}
	c.everConnected = true
	c.failedTries = 0
}

// failed: a try reached no node that serves (unreachable, or closed before its welcome).
// Only the first before any welcome is a warning; the others are debug.
func (c *connectionLog) failed(address string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failedTries++
	fields := []field{{"address", address}, {"error", err.Error()}}
	if !c.everConnected && c.failedTries == 1 {
		c.log.warning("worker.connect_failed",
			fmt.Sprintf("cannot reach %s: %v; trying again until it answers", address, err), fields...)
		return
	}
	c.log.debug("worker.connect_failed", fmt.Sprintf("cannot reach %s: %v", address, err), fields...)
}

// lost: a connection that had been welcomed ended, and the Worker goes on (without
// reconnecting to a node that no connected node lists any more).
func (c *connectionLog) lost(address string, err error, reconnecting bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lostAt = c.now()
	c.failedTries = 0
	then := "reconnecting"
	if !reconnecting {
		then = "no node lists it any more, not reconnecting"
	}
	c.log.warning("worker.connection_lost",
		fmt.Sprintf("lost the connection to %s: %v; %s", address, err, then),
		field{"address", address}, field{"error", err.Error()})
}

// letGo: a cluster member whose connection is down and that no connected node lists any
// more.
func (c *connectionLog) letGo(address string) {
	c.log.info("worker.node_left",
		fmt.Sprintf("no connected node lists %s any more: not reconnecting to it", address),
		field{"address", address})
}

// stopped: the Worker stops, drained after reason (a signal's name, or shutdown), or
// given up on err.
func (c *connectionLog) stopped(reason string, err error) {
	if err != nil {
		c.log.error("worker.stopped", "stopped: "+err.Error(),
			field{"reason", "error"}, field{"error", err.Error()}, field{"worker_id", c.workerID})
		return
	}
	c.log.info("worker.stopped", "stopped: "+reason+", drained",
		field{"reason", reason}, field{"worker_id", c.workerID})
}
