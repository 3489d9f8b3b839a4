module github.com/dex-run/dex/sdk/go

go 1.19

require (
	github.com/gorilla/websocket v1.5.0
	go.opentelemetry.io/otel v1.1.0
	golang.org/x/sys v0.3.0 // the OpenTelemetry SDK's, in the tests only
)

// Built offline from Debian's packages (scripts/go installs them): gorilla/websocket
// (golang-github-gorilla-websocket-dev) and OpenTelemetry (golang-opentelemetry-otel-dev,
// which holds the API and the SDK as one module, and brings golang-golang-x-sys-dev).
replace (
	github.com/gorilla/websocket => /usr/share/gocode/src/github.com/gorilla/websocket
	go.opentelemetry.io/otel => /usr/share/gocode/src/go.opentelemetry.io/otel
	golang.org/x/sys => /usr/share/gocode/src/golang.org/x/sys
)

// What OpenTelemetry's go.mod asks for but Debian's one module does not need: the trace
// API's own module (Debian's holds it) and the libraries of its own tests. A module that
// requires this one ignores these lines, as it ignores the replacements: its own go.mod
// picks its OpenTelemetry.
exclude (
	github.com/google/go-cmp v0.5.6
	github.com/stretchr/testify v1.7.0
	go.opentelemetry.io/otel/trace v1.1.0
)
