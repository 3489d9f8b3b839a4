"""HTTP and WebSocket routes: parse, call the domain, render. No SQL here."""
