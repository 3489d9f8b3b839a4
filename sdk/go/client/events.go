package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"
)

// Event is one event of a session's stream.
type Event struct {
	// ID is the last event id when it came (opaque): pass it as
	// StreamOptions.LastEventID to resume after it. The stream's own notices
	// (EventStreamGap, EventStreamDropped) have the id of the event before them.
	ID string
	// Type is EventHistoryItem, EventTurnStarted, EventTurnCompleted, ... (docs/streams.md).
	Type string
	// Data is the event's JSON.
	Data json.RawMessage
}

// StreamOptions shape StreamEvents.
type StreamOptions struct {
	// LastEventID resumes after that event ("": every event the server keeps, then
	// live ones).
	LastEventID string
	// NoReconnect: a break ends the stream with ErrUnavailable, and the end of the
	// response ends it with no error, instead of connecting again.
	NoReconnect bool
}

// EventStream reads a session's events; see StreamEvents. Next, Event and Err are for
// one goroutine; Close may be called from any.
type EventStream struct {
	c         *Client
	ctx       context.Context
	cancel    context.CancelFunc
	sessionID string
	path      string
	reconnect bool
	decoder   *decoder
	buf       []byte
	pending   []Event
	event     Event
	lastID    string
	err       error
	done      bool
	opened    bool // a response was read: the next open is a reconnect
	closed    atomic.Bool

	// the open response, its context and its silence timer
	body   io.ReadCloser
	stop   context.CancelFunc
	timer  *time.Timer
	silent *atomic.Bool
}

// StreamEvents follows the session's events as they happen (Server-Sent Events):
// history.item, turn.started / turn.completed / turn.failed / turn.cancelled,
// wait.started, message.queued, message.steered and live model.delta text. Read them
// with Next and Event; Close (or ctx) ends the stream.
//
// A stream that breaks or ends (a node restarting, a standby taking over, a network
// error, a 5xx, 45 s without a byte) is opened again with the last id seen as
// Last-Event-ID, over every address, with backoff (full jitter from 0.05 s up to 2 s,
// never sooner than the server's retry:), until the client's timeout has passed without
// one: then Err is ErrUnavailable. A 4xx ends it at once (ErrNotFound for an unknown
// session). With opts.NoReconnect, a break is ErrUnavailable and the end of the
// response the end of the stream.
func (c *Client) StreamEvents(ctx context.Context, sessionID string, opts StreamOptions) *EventStream {
	ctx, cancel := context.WithCancel(ctx)
	return &EventStream{
		c: c, ctx: ctx, cancel: cancel, sessionID: sessionID,
		path:      sessionPath(sessionID, "events"),
		reconnect: !opts.NoReconnect,
		decoder:   newDecoder(opts.LastEventID),
		lastID:    opts.LastEventID,
		buf:       make([]byte, 32*1024),
	}
}

// Next waits for the next event; false when the stream ended: then Err says why (nil
// after Close, or the end of the response with NoReconnect).
func (s *EventStream) Next() bool {
	for {
		if len(s.pending) > 0 {
			s.event, s.pending = s.pending[0], s.pending[1:]
			s.lastID = s.event.ID
			return true
		}
		if s.err != nil || s.done {
			return false
		}
		if s.closed.Load() {
			s.finish(nil)
			return false
		}
		if s.body == nil {
			if s.opened {
				s.decoder.reset() // an event the last response did not finish is dropped
				if err := sleep(s.ctx, s.decoder.retry); err != nil {
					s.finish(err)
					continue
				}
			}
			first, err := s.open()
			if err != nil {
				s.finish(err)
				continue
			}
			s.opened = true
			s.feed(first)
			continue
		}
		n, err := s.body.Read(s.buf)
		if n > 0 {
			s.timer.Reset(silence)
			s.feed(s.buf[:n])
		}
		if err == nil || s.done {
			continue
		}
		silent := s.silent.Load()
		s.drop()
		switch {
		case s.closed.Load():
			s.finish(nil)
		case s.ctx.Err() != nil:
			s.finish(s.ctx.Err())
		case !s.reconnect && err == io.EOF:
			s.finish(nil)
		case !s.reconnect:
			if silent {
				err = fmt.Errorf("nothing came for %s", silence)
			}
			s.finish(s.broken(err))
		}
	}
}

// Event is the event Next read.
func (s *EventStream) Event() Event { return s.event }

// Err is why the stream ended; nil after Close.
func (s *EventStream) Err() error { return s.err }

// LastEventID is the id of the last event Next read (or the one given to start from):
// resume after it with StreamOptions.LastEventID.
func (s *EventStream) LastEventID() string { return s.lastID }

// Close ends the stream and its connection.
func (s *EventStream) Close() error {
	s.closed.Store(true)
	s.cancel()
	return nil
}

func (s *EventStream) finish(err error) {
	if s.closed.Load() {
		err = nil
	}
	s.err = err
	s.done = true
	s.drop()
	s.cancel()
}

