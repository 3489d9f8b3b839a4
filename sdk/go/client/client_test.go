package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// node is a fake Dex node: it answers each request with handle, and keeps what came.
type node struct {
	*httptest.Server
	mu       sync.Mutex
	requests []seen
	handle   func(w http.ResponseWriter, r *http.Request, n int)
}

type seen struct {
	method, path, query, body string
	header                    http.Header
}

func newNode(t *testing.T, handle func(w http.ResponseWriter, r *http.Request, n int)) *node {
	t.Helper()
	n := &node{handle: handle}
	n.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		n.mu.Lock()
		n.requests = append(n.requests, seen{r.Method, r.URL.EscapedPath(), r.URL.RawQuery, string(body), r.Header.Clone()})
		count := len(n.requests)
		n.mu.Unlock()
		n.handle(w, r, count)
	}))
	t.Cleanup(n.Close)
	return n
}

func (n *node) seen() []seen {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]seen(nil), n.requests...)
}

func answerJSON(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	io.WriteString(w, body)
}

func refuse(status int, code string) func(http.ResponseWriter, *http.Request, int) {
	return func(w http.ResponseWriter, _ *http.Request, _ int) {
		answerJSON(w, status, fmt.Sprintf(`{"error": {"code": %q, "message": "crafted %d", "details": {"cause": "disk full"}}}`, code, status))
	}
}

func answering(body string) func(http.ResponseWriter, *http.Request, int) {
	return func(w http.ResponseWriter, _ *http.Request, _ int) { answerJSON(w, 200, body) }
}

// cutMidBody answers with a Content-Length it never fills, then closes the connection:
// a node killed while it sends the body.
func cutMidBody(w http.ResponseWriter) {
	conn, buf, err := w.(http.Hijacker).Hijack()
	if err != nil {
		panic(err)
	}
	buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 19395\r\n\r\n{\"ses")
	buf.Flush()
	conn.Close()
}

// deadAddress is an address nothing listens at.
func deadAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	address := "http://" + l.Addr().String()
	l.Close()
	return address
}

func newTestClient(t *testing.T, addresses ...string) *Client {
	t.Helper()
	return newTestClientWith(t, Options{Addresses: addresses, Timeout: 5 * time.Second})
}

func newTestClientWith(t *testing.T, opts Options) *Client {
	t.Helper()
	c, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func wantKind(t *testing.T, err error, kind error) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, kind) {
		t.Fatalf("want an Error of kind %v, got %#v", kind, err)
	}
	return e
}

const snapshot = `{"session": {"id": "s1", "agent": "a", "status": "idle"}, "current_turn": null,
	"waiting": [], "waits": [], "approvals": [], "running": [], "history": [], "tool_calls": []}`

// --- addresses ----------------------------------------------------------------------

func TestAddressesComeAsAListOrCommaSeparated(t *testing.T) {
	for _, tc := range []struct {
		given []string
		env   string
		want  string
	}{
		{[]string{"http://a:1/", " https://b:2 "}, "", "http://a:1 https://b:2"},
		{[]string{"http://a:1,http://b:2", "http://c:3"}, "", "http://a:1 http://b:2 http://c:3"},
		{nil, "http://e:1, http://f:2", "http://e:1 http://f:2"},
		{nil, "", DefaultAddress},
	} {
		t.Setenv("DEX_ADDRESS", tc.env)
		c := newTestClientWith(t, Options{Addresses: tc.given})
		if got := strings.Join(c.Addresses(), " "); got != tc.want {
			t.Errorf("%v (DEX_ADDRESS %q): got %q, want %q", tc.given, tc.env, got, tc.want)
		}
	}
	if _, err := New(Options{Addresses: []string{"127.0.0.1:7450"}}); err == nil || !strings.Contains(err.Error(), "starts with http://") {
		t.Errorf("an address without a scheme: %v", err)
	}
	if _, err := New(Options{Addresses: []string{" , "}}); err == nil {
		t.Error("no address at all is an error")
	}
}

