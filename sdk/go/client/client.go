// Package client is the Go Client of Dex: it creates sessions, sends messages, waits for
// turns, reads snapshots, streams events, approves, denies or answers tool calls, and
// sets sessions' budgets, model groups' limits and tenants' budgets over the HTTP API
// (docs/api.md), with the Python Client's semantics (dex.Client): several addresses
// tried in turn, reads, sends with a message id and budget changes tried again until
// the timeout, typed errors. It needs nothing beyond Go's standard library.
//
//	c, err := client.New(client.Options{Addresses: []string{"http://127.0.0.1:7450"}})
//	s, err := c.CreateSession(ctx, "concierge", "")
//	t, err := c.SendMessage(ctx, s.ID, "Weather in Paris?", client.SendOptions{Wait: true})
//
// docs/go-client.md has the whole API.
package client

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

const (
	// DefaultAddress is dex server's own address, used when no address is given and
	// DEX_ADDRESS is not set.
	DefaultAddress = "http://127.0.0.1:7450"
	// DefaultTimeout bounds a call, its tries on every address included.
	DefaultTimeout = 30 * time.Second

	// longPoll is the longest a request that waits for a turn waits on the server before
	// it asks again: a node that hung holds a client no longer than this plus the slack
	// before it moves on to the next address.
	longPoll      = 2 * time.Second
	longPollSlack = 2 * time.Second
	// retryInitial and retryMax bound the backoff between rounds over the addresses:
	// full jitter, up to 0.05 s doubling to 1 s; streamRetryMax the same for opening an
	// event stream again, up to 2 s.
	retryInitial   = 50 * time.Millisecond
	retryMax       = time.Second
	streamRetryMax = 2 * time.Second
	// keepAlive is how long an idle pooled connection is kept for the next request:
	// less than the server keeps it (5 s), so that no request is written on a connection
	// the server has closed (a POST, as an approval, is not sent again: it may have been
	// committed).
	keepAlive = 4 * time.Second
)

// silence is how long an event stream may be quiet before it is dead: the server sends
// a keep-alive comment after 15 s without an event. A variable for the tests.
var silence = 45 * time.Second

// Options configure a Client. The zero value talks to DEX_ADDRESS (else DefaultAddress)
// with DEX_CLIENT_TOKEN, if set.
type Options struct {
	// Addresses are the server's nodes (http:// or https:// URLs), tried in turn: the
	// next one on a connection error or a 503. Each entry may hold several,
	// comma-separated. Default: DEX_ADDRESS (comma-separated), else DefaultAddress.
	Addresses []string
	// Timeout bounds each call, its tries over the addresses included, and the
	// reconnection of an event stream (default DefaultTimeout). SendMessage and WaitTurn
	// take their own.
	Timeout time.Duration
	// Token is the client token, sent as Authorization: Bearer, when the server has auth
	// on (default: DEX_CLIENT_TOKEN).
	Token string
	// TLSConfig verifies an https:// node (default: the system's CAs, or the file
	// SSL_CERT_FILE names).
	TLSConfig *tls.Config
	// Connections bounds the connections to each node (default 100).
	Connections int
	// Transport, if set, sends the requests instead of the client's own (TLSConfig and
	// Connections are then its business). Keep its idle connections less than 5 s
	// (the server's keep-alive): see docs/api.md.
	Transport http.RoundTripper
}

// Client talks to a Dex Server over HTTP. It is safe for concurrent use.
type Client struct {
	addresses []string
	timeout   time.Duration
	token     string
	http      *http.Client
	current   atomic.Int64 // the address that answered last
}

