"""Pure foundations: requests, SLOs, metrics, specs and the latency model (no I/O)."""