// feed decodes a chunk into pending events; data that is not JSON ends the stream.
func (s *EventStream) feed(chunk []byte) {
	for _, m := range s.decoder.feed(chunk) {
		if !json.Valid([]byte(m.data)) {
			s.finish(&Error{
				Status: 200, Code: "server_error", Kind: ErrServer,
				Message: fmt.Sprintf("an event whose data is not JSON: %s %s", m.typ, clip([]byte(m.data))),
			})
			return
		}
		s.pending = append(s.pending, Event{ID: m.id, Type: m.typ, Data: json.RawMessage(m.data)})
	}
}

// drop closes the open response, if any.
func (s *EventStream) drop() {
	if s.body != nil {
		s.timer.Stop()
		s.body.Close()
		s.stop()
		s.body, s.stop, s.timer = nil, nil, nil
	}
}

func (s *EventStream) broken(last error) error {
	return &Error{
		Status: 503, Code: "unavailable", Kind: ErrUnavailable, Retryable: true, Cause: last,
		Message: fmt.Sprintf("the event stream of %s broke: %v", s.sessionID, last),
	}
}

// open returns the first bytes of a stream that answered (200 and its first bytes) at
// whichever node serves; with reconnect, in rounds over the addresses with backoff
// (never sooner than the server's retry:) until the client's timeout.
func (s *EventStream) open() ([]byte, error) {
	started := time.Now()
	for attempt := 1; ; attempt++ {
		first, answered, last, err := s.round()
		if answered {
			return first, err
		}
		if !s.reconnect {
			return nil, s.broken(last)
		}
		wait := backoff(attempt, retryInitial, streamRetryMax)
		if s.decoder.retry > wait {
			wait = s.decoder.retry
		}
		if time.Since(started)+wait >= s.c.timeout {
			return nil, s.broken(last)
		}
		if err := sleep(s.ctx, wait); err != nil {
			return nil, err
		}
	}
}

// round tries each address once, as Client.round: a 5xx, or a stream that ends before
// its first bytes, is no answer; a 4xx is err, as it is.
func (s *EventStream) round() (first []byte, answered bool, last, err error) {
	for range s.c.addresses {
		at := s.c.current.Load()
		base := s.c.address(at)
		first, status, payload, err := s.try(base)
		switch {
		case s.ctx.Err() != nil:
			return nil, true, nil, s.ctx.Err()
		case err != nil:
			last = err
		case first != nil:
			return first, true, nil, nil
		case status == http.StatusOK:
			last = fmt.Errorf("%s ended the event stream before it began", base)
		case status < 500:
			return nil, true, nil, errorOf(status, payload)
		case status == http.StatusServiceUnavailable:
			last = notServing(base, payload)
		default:
			last = fmt.Errorf("%s answered %d: %s", base, status, clip(payload))
		}
		if !isStorage(last) {
			s.c.next(at)
		}
	}
	return nil, false, last, nil
}

// try opens the stream at one node: its first bytes, with the response kept open; or
// the status and body of an answer that is not a stream.
func (s *EventStream) try(base string) ([]byte, int, []byte, error) {
	ctx, stop := context.WithCancel(s.ctx)
	silent := &atomic.Bool{}
	timer := time.AfterFunc(silence, func() { silent.Store(true); stop() })
	kept := false
	defer func() {
		if !kept {
			timer.Stop()
			stop()
		}
	}()
	req, err := http.NewRequestWithContext(ctx, "GET", base+s.path, nil)
	if err != nil {
		return nil, 0, nil, err
	}
	req.Header.Set("Accept", "text/event-stream")
	if id := s.decoder.lastEventID; id != "" {
		req.Header.Set("Last-Event-ID", id)
	}
	s.c.authorize(req)
	resp, err := s.c.http.Do(req)
	if err != nil {
		return nil, 0, nil, quiet(err, silent)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		payload, err := io.ReadAll(resp.Body)
		if err != nil {
			return nil, 0, nil, quiet(err, silent)
		}
		return nil, resp.StatusCode, payload, nil
	}
	for {
		n, err := resp.Body.Read(s.buf)
		if n > 0 {
			first := append([]byte(nil), s.buf[:n]...)
			timer.Reset(silence)
			kept = true
			s.body, s.stop, s.timer, s.silent = resp.Body, stop, timer, silent
			return first, 0, nil, nil
		}
		if err == io.EOF {
			resp.Body.Close()
			return nil, http.StatusOK, nil, nil
		}
		if err != nil {
			resp.Body.Close()
			return nil, 0, nil, quiet(err, silent)
		}
	}
}

// quiet names the silence that cut a connection.
func quiet(err error, silent *atomic.Bool) error {
	if silent.Load() {
		return fmt.Errorf("nothing came for %s: %w", silence, err)
	}
	return err
}