// New makes a Client; it connects on its first call.
func New(opts Options) (*Client, error) {
	addresses, err := parseAddresses(opts.Addresses)
	if err != nil {
		return nil, err
	}
	c := &Client{addresses: addresses, timeout: opts.Timeout, token: opts.Token}
	if c.timeout <= 0 {
		c.timeout = DefaultTimeout
	}
	if c.token == "" {
		c.token = os.Getenv("DEX_CLIENT_TOKEN")
	}
	transport := opts.Transport
	if transport == nil {
		connections := opts.Connections
		if connections <= 0 {
			connections = 100
		}
		dialer := &net.Dialer{Timeout: c.timeout, KeepAlive: 30 * time.Second}
		transport = &http.Transport{
			DialContext:           dialer.DialContext,
			TLSClientConfig:       opts.TLSConfig,
			ForceAttemptHTTP2:     true,
			MaxIdleConns:          connections,
			MaxIdleConnsPerHost:   connections,
			MaxConnsPerHost:       connections,
			IdleConnTimeout:       keepAlive,
			TLSHandshakeTimeout:   10 * time.Second,
			ExpectContinueTimeout: time.Second,
		}
	}
	c.http = &http.Client{Transport: transport}
	return c, nil
}

// Addresses are the nodes the client tries, in order.
func (c *Client) Addresses() []string {
	return append([]string(nil), c.addresses...)
}

// Close closes the idle connections. A Client needs no Close to be collected.
func (c *Client) Close() {
	c.http.CloseIdleConnections()
}

func parseAddresses(given []string) ([]string, error) {
	if len(given) == 0 {
		if env := os.Getenv("DEX_ADDRESS"); env != "" {
			given = []string{env}
		} else {
			given = []string{DefaultAddress}
		}
	}
	var found []string
	for _, entry := range given {
		for _, part := range strings.Split(entry, ",") {
			a := strings.TrimRight(strings.TrimSpace(part), "/")
			if a == "" {
				continue
			}
			if !strings.HasPrefix(a, "http://") && !strings.HasPrefix(a, "https://") {
				return nil, fmt.Errorf("dex: a Dex Server address starts with http:// or https://, not %q", a)
			}
			found = append(found, a)
		}
	}
	if len(found) == 0 {
		return nil, fmt.Errorf("dex: no Dex Server address given")
	}
	return found, nil
}

// --- sessions ---------------------------------------------------------------------

// CreateOptions shape CreateSession; each is optional.
type CreateOptions struct {
	// Tenant is whose session it is, for good (1-64 letters, digits or _.-). With a
	// tenant-scoped token, its tenant by default; another one is ErrAuth.
	Tenant string
	// Priority puts its Steps ahead of those of its tenant's sessions of a lower one
	// (-1000 to 1000; default 0).
	Priority int
	// MaxTokens and MaxCostUSD are its budget, what it may use in all (0: that limit
	// does not apply; both 0: no budget). A turn whose next model call would start at
	// or over it waits until the budget is raised (SetBudget).
	MaxTokens  int
	MaxCostUSD float64
}

// CreateSession creates a session of agent, with the id sessionID ("": the server
// makes one), and at most one CreateOptions. The agent must have been registered by a
// Worker (else ErrNotFound); a taken id is ErrConflict.
func (c *Client) CreateSession(ctx context.Context, agent, sessionID string, opts ...CreateOptions) (*Session, error) {
	body := createSession{Agent: agent, SessionID: sessionID}
	switch len(opts) {
	case 0:
	case 1:
		body.Tenant, body.Priority = opts[0].Tenant, opts[0].Priority
		if opts[0].MaxTokens != 0 || opts[0].MaxCostUSD != 0 {
			body.Budget = budgetOf(opts[0].MaxTokens, opts[0].MaxCostUSD)
		}
	default:
		return nil, fmt.Errorf("dex: CreateSession takes one CreateOptions, not %d", len(opts))
	}
	var out Session
	err := c.do(ctx, request{method: "POST", path: "/v1/sessions", body: body}, &out)
	return result(&out, err)
}

// ForkSession makes a new session whose history is sessionID's before turn turn (its
// next message is its turn turn; one past the last turn copies the whole history), with
// the id newSessionID ("": the server makes one). The original does not change; a
// session in a turn is ErrConflict.
func (c *Client) ForkSession(ctx context.Context, sessionID string, turn int, newSessionID string) (*Forked, error) {
	var out Forked
	err := c.do(ctx, request{method: "POST", path: sessionPath(sessionID, "fork"), body: fork{turn, newSessionID}}, &out)
	return result(&out, err)
}

