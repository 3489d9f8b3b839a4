package client

import (
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
)

// The types of types.go against sdk/openapi.json, the server's OpenAPI document (written
// by python -m dex.server.api.document; a Python test fails when it is stale). These
// tests fail when the Go types go stale: a JSON field that is no property of its schema,
// a required property missing, a type that does not fit, a struct no operation answers
// with, a status the constants miss.

const document = "../../openapi.json"

type schema = map[string]any

func loadDocument(t *testing.T) schema {
	t.Helper()
	raw, err := os.ReadFile(document)
	if err != nil {
		t.Fatal(err)
	}
	var doc schema
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// The operations the Client calls: the Go type its answer (or its body) decodes into.
var answers = []struct {
	method, path, status string
	into                 any
}{
	{"post", "/v1/sessions", "201", Session{}},
	{"get", "/v1/sessions", "200", SessionList{}},
	{"post", "/v1/sessions/{session_id}/fork", "201", Forked{}},
	{"get", "/v1/inbox", "200", Inbox{}},
	{"post", "/v1/sessions/{session_id}/messages", "200", SentMessage{}},
	{"post", "/v1/sessions/{session_id}/messages", "201", SentMessage{}},
	{"get", "/v1/sessions/{session_id}/turns/{number}", "200", TurnResult{}},
	{"get", "/v1/sessions/{session_id}", "200", Snapshot{}},
	{"get", "/v1/agents", "200", agentList{}},
	{"get", "/v1/workers", "200", workerList{}},
	{"get", "/v1/cluster", "200", ClusterView{}},
	{"get", "/v1/sessions/{session_id}/approvals", "200", approvalList{}},
	{"post", "/v1/sessions/{session_id}/tool_calls/{call_id}/approve", "200", Approved{}},
	{"post", "/v1/sessions/{session_id}/tool_calls/{call_id}/deny", "200", Approved{}},
	{"post", "/v1/sessions/{session_id}/tool_calls/{call_id}/answer", "200", Answered{}},
	{"post", "/v1/sessions/{session_id}/cancel", "200", Cancelled{}},
	{"post", "/v1/sessions/{session_id}/tool_calls/{call_id}/reconcile", "200", ToolCall{}},
	{"put", "/v1/sessions/{session_id}/budget", "200", BudgetSet{}},
	{"delete", "/v1/sessions/{session_id}/budget", "200", BudgetSet{}},
	{"get", "/admin/limits", "200", limitsView{}},
	{"put", "/admin/limits/{group}", "200", limitsView{}},
	{"delete", "/admin/limits/{group}", "200", limitsView{}},
	{"get", "/admin/tenants", "200", tenantsView{}},
	{"get", "/admin/tenants/{tenant}", "200", Tenant{}},
	{"put", "/admin/tenants/{tenant}/budget", "200", Tenant{}},
	{"delete", "/admin/tenants/{tenant}/budget", "200", Tenant{}},
	{"get", "/v1/sessions/{session_id}", "404", errorResponse{}},
}

var bodies = []struct {
	method, path string
	into         any
}{
	{"post", "/v1/sessions", createSession{}},
	{"post", "/v1/sessions/{session_id}/fork", fork{}},
	{"post", "/v1/sessions/{session_id}/messages", sendMessage{}},
	{"post", "/v1/sessions/{session_id}/tool_calls/{call_id}/approve", approve{}},
	{"post", "/v1/sessions/{session_id}/tool_calls/{call_id}/deny", deny{}},
	{"post", "/v1/sessions/{session_id}/tool_calls/{call_id}/answer", answer{}},
	{"post", "/v1/sessions/{session_id}/cancel", cancel{}},
	{"post", "/v1/sessions/{session_id}/tool_calls/{call_id}/reconcile", reconcile{}},
	{"put", "/v1/sessions/{session_id}/budget", setBudget{}},
	{"put", "/admin/limits/{group}", Limit{}},
	{"put", "/admin/tenants/{tenant}/budget", setTenantBudget{}},
}

func TestTypesMatchTheOpenAPIDocument(t *testing.T) {
	doc := loadDocument(t)
	k := &checker{t: t, doc: doc, checked: map[string][]string{}}
	paths := doc["paths"].(schema)
	for _, a := range answers {
		op, ok := dig(paths, a.path, a.method).(schema)
		if !ok {
			t.Errorf("the document has no operation %s %s", strings.ToUpper(a.method), a.path)
			continue
		}
		s := dig(op, "responses", a.status, "content", "application/json", "schema")
		if s == nil {
			t.Errorf("%s %s answers no JSON with %s", strings.ToUpper(a.method), a.path, a.status)
			continue
		}
		k.fit(a.method+" "+a.path+" "+a.status, reflect.TypeOf(a.into), s.(schema), false)
	}
	for _, b := range bodies {
		s := dig(paths, b.path, b.method, "requestBody", "content", "application/json", "schema")
		if s == nil {
			t.Errorf("%s %s takes no JSON body", strings.ToUpper(b.method), b.path)
			continue
		}
		k.fit("the body of "+strings.ToUpper(b.method)+" "+b.path, reflect.TypeOf(b.into), s.(schema), false)
	}

	// every struct of types.go was checked against a schema
	declared := structsOf(t, "types.go")
	for _, name := range declared {
		if _, ok := k.checked[name]; !ok {
			t.Errorf("the struct %s is checked against no schema: add the operation that answers with it to answers", name)
		}
	}
	if len(declared) < 30 {
		t.Fatalf("types.go declares %d structs: the parse is wrong", len(declared))
	}
}

func TestTheConstantsAreTheDocumentsEnums(t *testing.T) {
	doc := loadDocument(t)
	schemas := doc["components"].(schema)["schemas"].(schema)
	enum := func(s any) []string {
		var out []string
		for _, v := range s.(schema)["enum"].([]any) {
			out = append(out, v.(string))
		}
		sort.Strings(out)
		return out
	}
	same := func(what string, got []string, want []string) {
		sort.Strings(got)
		sort.Strings(want)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: the constants are %v, the document's enum %v", what, got, want)
		}
	}
	same("turn statuses", []string{TurnRunning, TurnWaiting, TurnCompleted, TurnFailed, TurnCancelled},
		enum(schemas["ShownTurnStatus"]))
	same("session statuses", []string{SessionIdle, SessionRunning, SessionWaiting, SessionFailed},
		enum(schemas["FleetStatus"]))
	same("tool call statuses", []string{CallPending, CallRunning, CallSucceeded, CallFailed, CallOutcomeUnknown, CallDenied},
		enum(schemas["ToolCallStatus"]))
	same("wait kinds", []string{KindApproval, KindQuestion, KindBudget}, enum(dig(schemas, "PersonWait", "properties", "kind")))
	same("limit sources", []string{LimitFromConfig, LimitFromAPI}, enum(dig(schemas, "GroupLimits", "properties", "source", "anyOf").([]any)[0]))
	var statusFilter []any
	for _, p := range dig(doc, "paths", "/v1/sessions", "get", "parameters").([]any) {
		if p.(schema)["name"] == "status" {
			statusFilter = dig(p, "schema", "anyOf").([]any)
		}
	}
	same("the status filter", []string{SessionIdle, SessionRunning, SessionWaiting, SessionFailed, OutcomeUnknown},
		enum(statusFilter[0]))
	item := dig(doc, "paths", "/v1/sessions/{session_id}/events", "get", "responses", "200", "content",
		"text/event-stream", "itemSchema", "properties", "event", "description").(string)
	same("event types", []string{
		EventHistoryItem, EventTurnStarted, EventTurnCompleted, EventTurnFailed, EventTurnCancelled,
		EventWaitStarted, EventWaitEnded, EventBudgetChanged, EventMessageQueued, EventMessageSteered, EventModelDelta, EventModelDiscard,
		EventStreamGap, EventStreamDropped,
	}, regexp.MustCompile(`\b[a-z]+\.[a-z_]+\b`).FindAllString(item, -1))
}