func TestADeadAddressIsPassedOverAndTheNextCallStartsWhereOneAnswered(t *testing.T) {
	good := newNode(t, answering(snapshot))
	c := newTestClient(t, deadAddress(t), good.URL)
	for i := 0; i < 2; i++ {
		s, err := c.AgentSnapshot(context.Background(), "s1")
		if err != nil {
			t.Fatal(err)
		}
		if s.Session.ID != "s1" || s.CurrentTurn != nil {
			t.Fatalf("decoded %+v", s)
		}
	}
	if got := len(good.seen()); got != 2 {
		t.Fatalf("the node that answered got %d requests, want 2", got)
	}
	if c.address(c.current.Load()) != good.URL {
		t.Fatal("the client does not start at the node that answered")
	}
}

func TestAStandbyIsPassedOverForAnyRequest(t *testing.T) {
	standby := newNode(t, refuse(503, "unavailable"))
	active := newNode(t, answering(`{"call_id": "c1", "approved": true}`))
	c := newTestClient(t, standby.URL, active.URL)
	got, err := c.Approve(context.Background(), "s1", "c1", ApproveOptions{By: "ann", ArgumentsHash: "h"})
	if err != nil {
		t.Fatal(err)
	}
	if !got.Approved || got.CallID != "c1" {
		t.Fatalf("decoded %+v", got)
	}
	if len(standby.seen()) != 1 || len(active.seen()) != 1 {
		t.Fatalf("standby %d, active %d requests: want one each", len(standby.seen()), len(active.seen()))
	}
	r := active.seen()[0]
	if r.method != "POST" || r.path != "/v1/sessions/s1/tool_calls/c1/approve" || r.body != `{"by":"ann","arguments_hash":"h"}` {
		t.Fatalf("sent %+v", r)
	}
	if r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("the body's type: %q", r.header.Get("Content-Type"))
	}
}

// --- what is tried again --------------------------------------------------------------

