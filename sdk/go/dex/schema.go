package dex

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"unicode/utf8"
)

// checkArguments checks a tool call's arguments against the tool's Parameters (its JSON
// Schema) before the body runs, as the Python Worker validates them: an invalid call
// never runs and records failed, with every problem named (path: what is wrong). It
// returns the arguments the body runs with: those given, plus the defaults of the
// parameters left out.
//
// The keywords checked: type, enum, const, properties, required, additionalProperties,
// items, prefixItems, minItems, maxItems, uniqueItems, minLength, maxLength, pattern,
// minimum, maximum, exclusiveMinimum, exclusiveMaximum, multipleOf, anyOf, oneOf, allOf,
// not and local $ref (#/$defs/...). Others (format, description...) are not checked.
// Types are JSON's: "3" is no integer.
func checkArguments(tool string, schema map[string]any, raw json.RawMessage) (json.RawMessage, error) {
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		raw = json.RawMessage("{}")
	}
	if schema == nil {
		return raw, nil
	}
	var args any
	if err := decodeJSON(raw, &args); err != nil {
		return nil, &ToolError{Message: fmt.Sprintf("invalid arguments for tool '%s': not JSON: %v", tool, err)}
	}
	// the schema as JSON has it (Go literals such as []string become []any)
	encoded, err := json.Marshal(schema)
	if err != nil {
		return nil, fmt.Errorf("dex: tool %s: the parameters schema does not encode: %w", tool, err)
	}
	var root map[string]any
	if err := decodeJSON(encoded, &root); err != nil {
		return nil, err
	}
	c := schemaCheck{root: root}
	c.check(root, args, "")
	if len(c.problems) > 0 {
		return nil, &ToolError{Message: fmt.Sprintf("invalid arguments for tool '%s': %s", tool, strings.Join(c.problems, "; "))}
	}
	object, isObject := args.(map[string]any)
	properties, _ := root["properties"].(map[string]any)
	added := false
	for name, p := range properties {
		property, _ := p.(map[string]any)
		if def, has := property["default"]; has && isObject {
			if _, given := object[name]; !given {
				object[name] = def
				added = true
			}
		}
	}
	if !added {
		return raw, nil
	}
	withDefaults, err := json.Marshal(object)
	if err != nil {
		return nil, fmt.Errorf("dex: tool %s: a default does not encode: %w", tool, err)
	}
	return withDefaults, nil
}

func decodeJSON(data []byte, v any) error {
	decoder := json.NewDecoder(bytes.NewReader(data))
	decoder.UseNumber()
	return decoder.Decode(v)
}

type schemaCheck struct {
	root     map[string]any
	problems []string
}

func (c *schemaCheck) add(path, format string, args ...any) {
	if path == "" {
		path = "arguments"
	}
	c.problems = append(c.problems, path+": "+fmt.Sprintf(format, args...))
}

func joinPath(path string, key any) string {
	if path == "" {
		return fmt.Sprint(key)
	}
	return fmt.Sprintf("%s.%v", path, key)
}

// jsonType is the JSON type of a value decoded with UseNumber.
func jsonType(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case json.Number:
		if f, err := x.Float64(); err == nil && f == math.Trunc(f) {
			return "integer" // 2.0 too, to JSON Schema
		}
		return "number"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}

func number(v any) (float64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	f, err := n.Float64()
	return f, err == nil
}