// The query parameters the Client sends are the operations' own.
func TestQueryParametersAreTheDocuments(t *testing.T) {
	doc := loadDocument(t)
	sent := map[string][]string{}
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for name := range r.URL.Query() {
			sent[r.Method+" "+r.URL.Path] = append(sent[r.Method+" "+r.URL.Path], name)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"status": "completed"}`))
	}))
	defer server.Close()
	c := newTestClient(t, server.URL)
	ctx := context.Background()
	now := time.Now()
	if _, err := c.ListSessions(ctx, ListSessionsOptions{
		Agent: "a", Tenant: "t", Status: SessionIdle, CreatedSince: now, CreatedBefore: now, UpdatedSince: now,
		UpdatedBefore: now, Order: "updated", Limit: 5, Cursor: "x",
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListInbox(ctx, InboxOptions{Limit: 5, Cursor: "x", Tenant: "t"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitTurn(ctx, "s1", 1, time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RemoveBudget(ctx, "s1", "ann"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RemoveTenantBudget(ctx, "acme", "ann"); err != nil {
		t.Fatal(err)
	}
	for path, operation := range map[string]string{
		"GET /v1/sessions":                  "/v1/sessions",
		"GET /v1/inbox":                     "/v1/inbox",
		"GET /v1/sessions/s1/turns/1":       "/v1/sessions/{session_id}/turns/{number}",
		"DELETE /v1/sessions/s1/budget":     "/v1/sessions/{session_id}/budget",
		"DELETE /admin/tenants/acme/budget": "/admin/tenants/{tenant}/budget",
	} {
		method := strings.ToLower(strings.SplitN(path, " ", 2)[0])
		var want []string
		for _, p := range dig(doc, "paths", operation, method, "parameters").([]any) {
			if p.(schema)["in"] == "query" {
				want = append(want, p.(schema)["name"].(string))
			}
		}
		got := sent[path]
		sort.Strings(got)
		sort.Strings(want)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s %s: sent %v, the document's parameters are %v", strings.ToUpper(method), operation, got, want)
		}
	}
}

// checker fits Go types to the document's schemas.
type checker struct {
	t       *testing.T
	doc     schema
	checked map[string][]string // a struct's name: the schemas it was checked against
}

func (k *checker) resolve(ref string) (string, schema) {
	name := strings.TrimPrefix(ref, "#/components/schemas/")
	s, ok := dig(k.doc, "components", "schemas", name).(schema)
	if !ok {
		k.t.Fatalf("no schema %s", ref)
	}
	return name, s
}

// fit checks that typ fits the schema s; at names the place, for the messages.
// omittable: a field left out when empty (omitempty) may be a pointer.
func (k *checker) fit(at string, typ reflect.Type, s schema, omittable bool) {
	nullable := false
	if alternatives, ok := s["anyOf"].([]any); ok {
		var others []any
		for _, a := range alternatives {
			if a.(schema)["type"] == "null" {
				nullable = true
			} else {
				others = append(others, a)
			}
		}
		if len(others) != 1 {
			k.t.Errorf("%s: anyOf of %d schemas: not supported", at, len(others))
			return
		}
		s = others[0].(schema)
	}
	name := ""
	if ref, ok := s["$ref"].(string); ok {
		name, s = k.resolve(ref)
	}
	object := s["properties"] != nil || s["oneOf"] != nil
	wantPointer := nullable && (object || s["type"] == "integer" || s["type"] == "number" || s["type"] == "boolean")
	if typ.Kind() == reflect.Pointer {
		if !wantPointer && !omittable {
			k.t.Errorf("%s: a pointer, but the property is never null (or null reads as empty)", at)
		}
		typ = typ.Elem()
	} else if wantPointer {
		k.t.Errorf("%s: %s, but the property may be null: make it a pointer", at, typ)
	}
	switch {
	case s["oneOf"] != nil:
		k.union(at, typ, s["oneOf"].([]any))
	case object:
		k.object(at, typ, name, s)
	case s["type"] == "string":
		k.kind(at, typ, reflect.String)
	case s["type"] == "integer":
		k.kind(at, typ, reflect.Int)
	case s["type"] == "number":
		k.kind(at, typ, reflect.Float64)
	case s["type"] == "boolean":
		k.kind(at, typ, reflect.Bool)
	case s["type"] == "array":
		if typ.Kind() != reflect.Slice {
			k.t.Errorf("%s: %s, but the property is an array", at, typ)
			return
		}
		k.fit(at+"[]", typ.Elem(), s["items"].(schema), false)
	case s["type"] == "object":
		if typ.Kind() != reflect.Map || typ.Key().Kind() != reflect.String {
			k.t.Errorf("%s: %s, but the property is an object: a map[string]...", at, typ)
			return
		}
		if values, ok := s["additionalProperties"].(schema); ok {
			k.fit(at+"{}", typ.Elem(), values, false)
		} else {
			k.any(at+"{}", typ.Elem())
		}
	case s["type"] == nil:
		k.any(at, typ)
	default:
		k.t.Errorf("%s: the type %v is not supported", at, s["type"])
	}
}

func (k *checker) kind(at string, typ reflect.Type, want reflect.Kind) {
	if typ.Kind() != want {
		k.t.Errorf("%s: %s, but the property is a %s", at, typ, want)
	}
}

// any checks a place for any JSON value: json.RawMessage, or an interface.
func (k *checker) any(at string, typ reflect.Type) {
	if typ != reflect.TypeOf(json.RawMessage{}) && typ.Kind() != reflect.Interface {
		k.t.Errorf("%s: %s, but the property is any JSON: json.RawMessage or any", at, typ)
	}
}

// object checks a struct against an object schema: every JSON field a property, every
// required property a field, each field's type.
func (k *checker) object(at string, typ reflect.Type, name string, s schema) {
	if typ.Kind() != reflect.Struct {
		k.t.Errorf("%s: %s, but the property is an object (%s): a struct", at, typ, name)
		return
	}
	k.checked[typ.Name()] = append(k.checked[typ.Name()], name)
	properties, _ := s["properties"].(schema)
	fields := jsonFields(typ)
	for field, f := range fields {
		property, ok := properties[field].(schema)
		if !ok {
			k.t.Errorf("%s (%s): the field %s.%s (json %q) is not a property of the schema", at, name, typ.Name(), f.Name, field)
			continue
		}
		k.fit(at+"."+field, f.Type, property, strings.Contains(f.Tag.Get("json"), "omitempty"))
	}
	required, _ := s["required"].([]any)
	for _, required := range required {
		if _, ok := fields[required.(string)]; !ok {
			k.t.Errorf("%s: the required property %q of %s is no field of %s", at, required, name, typ.Name())
		}
	}
}

// union checks a struct that holds any of several object schemas (the history's items):
// every JSON field a property of one of them, every required property of each a field.
func (k *checker) union(at string, typ reflect.Type, variants []any) {
	if typ.Kind() != reflect.Struct {
		k.t.Errorf("%s: %s, but the property is one of several objects: a struct", at, typ)
		return
	}
	fields := jsonFields(typ)
	found := map[string]bool{}
	for _, v := range variants {
		name, s := k.resolve(v.(schema)["$ref"].(string))
		k.checked[typ.Name()] = append(k.checked[typ.Name()], name)
		properties := s["properties"].(schema)
		for field, f := range fields {
			if property, ok := properties[field].(schema); ok {
				found[field] = true
				k.fit(at+"("+name+")."+field, f.Type, property, false)
			}
		}
		if required, ok := s["required"].([]any); ok {
			for _, r := range required {
				if _, ok := fields[r.(string)]; !ok {
					k.t.Errorf("%s: the required property %q of %s is no field of %s", at, r, name, typ.Name())
				}
			}
		}
	}
	for field := range fields {
		if !found[field] {
			k.t.Errorf("%s: the field %s (json %q) is a property of none of its schemas", at, typ.Name(), field)
		}
	}
}

// jsonFields are a struct's JSON fields by name, those of embedded structs included.
func jsonFields(typ reflect.Type) map[string]reflect.StructField {
	out := map[string]reflect.StructField{}
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			for name, inner := range jsonFields(f.Type) {
				if _, shadowed := out[name]; !shadowed {
					out[name] = inner
				}
			}
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() && name == "" || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f
	}
	return out
}

// structsOf are the names of the struct types a file declares.
func structsOf(t *testing.T, file string) []string {
	t.Helper()
	parsed, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, decl := range parsed.Decls {
		if g, ok := decl.(*ast.GenDecl); ok && g.Tok == token.TYPE {
			for _, spec := range g.Specs {
				if ts := spec.(*ast.TypeSpec); isStruct(ts.Type) {
					names = append(names, ts.Name.Name)
				}
			}
		}
	}
	return names
}

func isStruct(e ast.Expr) bool {
	_, ok := e.(*ast.StructType)
	return ok
}

// dig follows keys through nested maps; nil if one is missing.
func dig(v any, keys ...string) any {
	for _, key := range keys {
		m, ok := v.(schema)
		if !ok {
			return nil
		}
		v = m[key]
	}
	return v
}
