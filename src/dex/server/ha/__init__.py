"""High availability: who leads (the lease), fencing, readiness, drain."""