// ListSessionsOptions filter and page ListSessions; every filter is optional.
type ListSessionsOptions struct {
	Agent string
	// Tenant keeps to one tenant's sessions (a tenant-scoped token sees only its own).
	Tenant string
	// Status is SessionIdle, SessionRunning, SessionWaiting, SessionFailed or
	// OutcomeUnknown (a tool call's outcome is unknown and not reconciled).
	Status string
	// A time range is [since, before); a zero time is no bound.
	CreatedSince, CreatedBefore time.Time
	UpdatedSince, UpdatedBefore time.Time
	// Order is "created" (the default) or "updated": newest first by it.
	Order string
	// Limit is the page size, 1 to 1000 (default 100).
	Limit int
	// Cursor is the previous page's NextCursor.
	Cursor string
}

// ListSessions returns one page of sessions, newest first by opts.Order. Pass its
// NextCursor as opts.Cursor (with the same filters) for the next page, until it is
// empty.
func (c *Client) ListSessions(ctx context.Context, opts ListSessionsOptions) (*SessionList, error) {
	query := url.Values{}
	set := func(name, value string) {
		if value != "" {
			query.Set(name, value)
		}
	}
	set("agent", opts.Agent)
	set("tenant", opts.Tenant)
	set("status", opts.Status)
	set("created_since", unix(opts.CreatedSince))
	set("created_before", unix(opts.CreatedBefore))
	set("updated_since", unix(opts.UpdatedSince))
	set("updated_before", unix(opts.UpdatedBefore))
	set("order", orDefault(opts.Order, "created"))
	set("limit", strconv.Itoa(limitOrDefault(opts.Limit)))
	set("cursor", opts.Cursor)
	var out SessionList
	err := c.do(ctx, request{method: "GET", path: "/v1/sessions", query: query}, &out)
	return result(&out, err)
}

// InboxOptions page ListInbox.
type InboxOptions struct {
	// Tenant keeps to one tenant's sessions (a tenant-scoped token sees only its own).
	Tenant string
	// Limit is how many sessions' waits a page holds, 1 to 1000 (default 100).
	Limit int
	// Cursor is the previous page's NextCursor.
	Cursor string
}

// ListInbox returns what waits for a person across sessions, the latest first: each
// item names the session, the tool call, its Kind (KindApproval: approve or deny it;
// KindQuestion: answer it), the tool and its arguments, and the question and choices.
func (c *Client) ListInbox(ctx context.Context, opts InboxOptions) (*Inbox, error) {
	query := url.Values{"limit": {strconv.Itoa(limitOrDefault(opts.Limit))}}
	if opts.Cursor != "" {
		query.Set("cursor", opts.Cursor)
	}
	if opts.Tenant != "" {
		query.Set("tenant", opts.Tenant)
	}
	var out Inbox
	err := c.do(ctx, request{method: "GET", path: "/v1/inbox", query: query}, &out)
	return result(&out, err)
}

// SendOptions shape SendMessage.
type SendOptions struct {
	// MessageID is a client-chosen id: sending the same id again returns the first
	// send's turn (Created false) and changes nothing. With one, a send is tried again
	// on every address until the timeout; without, once on each.
	MessageID string
	// OnBusy is what the message does if a turn runs (docs/mid-turn.md): "enqueue"
	// (wait for it to end), "reject" (a *Error with Code "conflict" naming the turn),
	// "interrupt" (cancel it and start a turn with this message), "steer" (join it).
	// Empty: the agent's policy.
	OnBusy string
	// Wait: return once the turn has ended, or as soon as it waits for a person
	// (TurnWaiting, with WaitingFor), or when Timeout passed (TurnRunning).
	Wait bool
	// Timeout bounds the call (default: the client's).
	Timeout time.Duration
}

