module github.com/dex-run/dex/sdk/go

go 1.19

require github.com/gorilla/websocket v1.5.0

// Built offline: Debian's golang-github-gorilla-websocket-dev (scripts/go installs it).
replace github.com/gorilla/websocket => /usr/share/gocode/src/github.com/gorilla/websocket
