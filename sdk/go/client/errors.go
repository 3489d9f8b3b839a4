package client

import (
	"encoding/json"
	"errors"
	"fmt"
)

// The kinds of Error, for errors.Is: the Python Client's exception classes.
var (
	// ErrAuth: no valid token (401), or one of the wrong role (403).
	ErrAuth = errors.New("dex: not authorized")
	// ErrNotFound: an unknown session, agent, turn or tool call (404).
	ErrNotFound = errors.New("dex: not found")
	// ErrConflict: the state refuses the change (409).
	ErrConflict = errors.New("dex: conflict")
	// ErrInvalidInput: the request does not match the schema, or is unusable (422).
	ErrInvalidInput = errors.New("dex: invalid input")
	// ErrStorage: the node serves, but its store could not commit (503 storage_error):
	// nothing was written.
	ErrStorage = errors.New("dex: storage error")
	// ErrUnavailable: no node answered (a connection error, a timeout, a 503 from a
	// standby or a node starting, on every address until the client gave up), or an event
	// stream broke. errors.Is(err, ErrServer) holds for it too.
	ErrUnavailable = errors.New("dex: unavailable")
	// ErrServer: any other error answer (500, 429, ...), or an answer that is not the
	// API's.
	ErrServer = errors.New("dex: server error")
)

// Error is an error the client returns for an error answer, or when no node answered.
// errors.Is(err, ErrNotFound) (and the other kinds) tells them apart; errors.As gives
// the status and the error body.
type Error struct {
	// Status is the HTTP status: the answer's, or 503 when no node answered.
	Status int
	// Code is the error body's code (not_found, conflict, invalid_request, ...), or the
	// kind's own when the body had none (unavailable when no node answered).
	Code string
	// Message is the error body's message, for a person.
	Message string
	// Details is the error body's details (for a 422 invalid_request, "problems").
	Details map[string]any
	// Retryable: the request may succeed if sent again (no node answered; a storage
	// error, where nothing was written).
	Retryable bool
	// Kind is one of ErrAuth, ErrNotFound, ErrConflict, ErrInvalidInput, ErrStorage,
	// ErrUnavailable and ErrServer.
	Kind error
	// Cause is the last error of the tries, when no node answered.
	Cause error
}

func (e *Error) Error() string {
	return fmt.Sprintf("dex: %d %s: %s", e.Status, e.Code, e.Message)
}

// Is makes errors.Is(err, ErrNotFound) (the kinds) hold.
func (e *Error) Is(target error) bool {
	return target == e.Kind || (e.Kind == ErrUnavailable && target == ErrServer)
}

// Unwrap gives the cause (a network error, a timeout), if any.
func (e *Error) Unwrap() error { return e.Cause }

var kinds = map[int]error{
	401: ErrAuth,
	403: ErrAuth,
	404: ErrNotFound,
	409: ErrConflict,
	422: ErrInvalidInput,
}

var defaultCodes = map[error]string{
	ErrAuth:         "unauthorized",
	ErrNotFound:     "not_found",
	ErrConflict:     "conflict",
	ErrInvalidInput: "invalid_input",
	ErrStorage:      "storage_error",
	ErrUnavailable:  "unavailable",
	ErrServer:       "server_error",
}

// errorOf is the Error of an error answer: its kind by the status, its code, message
// and details from the body.
func errorOf(status int, payload []byte) *Error {
	kind, ok := kinds[status]
	if !ok {
		kind = ErrServer
	}
	e := &Error{Status: status, Kind: kind, Code: defaultCodes[kind]}
	var body errorResponse
	if json.Unmarshal(payload, &body) == nil && body.Error.Message != "" {
		e.Message, e.Details = body.Error.Message, body.Error.Details
		if body.Error.Code != "" {
			e.Code = body.Error.Code
		}
	} else if len(payload) > 0 {
		e.Message = fmt.Sprintf("HTTP %d: %s", status, clip(payload))
	} else {
		e.Message = fmt.Sprintf("HTTP %d", status)
	}
	return e
}

// notServing is the Error of a 503: the node does not serve (a standby, starting), or it
// serves but its store could not commit (storage_error: nothing was written).
func notServing(base string, payload []byte) *Error {
	var body errorResponse
	if json.Unmarshal(payload, &body) == nil && body.Error.Code == "storage_error" {
		return &Error{
			Status: 503, Code: "storage_error", Message: body.Error.Message,
			Details: body.Error.Details, Retryable: true, Kind: ErrStorage,
		}
	}
	return &Error{
		Status: 503, Code: "unavailable", Kind: ErrUnavailable, Retryable: true,
		Message: fmt.Sprintf("%s is not serving: %s", base, clip(payload)),
	}
}

func isStorage(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Kind == ErrStorage
}

// clip is the start of a body, for a message.
func clip(payload []byte) string {
	if len(payload) > 200 {
		return fmt.Sprintf("%q...", payload[:200])
	}
	return fmt.Sprintf("%q", payload)
}