// SendMessage sends a user message to sessionID. Its turn starts now if the session
// is idle; else opts.OnBusy decides. The answer's Outcome says what it did.
func (c *Client) SendMessage(ctx context.Context, sessionID, text string, opts SendOptions) (*SentMessage, error) {
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = c.timeout
	}
	deadline := time.Now().Add(timeout)
	body := sendMessage{Text: text, MessageID: opts.MessageID, OnBusy: opts.OnBusy}
	perTry := longPollSlack
	if opts.Wait {
		chunk := minDuration(timeout, longPoll)
		seconds := chunk.Seconds()
		body.WaitSeconds = &seconds
		perTry += chunk
	}
	var sent SentMessage
	err := c.do(ctx, request{
		method: "POST", path: sessionPath(sessionID, "messages"), body: body,
		within: timeout + longPollSlack, perTry: perTry,
		safe: opts.MessageID != "", // the same id again returns the first send's turn
	}, &sent)
	if err != nil {
		return nil, err
	}
	if opts.Wait && sent.Status == TurnRunning {
		// The server holds a request only so long: wait out the rest of the timeout.
		remaining := time.Until(deadline)
		if remaining < 0 {
			remaining = 0
		}
		ended, err := c.waitTurn(ctx, sessionID, sent.Turn, remaining)
		if err != nil {
			return nil, err
		}
		return &SentMessage{
			TurnResult: *ended, Created: sent.Created,
			Outcome: sent.Outcome, Interrupted: sent.Interrupted,
		}, nil
	}
	return &sent, nil
}

// WaitTurn returns turn turn of sessionID once it has ended or waits for a person
// (TurnWaiting, with WaitingFor); if timeout (0: the client's) passes first, its current
// record (TurnRunning). It asks the server again every 2 s, so a node that hung holds
// it no longer than that before it moves on to the next address.
func (c *Client) WaitTurn(ctx context.Context, sessionID string, turn int, timeout time.Duration) (*TurnResult, error) {
	if timeout <= 0 {
		timeout = c.timeout
	}
	return c.waitTurn(ctx, sessionID, turn, timeout)
}

func (c *Client) waitTurn(ctx context.Context, sessionID string, turn int, timeout time.Duration) (*TurnResult, error) {
	deadline := time.Now().Add(timeout)
	path := sessionPath(sessionID, "turns", strconv.Itoa(turn))
	for {
		remaining := time.Until(deadline)
		if remaining < 0 {
			remaining = 0
		}
		chunk := minDuration(remaining, longPoll)
		var out TurnResult
		err := c.do(ctx, request{
			method: "GET", path: path,
			query:  url.Values{"wait_seconds": {strconv.FormatFloat(chunk.Seconds(), 'f', -1, 64)}},
			within: remaining + longPollSlack, perTry: chunk + longPollSlack,
		}, &out)
		if err != nil {
			return nil, err
		}
		if out.Status != TurnRunning || !time.Now().Before(deadline) {
			return &out, nil
		}
	}
}

// AgentSnapshot returns the session's snapshot: history, state, the current turn with
// its Steps and attempts, its waits, and its tool calls.
func (c *Client) AgentSnapshot(ctx context.Context, sessionID string) (*Snapshot, error) {
	var out Snapshot
	err := c.do(ctx, request{method: "GET", path: sessionPath(sessionID)}, &out)
	return result(&out, err)
}

// ListAgents returns the agents Workers have registered.
func (c *Client) ListAgents(ctx context.Context) ([]Agent, error) {
	var out agentList
	err := c.do(ctx, request{method: "GET", path: "/v1/agents"}, &out)
	return out.Agents, err
}

// ListWorkers returns the Workers connected to the server: their agents and tools,
// capacity, and the attempts they run; in a cluster, those of every node that
// answered, each with the Node it is connected to.
func (c *Client) ListWorkers(ctx context.Context) ([]Worker, error) {
	var out workerList
	err := c.do(ctx, request{method: "GET", path: "/v1/workers"}, &out)
	return out.Workers, err
}

// Cluster returns the nodes of the cluster (each one's NodeID, Address, Standby and the
// Partitions it owns now) and the NodeID of the node that answered; no members on a
// node alone.
func (c *Client) Cluster(ctx context.Context) (*ClusterView, error) {
	var out ClusterView
	err := c.do(ctx, request{method: "GET", path: "/v1/cluster"}, &out)
	return result(&out, err)
}

