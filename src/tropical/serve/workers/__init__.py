"""Our own engine's workers: one process each, stepped by the router (it plans every iteration),
and what they need: the handle the router talks through, messages, KV staging, placement, start-up."""