// sameJSON compares two JSON values, numbers by value.
func sameJSON(a, b any) bool {
	if fa, ok := number(a); ok {
		fb, ok := number(b)
		return ok && fa == fb
	}
	if _, ok := number(b); ok {
		return false
	}
	switch x := a.(type) {
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !sameJSON(x[i], y[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			if w, has := y[k]; !has || !sameJSON(v, w) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(a, b)
}

func (c *schemaCheck) resolve(ref string) map[string]any {
	for _, prefix := range []string{"#/$defs/", "#/definitions/"} {
		if strings.HasPrefix(ref, prefix) {
			defs, _ := c.root[strings.TrimSuffix(strings.TrimPrefix(prefix, "#/"), "/")].(map[string]any)
			if target, ok := defs[strings.TrimPrefix(ref, prefix)].(map[string]any); ok {
				return target
			}
		}
	}
	return nil
}

func (c *schemaCheck) check(schema any, value any, path string) {
	switch s := schema.(type) {
	case nil:
		return
	case bool:
		if !s {
			c.add(path, "not allowed")
		}
		return
	case map[string]any:
		c.checkObject(s, value, path)
	}
}

func (c *schemaCheck) sub(schema any, value any, path string) []string {
	inner := schemaCheck{root: c.root}
	inner.check(schema, value, path)
	return inner.problems
}

// stringList is a schema's list of strings (required, a type list), or its one string.
func stringList(v any) []string {
	if one, ok := v.(string); ok {
		return []string{one}
	}
	out := []string{}
	list, _ := v.([]any)
	for _, e := range list {
		if s, ok := e.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

func (c *schemaCheck) checkObject(s map[string]any, value any, path string) {
	if ref, ok := s["$ref"].(string); ok {
		target := c.resolve(ref)
		if target == nil {
			c.add(path, "the parameters schema has no %s", ref)
			return
		}
		c.check(target, value, path)
	}
	if t, has := s["type"]; has {
		types := stringList(t)
		actual := jsonType(value)
		fits := false
		for _, want := range types {
			if want == actual || (want == "number" && actual == "integer") {
				fits = true
			}
		}
		if !fits {
			c.add(path, "want %s, got %s", strings.Join(types, " or "), actual)
			return // the other keywords would only repeat it
		}
	}
	if enum, has := s["enum"]; has {
		options, _ := enum.([]any)
		found := false
		quoted := []string{}
		for _, e := range options {
			found = found || sameJSON(e, value)
			q, _ := json.Marshal(e)
			quoted = append(quoted, string(q))
		}
		if !found {
			c.add(path, "want one of %s", strings.Join(quoted, ", "))
		}
	}
	if want, has := s["const"]; has && !sameJSON(want, value) {
		q, _ := json.Marshal(want)
		c.add(path, "want %s", q)
	}
	if all, ok := s["allOf"].([]any); ok {
		for _, option := range all {
			c.problems = append(c.problems, c.sub(option, value, path)...)
		}
	}
	for _, keyword := range []string{"anyOf", "oneOf"} {
		options, ok := s[keyword].([]any)
		if !ok {
			continue
		}
		passed, reasons := 0, []string{}
		for _, option := range options {
			found := c.sub(option, value, path)
			if len(found) == 0 {
				passed++
			}
			reasons = append(reasons, strings.Join(found, ", "))
		}
		if keyword == "anyOf" && passed == 0 {
			c.add(path, "fits none of the allowed shapes (%s)", strings.Join(reasons, " | "))
		}
		if keyword == "oneOf" && passed != 1 {
			c.add(path, "must fit exactly one allowed shape, fits %d", passed)
		}
	}
	if not, has := s["not"]; has && len(c.sub(not, value, path)) == 0 {
		c.add(path, "a value the schema excludes")
	}
	limit := func(keyword string) (float64, bool) { return number(s[keyword]) }
	switch v := value.(type) {
	case string:
		length := utf8.RuneCountInString(v)
		if n, ok := limit("minLength"); ok && float64(length) < n {
			c.add(path, "at least %v characters, got %d", n, length)
		}
		if n, ok := limit("maxLength"); ok && float64(length) > n {
			c.add(path, "at most %v characters, got %d", n, length)
		}
		if pattern, ok := s["pattern"].(string); ok {
			re, err := regexp.Compile(pattern)
			if err != nil {
				c.add(path, "the parameters schema's pattern %q does not compile: %v", pattern, err)
			} else if !re.MatchString(v) {
				c.add(path, "does not match %s", pattern)
			}
		}
	case json.Number:
		f, _ := v.Float64()
		if n, ok := limit("minimum"); ok && f < n {
			c.add(path, "at least %v, got %v", n, v)
		}
		if n, ok := limit("maximum"); ok && f > n {
			c.add(path, "at most %v, got %v", n, v)
		}
		if n, ok := limit("exclusiveMinimum"); ok && f <= n {
			c.add(path, "more than %v, got %v", n, v)
		}
		if n, ok := limit("exclusiveMaximum"); ok && f >= n {
			c.add(path, "less than %v, got %v", n, v)
		}
		if n, ok := limit("multipleOf"); ok && n > 0 {
			ratio := f / n
			if math.Abs(ratio-math.Round(ratio)) > 1e-9 {
				c.add(path, "a multiple of %v, got %v", n, v)
			}
		}
	case []any:
		if n, ok := limit("minItems"); ok && float64(len(v)) < n {
			c.add(path, "at least %v items, got %d", n, len(v))
		}
		if n, ok := limit("maxItems"); ok && float64(len(v)) > n {
			c.add(path, "at most %v items, got %d", n, len(v))
		}
		if unique, _ := s["uniqueItems"].(bool); unique {
		dup:
			for i := range v {
				for j := 0; j < i; j++ {
					if sameJSON(v[i], v[j]) {
						c.add(path, "items must be unique")
						break dup
					}
				}
			}
		}
		prefix, _ := s["prefixItems"].([]any)
		for i, item := range v {
			if i < len(prefix) {
				c.check(prefix[i], item, joinPath(path, i))
			} else {
				c.check(s["items"], item, joinPath(path, i))
			}
		}
	case map[string]any:
		properties, _ := s["properties"].(map[string]any)
		for _, name := range stringList(s["required"]) {
			if _, has := v[name]; !has {
				c.add(joinPath(path, name), "missing")
			}
		}
		names := make([]string, 0, len(v))
		for name := range v {
			names = append(names, name)
		}
		sort.Strings(names) // problems in a stable order
		for _, name := range names {
			if property, has := properties[name]; has {
				c.check(property, v[name], joinPath(path, name))
			} else if extra, isBool := s["additionalProperties"].(bool); isBool {
				if !extra {
					c.add(joinPath(path, name), "not a parameter")
				}
			} else {
				c.check(s["additionalProperties"], v[name], joinPath(path, name)) // nil: any
			}
		}
	}
}