// --- waits, cancel, reconcile ---------------------------------------------------------

// ListApprovals returns the session's tool calls that wait for approval.
func (c *Client) ListApprovals(ctx context.Context, sessionID string) ([]PendingApproval, error) {
	var out approvalList
	err := c.do(ctx, request{method: "GET", path: sessionPath(sessionID, "approvals")}, &out)
	return out.Approvals, err
}

// ApproveOptions shape Approve; both are optional.
type ApproveOptions struct {
	// By names who approves.
	By string
	// ArgumentsHash is the hash of the arguments the approver saw: an approval of other
	// arguments is refused (ErrConflict).
	ArgumentsHash string
}

// Approve approves a tool call that waits for approval: it runs once. Not tried again
// on another address: it may have been committed.
func (c *Client) Approve(ctx context.Context, sessionID, callID string, opts ApproveOptions) (*Approved, error) {
	var out Approved
	err := c.onCall(ctx, sessionID, callID, "approve", approve(opts), &out)
	return result(&out, err)
}

// Deny denies a tool call that waits for approval: it records denied, and the model
// sees the reason. by ("": none) names who denies.
func (c *Client) Deny(ctx context.Context, sessionID, callID, reason, by string) (*Approved, error) {
	var out Approved
	err := c.onCall(ctx, sessionID, callID, "deny", deny{reason, by}, &out)
	return result(&out, err)
}

// Answer answers the question a tool asked: the tool runs again with it. An answer
// outside the question's choices is ErrConflict. by ("": none) names who answers.
func (c *Client) Answer(ctx context.Context, sessionID, callID, answerText, by string) (*Answered, error) {
	var out Answered
	err := c.onCall(ctx, sessionID, callID, "answer", answer{answerText, by}, &out)
	return result(&out, err)
}

// CancelTurn cancels the running turn (ErrConflict if none): queued Steps fail as not
// started, running ones stop. reason "" is "cancelled by a client".
func (c *Client) CancelTurn(ctx context.Context, sessionID, reason string) (*Cancelled, error) {
	var out Cancelled
	err := c.do(ctx, request{method: "POST", path: sessionPath(sessionID, "cancel"),
		body: cancel{orDefault(reason, "cancelled by a client")}}, &out)
	return result(&out, err)
}

// Reconciliation is what really happened to an outcome_unknown call.
type Reconciliation struct {
	// Status is CallSucceeded (with Result) or CallFailed (with Error).
	Status string
	Result any
	Error  string
	// By names who reconciles.
	By string
}

// Reconcile records what really happened to an outcome_unknown call; the model sees it
// in the history. It returns the call.
func (c *Client) Reconcile(ctx context.Context, sessionID, callID string, r Reconciliation) (*ToolCall, error) {
	var out ToolCall
	err := c.onCall(ctx, sessionID, callID, "reconcile", reconcile(r), &out)
	return result(&out, err)
}

// onCall POSTs action (approve, deny, answer, reconcile) on one tool call.
func (c *Client) onCall(ctx context.Context, sessionID, callID, action string, body, out any) error {
	return c.do(ctx, request{method: "POST", path: sessionPath(sessionID, "tool_calls", callID, action), body: body}, out)
}

// --- helpers ------------------------------------------------------------------------

func sessionPath(sessionID string, more ...string) string {
	parts := []string{"/v1/sessions", url.PathEscape(sessionID)}
	for _, p := range more {
		parts = append(parts, url.PathEscape(p))
	}
	return strings.Join(parts, "/")
}

func result[T any](out *T, err error) (*T, error) {
	if err != nil {
		return nil, err
	}
	return out, nil
}

func unix(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return strconv.FormatFloat(float64(t.Unix())+float64(t.Nanosecond())/1e9, 'f', -1, 64)
}

func orDefault(value, fallback string) string {
	if value == "" {
		return fallback
	}
	return value
}

func limitOrDefault(limit int) int {
	if limit <= 0 {
		return 100
	}
	return limit
}

func minDuration(a, b time.Duration) time.Duration {
	if a < b {
		return a
	}
	return b
}
