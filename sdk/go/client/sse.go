package client

import (
	"bytes"
	"math"
	"strconv"
	"strings"
	"time"
)

// Reading text/event-stream as the HTML standard's event stream interpretation says
// (https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation),
// as the Python Client's dex.client.sse does.
//
// Lines end with CRLF, LF or CR, also across chunks; a line starting with ":" is a
// comment; "field: value" loses one space after the colon, and a line with no colon is a
// field with an empty value. "data" lines are joined with LF; "event" names the type
// ("message" if none); "id" sets the last event id, which stays until an "id" changes it;
// "retry" sets the reconnection time; anything else is ignored. A blank line dispatches
// the event, if it has data. A byte order mark before the first line is dropped. Lines
// are split as bytes, then read as UTF-8 (an invalid sequence becomes U+FFFD).

// message is one dispatched event: id is the last event id when it was dispatched.
type message struct {
	id, typ, data string
}

var bom = []byte("\xef\xbb\xbf")

const maxRetryMillis = uint64(math.MaxInt64 / int64(time.Millisecond))

// decoder turns the chunks of one stream into messages; it keeps, between streams, the
// last event id (Last-Event-ID for a reconnect) and the server's reconnection time.
type decoder struct {
	lastEventID string        // of the last event dispatched (or given to start from)
	retry       time.Duration // the reconnection time the server asked for (retry:)
	id          string        // the id buffer: set by a field, read at dispatch
	typ         string
	data        []string
	partial     []byte // a line not ended yet
	afterCR     bool   // the last chunk ended with CR: an LF first in this one ends no line
	started     bool   // a line was read: a byte order mark is no longer dropped
}

func newDecoder(lastEventID string) *decoder {
	return &decoder{lastEventID: lastEventID, id: lastEventID}
}

// reset starts a new connection: an event the last one did not finish is dropped.
func (d *decoder) reset() {
	d.typ, d.data, d.partial, d.afterCR, d.started = "", nil, nil, false, false
	d.id = d.lastEventID
}

// feed returns the messages that chunk completes.
func (d *decoder) feed(chunk []byte) []message {
	var out []message
	for len(chunk) > 0 {
		if d.afterCR {
			d.afterCR = false
			if chunk[0] == '\n' {
				chunk = chunk[1:] // the LF of a CRLF cut between chunks
				continue
			}
		}
		end := bytes.IndexAny(chunk, "\r\n")
		if end < 0 {
			d.partial = append(d.partial, chunk...)
			break
		}
		line := chunk[:end]
		if len(d.partial) > 0 {
			line = append(d.partial, line...)
		}
		if chunk[end] == '\r' {
			if end+1 < len(chunk) {
				if chunk[end+1] == '\n' {
					end++
				}
			} else {
				d.afterCR = true
			}
		}
		chunk = chunk[end+1:]
		if m, ok := d.line(line); ok {
			out = append(out, m)
		}
		d.partial = d.partial[:0]
	}
	return out
}

// line reads one line; a blank one dispatches the event, if it has data.
func (d *decoder) line(line []byte) (message, bool) {
	if !d.started {
		d.started = true
		line = bytes.TrimPrefix(line, bom)
	}
	if len(line) == 0 {
		d.lastEventID = d.id
		if len(d.data) == 0 {
			d.typ = ""
			return message{}, false
		}
		m := message{id: d.lastEventID, typ: d.typ, data: strings.Join(d.data, "\n")}
		if m.typ == "" {
			m.typ = "message"
		}
		d.typ, d.data = "", nil
		return m, true
	}
	name, value, _ := bytes.Cut(line, []byte(":"))
	if len(name) == 0 {
		return message{}, false // a comment (a keep-alive)
	}
	value = bytes.TrimPrefix(value, []byte(" "))
	switch string(name) {
	case "data":
		d.data = append(d.data, text(value))
	case "event":
		d.typ = text(value)
	case "id":
		if bytes.IndexByte(value, 0) < 0 {
			d.id = text(value)
		}
	case "retry":
		if ms, err := strconv.ParseUint(string(value), 10, 64); err == nil && digits(value) {
			if ms > maxRetryMillis {
				ms = maxRetryMillis // no wait so long it overflows a Duration
			}
			d.retry = time.Duration(ms) * time.Millisecond
		}
	}
	return message{}, false
}

func text(b []byte) string {
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

func digits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return len(b) > 0
}
