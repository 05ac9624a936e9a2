"""The latency model: what an iteration and a KV transfer cost."""