func TestAReadIsTriedAgainInRoundsUntilANodeServes(t *testing.T) {
	n := newNode(t, func(w http.ResponseWriter, r *http.Request, count int) {
		if count <= 3 {
			refuse(503, "unavailable")(w, r, count)
			return
		}
		answerJSON(w, 200, `{"agents": [{"name": "a", "workers": 1}]}`)
	})
	c := newTestClient(t, n.URL)
	agents, err := c.ListAgents(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(agents) != 1 || agents[0].Name != "a" || agents[0].Workers != 1 {
		t.Fatalf("decoded %+v", agents)
	}
	if len(n.seen()) != 4 {
		t.Fatalf("%d requests, want 4", len(n.seen()))
	}
}

func TestAReadCutMidBodyIsTriedAgain(t *testing.T) {
	n := newNode(t, func(w http.ResponseWriter, r *http.Request, count int) {
		if count == 1 {
			cutMidBody(w)
			return
		}
		answerJSON(w, 200, snapshot)
	})
	c := newTestClient(t, n.URL)
	if _, err := c.AgentSnapshot(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
	if len(n.seen()) != 2 {
		t.Fatalf("%d requests, want 2", len(n.seen()))
	}
}

func TestAnUnsafeRequestIsSentOnceToEachAddress(t *testing.T) {
	cut := func(w http.ResponseWriter, _ *http.Request, _ int) { cutMidBody(w) }
	a, b := newNode(t, cut), newNode(t, refuse(503, "unavailable"))
	c := newTestClient(t, a.URL, b.URL)
	ctx := context.Background()
	calls := map[string]func() error{
		"approve":     func() error { _, err := c.Approve(ctx, "s1", "c1", ApproveOptions{}); return err },
		"deny":        func() error { _, err := c.Deny(ctx, "s1", "c1", "no", ""); return err },
		"answer":      func() error { _, err := c.Answer(ctx, "s1", "c1", "M", ""); return err },
		"reconcile":   func() error { _, err := c.Reconcile(ctx, "s1", "c1", Reconciliation{Status: CallFailed}); return err },
		"cancel":      func() error { _, err := c.CancelTurn(ctx, "s1", ""); return err },
		"create":      func() error { _, err := c.CreateSession(ctx, "a", ""); return err },
		"fork":        func() error { _, err := c.ForkSession(ctx, "s1", 1, ""); return err },
		"send":        func() error { _, err := c.SendMessage(ctx, "s1", "hi", SendOptions{}); return err },
		"set limit":   func() error { _, err := c.SetLimit(ctx, "openai/gpt-4o", LimitOptions{RPM: 60}); return err },
		"clear limit": func() error { _, err := c.ClearLimit(ctx, "openai/gpt-4o"); return err },
	}
	for name, call := range calls {
		before := len(a.seen()) + len(b.seen())
		e := wantKind(t, call(), ErrUnavailable)
		if !e.Retryable || e.Status != 503 || !strings.Contains(e.Message, "no Dex Server answered at ") {
			t.Errorf("%s: %+v", name, e)
		}
		if !errors.Is(e, ErrServer) {
			t.Errorf("%s: ErrUnavailable is an ErrServer too", name)
		}
		if sent := len(a.seen()) + len(b.seen()) - before; sent != 2 {
			t.Errorf("%s: sent %d times, want once to each address", name, sent)
		}
	}
}

func TestASendWithAMessageIDIsTriedAgain(t *testing.T) {
	n := newNode(t, func(w http.ResponseWriter, r *http.Request, count int) {
		if count == 1 {
			cutMidBody(w)
			return
		}
		answerJSON(w, 200, `{"session_id": "s1", "turn": 2, "status": "running", "created": false}`)
	})
	c := newTestClient(t, n.URL)
	sent, err := c.SendMessage(context.Background(), "s1", "hi", SendOptions{MessageID: "m1"})
	if err != nil {
		t.Fatal(err)
	}
	if sent.Turn != 2 || sent.Created || sent.Status != TurnRunning {
		t.Fatalf("decoded %+v", sent)
	}
	requests := n.seen()
	if len(requests) != 2 || requests[0].body != requests[1].body || requests[1].body != `{"text":"hi","message_id":"m1"}` {
		t.Fatalf("sent %+v", requests)
	}
}

func TestASendSaysWhatItDoesIfATurnRuns(t *testing.T) {
	n := newNode(t, func(w http.ResponseWriter, r *http.Request, count int) {
		answerJSON(w, 201, `{"session_id": "s1", "turn": 3, "status": "running", "created": true,
			"outcome": "interrupted", "interrupted": 2}`)
	})
	c := newTestClient(t, n.URL)
	sent, err := c.SendMessage(context.Background(), "s1", "stop", SendOptions{OnBusy: "interrupt"})
	if err != nil {
		t.Fatal(err)
	}
	if sent.Turn != 3 || sent.Outcome != "interrupted" || sent.Interrupted == nil || *sent.Interrupted != 2 {
		t.Fatalf("decoded %+v", sent)
	}
	if requests := n.seen(); requests[0].body != `{"text":"stop","on_busy":"interrupt"}` {
		t.Fatalf("sent %+v", requests)
	}
}

func TestABudgetsChangeIsTriedAgain(t *testing.T) {
	n := newNode(t, func(w http.ResponseWriter, r *http.Request, count int) {
		if count%2 == 1 {
			cutMidBody(w)
			return
		}
		answerJSON(w, 200, `{"session_id": "s1", "budget": null, "status": "idle",
			"usage": {"input_tokens": 7, "output_tokens": 3, "cost_usd": 0.5}}`)
	})
	c := newTestClient(t, n.URL)
	ctx := context.Background()
	if _, err := c.SetBudget(ctx, "s1", BudgetOptions{MaxTokens: 100}); err != nil {
		t.Fatal(err)
	}
	removed, err := c.RemoveBudget(ctx, "s1", "")
	if err != nil {
		t.Fatal(err)
	}
	if removed.Budget != nil || removed.Usage != (SessionUsage{InputTokens: 7, OutputTokens: 3, CostUSD: 0.5}) {
		t.Fatalf("decoded %+v", removed)
	}
	var methods []string
	for _, r := range n.seen() {
		methods = append(methods, r.method)
	}
	if strings.Join(methods, " ") != "PUT PUT DELETE DELETE" {
		t.Fatalf("sent %v: want each change twice, once cut and once answered", methods)
	}
}

func TestATenantBudgetsChangeIsTriedAgain(t *testing.T) {
	n := newNode(t, func(w http.ResponseWriter, r *http.Request, count int) {
		if count%2 == 1 {
			cutMidBody(w)
			return
		}
		answerJSON(w, 200, `{"tenant": "acme", "budget": {"max_tokens_per_day": 1000, "max_cost_usd_per_day": null,
			"max_tokens_per_month": null, "max_cost_usd_per_month": 50}, "day": "2026-12-08",
			"today": {"input_tokens": 7, "output_tokens": 3, "tokens": 10, "cost_usd": 0.5, "calls": 1},
			"this_month": {"input_tokens": 70, "output_tokens": 30, "tokens": 100, "cost_usd": 5, "calls": 9},
			"reached": null}`)
	})
	c := newTestClient(t, n.URL)
	ctx := context.Background()
	set, err := c.SetTenantBudget(ctx, "acme", TenantBudgetOptions{MaxTokensPerDay: 1000, MaxCostUSDPerMonth: 50})
	if err != nil {
		t.Fatal(err)
	}
	if set.Budget == nil || *set.Budget.MaxTokensPerDay != 1000 || set.Budget.MaxCostUSDPerDay != nil ||
		*set.Budget.MaxCostUSDPerMonth != 50 || set.Reached != "" || set.Day != "2026-12-08" ||
		set.Today != (TenantUsage{InputTokens: 7, OutputTokens: 3, Tokens: 10, CostUSD: 0.5, Calls: 1}) ||
		set.ThisMonth.Calls != 9 {
		t.Fatalf("decoded %+v", set)
	}
	if _, err := c.RemoveTenantBudget(ctx, "acme", "ops"); err != nil {
		t.Fatal(err)
	}
	var methods []string
	for _, r := range n.seen() {
		methods = append(methods, r.method)
	}
	if strings.Join(methods, " ") != "PUT PUT DELETE DELETE" {
		t.Fatalf("sent %v: want each change twice, once cut and once answered", methods)
	}
}

func TestAStorageErrorIsReturnedAsItIsAndTheNodeIsNotLeft(t *testing.T) {
	full := newNode(t, refuse(503, "storage_error"))
	other := newNode(t, answering(snapshot))
	c := newTestClientWith(t, Options{Addresses: []string{full.URL, other.URL}, Timeout: 300 * time.Millisecond})
	_, err := c.CreateSession(context.Background(), "a", "s1")
	e := wantKind(t, err, ErrStorage)
	if e.Code != "storage_error" || !e.Retryable || e.Details["cause"] != "disk full" || e.Message != "crafted 503" {
		t.Fatalf("%+v", e)
	}
	if _, err := c.AgentSnapshot(context.Background(), "s1"); !errors.Is(err, ErrStorage) {
		t.Fatalf("a read tried until the timeout: %v", err)
	}
	if len(other.seen()) != 0 {
		t.Fatal("a node that serves but cannot commit is not left for another")
	}
	if len(full.seen()) < 4 {
		t.Fatalf("%d requests: a read is tried again", len(full.seen()))
	}
}

func TestAReadGivesUpAtTheTimeout(t *testing.T) {
	c := newTestClientWith(t, Options{Addresses: []string{deadAddress(t)}, Timeout: 300 * time.Millisecond})
	started := time.Now()
	_, err := c.ListWorkers(context.Background())
	e := wantKind(t, err, ErrUnavailable)
	if took := time.Since(started); took > 2*time.Second {
		t.Fatalf("gave up after %s", took)
	}
	var opErr *net.OpError
	if !errors.As(e, &opErr) {
		t.Fatalf("the cause is the connection error: %#v", e.Cause)
	}
}

func TestACancelledContextEndsACallAtOnce(t *testing.T) {
	release := make(chan struct{})
	n := newNode(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	c := newTestClient(t, n.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := c.AgentSnapshot(ctx, "s1")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want the context's error, got %v", err)
	}
	if len(n.seen()) != 1 {
		t.Fatal("not tried again once the caller's context ended")
	}
}

// --- errors -------------------------------------------------------------------------

func TestErrorAnswersMapToKindsAndAreNotTriedAgain(t *testing.T) {
	for _, tc := range []struct {
		status int
		code   string
		kind   error
	}{
		{401, "unauthorized", ErrAuth},
		{403, "forbidden", ErrAuth},
		{404, "not_found", ErrNotFound},
		{409, "conflict", ErrConflict},
		{422, "invalid_request", ErrInvalidInput},
		{429, "rate_limited", ErrServer},
		{500, "internal_error", ErrServer},
	} {
		refusing := newNode(t, refuse(tc.status, tc.code))
		other := newNode(t, answering(snapshot))
		c := newTestClient(t, refusing.URL, other.URL)
		_, err := c.AgentSnapshot(context.Background(), "s1")
		e := wantKind(t, err, tc.kind)
		if e.Status != tc.status || e.Code != tc.code || e.Message != fmt.Sprintf("crafted %d", tc.status) || e.Retryable {
			t.Errorf("%d: %+v", tc.status, e)
		}
		if e.Details["cause"] != "disk full" {
			t.Errorf("%d: the details: %v", tc.status, e.Details)
		}
		if want := fmt.Sprintf("dex: %d %s: crafted %d", tc.status, tc.code, tc.status); e.Error() != want {
			t.Errorf("%q, want %q", e.Error(), want)
		}
		if len(refusing.seen()) != 1 || len(other.seen()) != 0 {
			t.Errorf("%d: an error answer is the answer: not tried again, nor elsewhere", tc.status)
		}
	}
}

func TestAnAnswerThatIsNotTheAPIsIsAServerError(t *testing.T) {
	proxy := newNode(t, func(w http.ResponseWriter, _ *http.Request, _ int) {
		w.WriteHeader(502)
		io.WriteString(w, "<html>bad gateway</html>")
	})
	c := newTestClient(t, proxy.URL)
	_, err := c.Cluster(context.Background())
	e := wantKind(t, err, ErrServer)
	if e.Status != 502 || e.Code != "server_error" || !strings.Contains(e.Message, "HTTP 502: \"<html>bad gateway</html>\"") {
		t.Fatalf("%+v", e)
	}
	odd := newNode(t, answering(`["not", "an", "object"]`))
	_, err = newTestClient(t, odd.URL).Cluster(context.Background())
	if e := wantKind(t, err, ErrServer); !strings.Contains(e.Message, "unexpected answer from") {
		t.Fatalf("%+v", e)
	}
}

// --- what is sent -------------------------------------------------------------------

func TestTheTokenIsSentAsABearer(t *testing.T) {
	n := newNode(t, answering(`{"workers": []}`))
	newTestClientWith(t, Options{Addresses: []string{n.URL}, Token: "t0k"}).ListWorkers(context.Background())
	t.Setenv("DEX_CLIENT_TOKEN", "from-env")
	newTestClient(t, n.URL).ListWorkers(context.Background())
	t.Setenv("DEX_CLIENT_TOKEN", "")
	newTestClient(t, n.URL).ListWorkers(context.Background())
	var got []string
	for _, r := range n.seen() {
		got = append(got, r.header.Get("Authorization"))
	}
	if strings.Join(got, "|") != "Bearer t0k|Bearer from-env|" {
		t.Fatalf("sent %q", got)
	}
}

func TestEachCallSendsItsRouteAndBody(t *testing.T) {
	n := newNode(t, answering(`{}`))
	c := newTestClient(t, n.URL)
	ctx := context.Background()
	c.CreateSession(ctx, "concierge", "")
	c.CreateSession(ctx, "concierge", "s1")
	c.ForkSession(ctx, "s1", 3, "s2")
	c.Deny(ctx, "s1", "c1", "too risky", "bob")
	c.Answer(ctx, "s1", "c2", "M", "")
	c.CancelTurn(ctx, "s1", "")
	c.Reconcile(ctx, "s1", "c3", Reconciliation{Status: CallSucceeded, Result: map[string]any{"id": 7}, By: "ops"})
	c.ListApprovals(ctx, "s1")
	c.Cluster(ctx)
	c.CreateSession(ctx, "concierge", "s 1", CreateOptions{Tenant: "acme", Priority: 5, MaxCostUSD: 2.5})
	c.CreateSession(ctx, "concierge", "", CreateOptions{})
	c.SetBudget(ctx, "s 1", BudgetOptions{MaxTokens: 10000, MaxCostUSD: 1, By: "ops"})
	c.RemoveBudget(ctx, "s 1", "ann & bob")
	c.RemoveBudget(ctx, "s1", "")
	c.GetLimits(ctx)
	c.SetLimit(ctx, "anthropic/claude-sonnet-4-5", LimitOptions{Concurrency: 2, TPM: 90000})
	c.SetLimit(ctx, "team #1/a?b%c", LimitOptions{})
	c.ClearLimit(ctx, "anthropic/claude-sonnet-4-5")
	c.ListTenants(ctx)
	c.GetTenant(ctx, "acme.eu")
	c.SetTenantBudget(ctx, "acme", TenantBudgetOptions{MaxTokensPerDay: 1000, MaxCostUSDPerMonth: 50, By: "ops"})
	c.SetTenantBudget(ctx, "acme", TenantBudgetOptions{MaxCostUSDPerDay: 2.5, MaxTokensPerMonth: 90000})
	c.RemoveTenantBudget(ctx, "acme", "ann & bob")
	c.RemoveTenantBudget(ctx, "acme", "")
	want := []string{
		`POST /v1/sessions {"agent":"concierge"}`,
		`POST /v1/sessions {"agent":"concierge","session_id":"s1"}`,
		`POST /v1/sessions/s1/fork {"turn":3,"session_id":"s2"}`,
		`POST /v1/sessions/s1/tool_calls/c1/deny {"reason":"too risky","by":"bob"}`,
		`POST /v1/sessions/s1/tool_calls/c2/answer {"answer":"M"}`,
		`POST /v1/sessions/s1/cancel {"reason":"cancelled by a client"}`,
		`POST /v1/sessions/s1/tool_calls/c3/reconcile {"status":"succeeded","result":{"id":7},"by":"ops"}`,
		`GET /v1/sessions/s1/approvals `,
		`GET /v1/cluster `,
		`POST /v1/sessions {"agent":"concierge","session_id":"s 1","tenant":"acme","priority":5,"budget":{"max_cost_usd":2.5}}`,
		`POST /v1/sessions {"agent":"concierge"}`,
		`PUT /v1/sessions/s%201/budget {"max_tokens":10000,"max_cost_usd":1,"by":"ops"}`,
		`DELETE /v1/sessions/s%201/budget?by=ann+%26+bob `,
		`DELETE /v1/sessions/s1/budget `,
		`GET /admin/limits `,
		`PUT /admin/limits/anthropic/claude-sonnet-4-5 {"concurrency":2,"rpm":null,"tpm":90000}`,
		`PUT /admin/limits/team%20%231/a%3Fb%25c {"concurrency":null,"rpm":null,"tpm":null}`,
		`DELETE /admin/limits/anthropic/claude-sonnet-4-5 `,
		`GET /admin/tenants `,
		`GET /admin/tenants/acme.eu `,
		`PUT /admin/tenants/acme/budget {"max_tokens_per_day":1000,"max_cost_usd_per_month":50,"by":"ops"}`,
		`PUT /admin/tenants/acme/budget {"max_cost_usd_per_day":2.5,"max_tokens_per_month":90000}`,
		`DELETE /admin/tenants/acme/budget?by=ann+%26+bob `,
		`DELETE /admin/tenants/acme/budget `,
	}
	requests := n.seen()
	if len(requests) != len(want) {
		t.Errorf("sent %d requests, want %d", len(requests), len(want))
	}
	for i, w := range want {
		if i >= len(requests) {
			t.Fatalf("missing %s", w)
		}
		r := requests[i]
		path := r.path
		if r.query != "" {
			path += "?" + r.query
		}
		if got := r.method + " " + path + " " + r.body; got != w {
			t.Errorf("sent %s, want %s", got, w)
		}
	}
}

func TestListSessionsSendsItsFiltersAndDefaults(t *testing.T) {
	n := newNode(t, answering(`{"sessions": [{"id": "s1", "waiting_since": 1.5}], "next_cursor": null}`))
	c := newTestClient(t, n.URL)
	page, err := c.ListSessions(context.Background(), ListSessionsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if page.NextCursor != "" || *page.Sessions[0].WaitingSince != 1.5 {
		t.Fatalf("decoded %+v", page)
	}
	since := time.Date(2024, 12, 2, 14, 33, 20, 250_000_000, time.UTC)
	c.ListSessions(context.Background(), ListSessionsOptions{Status: OutcomeUnknown, CreatedSince: since, Limit: 50, Cursor: "k"})
	c.ListInbox(context.Background(), InboxOptions{})
	got := []string{}
	for _, r := range n.seen() {
		got = append(got, r.query)
	}
	want := []string{
		"limit=100&order=created",
		"created_since=1733150000.25&cursor=k&limit=50&order=created&status=outcome_unknown",
		"limit=100",
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("sent %q, want %q", got, want)
	}
}

// --- sending and waiting ------------------------------------------------------------------

func TestSendAndWaitWaitsOutTheServersCapOnWaiting(t *testing.T) {
	n := newNode(t, func(w http.ResponseWriter, r *http.Request, count int) {
		switch {
		case r.Method == "POST":
			answerJSON(w, 201, `{"session_id": "s1", "turn": 3, "status": "running", "created": true}`)
		case count < 4:
			answerJSON(w, 200, `{"session_id": "s1", "turn": 3, "status": "running"}`)
		default:
			answerJSON(w, 200, `{"session_id": "s1", "turn": 3, "status": "waiting", "text": null,
				"waiting_for": [{"call_id": "c1", "kind": "approval", "tool": "publish", "arguments": {"post": "hi"},
				"arguments_hash": "h", "question": null, "choices": null}]}`)
		}
	})
	c := newTestClient(t, n.URL)
	sent, err := c.SendMessage(context.Background(), "s1", "go", SendOptions{Wait: true, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if sent.Status != TurnWaiting || !sent.Created || sent.Turn != 3 || sent.WaitingFor[0].Kind != KindApproval ||
		sent.WaitingFor[0].Arguments["post"] != "hi" {
		t.Fatalf("got %+v", sent)
	}
	requests := n.seen()
	if requests[0].body != `{"text":"go","wait_seconds":2}` {
		t.Fatalf("sent %s", requests[0].body)
	}
	for _, r := range requests[1:] {
		if r.method != "GET" || r.path != "/v1/sessions/s1/turns/3" || r.query != "wait_seconds=2" {
			t.Fatalf("then %+v", r)
		}
	}
}

func TestWaitTurnAnswersTheRunningTurnAtItsTimeout(t *testing.T) {
	n := newNode(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		time.Sleep(50 * time.Millisecond)
		answerJSON(w, 200, `{"session_id": "s1", "turn": 1, "status": "running"}`)
	})
	c := newTestClient(t, n.URL)
	started := time.Now()
	turn, err := c.WaitTurn(context.Background(), "s1", 1, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(started); turn.Status != TurnRunning || took < 300*time.Millisecond || took > 2*time.Second {
		t.Fatalf("%s after %s", turn.Status, took)
	}
	var first float64
	if _, err := fmt.Sscanf(n.seen()[0].query, "wait_seconds=%g", &first); err != nil || first > 0.3 || first < 0.25 {
		t.Fatalf("asked %s first: want no longer than the timeout", n.seen()[0].query)
	}
}

func TestTypesDecodeTheirNullsAndAnyJSON(t *testing.T) {
	var turn TurnResult
	if err := json.Unmarshal([]byte(`{"session_id": "s", "turn": 1, "status": "completed", "text": null,
		"error": null, "ended_at": 2.5, "tool_calls": [{"id": "c", "result": {"a": [1]}, "task_handle": null}],
		"steps": [{"id": "1.1", "type": "RunModel", "retry": {"max_attempts": 3}, "created_at": 1, "error": null,
		"wait": null, "usage": {"input": 3}}]}`), &turn); err != nil {
		t.Fatal(err)
	}
	if turn.Text != "" || *turn.EndedAt != 2.5 || string(turn.ToolCalls[0].Result) != `{"a": [1]}` ||
		turn.Steps[0].Error != nil || turn.Steps[0].Usage["input"] != 3 || turn.Steps[0].Retry.MaxAttempts != 3 {
		t.Fatalf("decoded %+v", turn)
	}
}
